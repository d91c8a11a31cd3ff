"""The safety net: while the oldest job is late, the pool grows by a factor every tick and never shrinks.

Pure: observations in, decisions out, time as an argument.
"""

from __future__ import annotations

from flexiqd.policy import History, KneeConfig, PoolPolicy, Targets, decide
from flexiqd.policy.signals import NET_GROWTH_DUE, NET_GROWTH_LATE
from flexiqd.policy.types import KneeState, LoadSample

from test_policy_support import observe

# Estimates that say the pool is big enough: 8 busy slots complete 80 jobs/s, 20 wait.
CONFIDENT = dict(running=8, completion_rate=80.0, arrival_rate=10.0, duration_p50=0.1, duration_p95=0.2)
POLICY = PoolPolicy(max_workers=100, targets=Targets(age=30, lead_time=5))


def history_of(*samples: LoadSample) -> History:
    return History(seeded=True, load=samples)


def late(active: int, age: float, starting: int = 0, **fields) -> object:
    values = dict(CONFIDENT, runnable_depth=20, oldest_runnable_age=age)
    values.update(fields)
    return observe(active, starting=starting, **values)


def test_a_late_backlog_doubles_the_working_workers_whatever_the_estimates_say():
    before = history_of(LoadSample(90.0, 2, 8, 80.0, 10.0))
    decision = decide(late(2, 45.0), POLICY, before, 100.0)
    assert decision.desired == 2 * NET_GROWTH_LATE == 4
    assert decision.reason == "ScaleUpSafetyNet"
    assert "oldest job 45.0s over target 30s" in decision.message


def test_within_the_lead_time_of_the_target_it_grows_by_half():
    decision = decide(late(4, 26.0), POLICY, history_of(LoadSample(90.0, 4, 8, 80.0, 10.0)), 100.0)
    assert decision.desired == 4 * NET_GROWTH_DUE == 6
    assert decision.winner == "safety"


def test_not_late_no_net():
    decision = decide(late(4, 10.0), POLICY, history_of(LoadSample(90.0, 4, 8, 80.0, 10.0)), 100.0)
    assert all(rec.signal != "safety" for rec in decision.recommendations)


def test_workers_still_starting_are_growth_on_its_way():
    # 4 working, 4 starting: doubling the working ones asks for no more than are coming.
    decision = decide(late(4, 45.0, starting=4), POLICY, history_of(LoadSample(90.0, 4, 8, 80.0, 10.0)), 100.0)
    assert decision.desired == 8 and not decision.changed


def test_the_net_is_not_held_back_by_the_rate_limit():
    # 40 working: the up limit (+100 % or +4 per 15 s) would allow 80; it grew 10 ago already.
    from flexiqd.policy.types import ScaleChange
    before = History(seeded=True, load=(LoadSample(90.0, 40, 160, 80.0, 10.0),), changes=(ScaleChange(90.0, 20),))
    decision = decide(late(40, 60.0, running=160), POLICY, before, 100.0)
    assert decision.desired == 80


def test_no_scale_in_while_the_backlog_is_late():
    # The utilisation signal would shrink a pool whose slots read half busy; the late job holds it.
    before = history_of(LoadSample(90.0, 10, 20, 80.0, 10.0))
    decision = decide(late(10, 45.0, running=20, completion_rate=200.0), PoolPolicy(
        max_workers=10, targets=Targets(age=30, lead_time=5)), before, 100.0)
    assert decision.desired == 10


def test_a_measured_ceiling_stops_the_net_and_says_so():
    knee = KneeState(held_at=6, held_since=95.0)
    before = History(seeded=True, load=(LoadSample(90.0, 6, 24, 80.0, 10.0),), knee=knee)
    policy = PoolPolicy(max_workers=100, targets=Targets(age=30, lead_time=5), knee=KneeConfig())
    decision = decide(late(6, 45.0, running=24), policy, before, 100.0)
    assert decision.desired == 6
    assert decision.reason == "CappedByKnee"
    assert decision.binding_cap == ("knee", 6)
    assert "safety=12" in decision.line()


def test_max_workers_stops_the_net():
    decision = decide(late(60, 45.0, running=240), POLICY, history_of(LoadSample(90.0, 60, 240, 80.0, 10.0)), 100.0)
    assert decision.desired == 100 and decision.reason == "CappedByMax"
