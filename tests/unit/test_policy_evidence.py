"""Direct evidence: a dependency's probe and the pool's cgroup pressure hold growth where they rise."""

from __future__ import annotations

import dataclasses

import pytest

from flexiqd.policy import Behavior, KneeConfig, PoolPolicy, PolicyConfigError, decide
from flexiqd.policy.config import EvidenceRule
from flexiqd.policy.evidence import MIN_RISE, baseline, bound
from flexiqd.policy.history import history_from_dict, history_to_dict
from flexiqd.policy.types import EvidenceReading

from test_policy_support import busy, observe

UNSMOOTHED = Behavior(down_window=0.0, up_limit=None, down_limit=None)
# A flash crowd: the age and the safety net want every worker there is.
FLOODED = dict(runnable_depth=5000, oldest_runnable_age=60.0)
NO_KNEE = KneeConfig(enabled=False)
PROBE = EvidenceRule(source="probe:db", threshold=3.0)
POLICY = PoolPolicy(max_workers=30, behavior=UNSMOOTHED, knee=NO_KNEE, evidence=(PROBE,))


def probed(active: int, latency: float | None, *, running: int | None = None, **fields):
    """Pool ``default`` (concurrency 4) whose probe of ``db`` read ``latency`` (None: it failed)."""
    metric_fields = dict(FLOODED, **busy(active)) if running is None else dict(running=running)
    metric_fields.update(fields)
    obs = observe(active, **metric_fields)
    return dataclasses.replace(obs, evidence=(EvidenceReading("probe:db", latency),))


def idle(latency: float):
    return probed(1, latency, running=0)


def drive(policy, steps, history=None, start=0.0):
    """Decide each observation one second apart; the decisions."""
    out = []
    for i, obs in enumerate(steps):
        decision = decide(obs, policy, history, start + i)
        history = decision.history
        out.append(decision)
    return out


def learn_baseline(latency=0.003, n=5):
    return [idle(latency) for _ in range(n)]


def test_a_rise_while_workers_are_added_holds_the_pool_at_the_count_before_it():
    # Idle at 3 ms; the crowd comes, the pool grows; the dependency is fine at 4 workers (read
    # twice there: a reading tells of the count of the decision before), and at 8 the probe takes
    # 40 ms: the pool goes back to 4 and is held there, the probe named.
    steps = learn_baseline() + [probed(1, 0.003), probed(2, 0.003), probed(4, 0.004), probed(4, 0.004),
                                probed(8, 0.040), probed(8, 0.045), probed(8, 0.050)]
    decisions = drive(POLICY, steps)
    rise = decisions[-2]  # the median of the last three readings is high from here
    assert rise.binding_cap is not None and rise.binding_cap.cap == "probe:db"
    assert rise.desired == 4
    assert rise.reason == "CappedByProbe"
    assert "probe:db caps at 4" in rise.message and "baseline of 3.0 ms" in rise.message
    # Before the median rose, nothing held the pool (one slow reading is no rise).
    assert decisions[-3].binding_cap is None or decisions[-3].binding_cap.cap != "probe:db"


def test_a_reading_counts_for_the_fewer_workers_of_its_decision_and_the_one_before():
    # 1 -> 2 -> 4 -> 8 a decision apart: the reading seen at 4 was taken while 2 worked, and
    # the one seen at 8 (high) while 4 did: the count before the rise is 2.
    steps = learn_baseline() + [probed(1, 0.003), probed(2, 0.003), probed(4, 0.003)] + [probed(8, 0.05)] * 3
    assert drive(POLICY, steps)[-1].desired == 2


def test_workers_that_just_started_do_not_count_before_they_work():
    # 8 workers are active but only 2 workers' jobs run yet when the probe is fine: 2 is the count
    # before the rise, not 8.
    steps = learn_baseline() + [probed(2, 0.003), probed(8, 0.003, running=8), probed(8, 0.003, running=8)]
    steps += [probed(8, 0.05)] * 3
    assert drive(POLICY, steps)[-1].desired == 2


def test_a_rise_right_after_an_idle_pool_grew_holds_it_at_one_worker():
    steps = learn_baseline() + [probed(8, 0.003, running=0)] + [probed(8, 0.05)] * 3
    decisions = drive(POLICY, steps)
    assert decisions[-1].desired == 1 and decisions[-1].reason == "CappedByProbe"


def test_a_rise_during_a_step_of_the_knee_holds_the_pool_at_the_count_the_step_grew_from():
    from flexiqd.policy.evidence import update_evidence
    from flexiqd.policy.types import EvidenceTrack

    track = EvidenceTrack(source="probe:db", unloaded=(0.003,) * 5, recent=(0.05, 0.05), last_good=6, before=6)
    obs = probed(8, 0.05)
    (free,) = update_evidence((track,), obs, (PROBE,), NO_KNEE, 10.0, False)
    (stepping,) = update_evidence((track,), obs, (PROBE,), NO_KNEE, 10.0, False, step_from=4)
    assert (free.held_at, stepping.held_at) == (6, 4)


def test_the_hold_stays_while_the_latency_stays_high_and_for_the_reprobe_interval_after():
    # The oldest job is late: the hold lasts 2 x settle_time after the last rise.
    policy = dataclasses.replace(POLICY, knee=dataclasses.replace(NO_KNEE, reprobe_interval=300.0, settle_time=15.0))
    steps = learn_baseline() + [probed(2, 0.003), probed(4, 0.003), probed(4, 0.003)] + [probed(8, 0.05)] * 3
    decisions = drive(policy, steps)
    assert decisions[-1].desired == 4
    history = decisions[-1].history
    # Back at 4 the probe is fine again: the pool stays held at 4 for 30 s after the last rise...
    calm = drive(policy, [probed(4, 0.003)] * 20, history, start=len(steps))
    assert all(d.desired == 4 and d.binding_cap.cap == "probe:db" for d in calm)
    # ... and then may grow again.
    later = drive(policy, [probed(4, 0.003)] * 15, calm[-1].history, start=len(steps) + 20)
    assert later[-1].desired > 4


def test_a_failing_probe_neither_grows_nor_shrinks_the_pool():
    without = drive(dataclasses.replace(POLICY, evidence=()), learn_baseline() + [probed(4, None)] * 4)
    failing = drive(POLICY, learn_baseline() + [probed(4, None)] * 4)
    assert [d.desired for d in failing] == [d.desired for d in without]
    assert all(d.binding_cap is None or not d.binding_cap.cap.startswith("probe") for d in failing)
    # A probe that never answered learned no baseline: no bound, nothing judged.
    never = drive(POLICY, [probed(1, None, running=0)] * 3 + [probed(8, None)] * 3)
    track = never[-1].history.evidence[0]
    assert baseline(track) is None and bound(track, PROBE) is None and track.held_at is None


def test_failures_in_a_hold_do_not_release_it_early_nor_extend_it():
    policy = dataclasses.replace(POLICY, knee=dataclasses.replace(NO_KNEE, settle_time=5.0))  # late: 2 x 5 s
    steps = learn_baseline() + [probed(2, 0.003), probed(4, 0.003), probed(4, 0.003)] + [probed(8, 0.05)] * 3
    held = drive(policy, steps)
    failing = drive(policy, [probed(4, None)] * 8, held[-1].history, start=len(steps))
    assert all(d.desired == 4 for d in failing)
    after = drive(policy, [probed(4, None)] * 6, failing[-1].history, start=len(steps) + 8)
    assert after[-1].desired > 4


def test_a_slow_dependency_while_the_pool_does_not_grow_holds_it_where_it_is():
    # Someone else loads the database: the pool, steady at 6, is held at 6, not shrunk.
    steps = learn_baseline() + [probed(6, 0.003)] * 3 + [probed(6, 0.05)] * 3
    decisions = drive(POLICY, steps)
    assert decisions[-1].binding_cap.cap == "probe:db"
    assert decisions[-1].desired == 6


def test_a_rise_within_the_factor_or_under_the_minimum_rise_holds_nothing():
    steps = learn_baseline(0.010) + [probed(2, 0.010), probed(4, 0.025), probed(8, 0.029), probed(16, 0.029)]
    assert drive(POLICY, steps)[-1].desired == 30
    # A probe of 2 ms is "4x" at 8 ms: less than MIN_RISE above it, so no rise.
    tiny = learn_baseline(0.002) + [probed(4, 0.008)] * 4
    assert MIN_RISE > 0.006
    assert drive(POLICY, tiny)[-1].desired == 30


def test_the_baseline_is_learned_from_idle_readings_else_from_a_small_pool():
    decisions = drive(POLICY, learn_baseline(0.004, 20))
    track = decisions[-1].history.evidence[0]
    assert len(track.unloaded) == 15 and baseline(track) == pytest.approx(0.004)
    # A pool never idle since the start: at most one worker's slots busy.
    small = drive(POLICY, [probed(1, 0.006, running=3)] * 3)
    assert baseline(small[-1].history.evidence[0]) == pytest.approx(0.006)
    # Busier readings teach nothing.
    busy_only = drive(POLICY, [probed(8, 0.006)] * 3)
    assert baseline(busy_only[-1].history.evidence[0]) is None


def test_the_baseline_outlives_a_restart_and_a_hold_does_not():
    steps = learn_baseline() + [probed(2, 0.003), probed(4, 0.003)] + [probed(8, 0.05)] * 3
    history = drive(POLICY, steps)[-1].history
    restored = history_from_dict(history_to_dict(history))
    track = restored.evidence[0]
    assert baseline(track) == pytest.approx(0.003)
    assert track.held_at is None


def pressured(active: int, cpu: float | None):
    obs = observe(active, **FLOODED, **busy(active))
    return dataclasses.replace(obs, evidence=(EvidenceReading("pressure:cpu", cpu),))


CPU = EvidenceRule(source="pressure:cpu", threshold=50.0)
CPU_POLICY = PoolPolicy(max_workers=30, behavior=UNSMOOTHED, knee=NO_KNEE, evidence=(CPU,))


def test_sustained_cpu_pressure_holds_the_pool_at_the_count_before_it():
    steps = [pressured(1, 5.0), pressured(2, 8.0), pressured(4, 20.0), pressured(4, 20.0), pressured(8, 70.0),
             pressured(8, 80.0)]
    decisions = drive(CPU_POLICY, steps)
    assert decisions[-1].binding_cap.cap == "pressure:cpu"
    assert decisions[-1].reason == "CappedByPressure"
    assert decisions[-1].desired == 4
    assert "cpu pressure 70%" in decisions[-1].message


def test_one_pressure_spike_or_no_psi_holds_nothing():
    spike = drive(CPU_POLICY, [pressured(2, 5.0), pressured(4, 90.0), pressured(8, 5.0)])
    assert all(d.binding_cap is None or d.binding_cap.cap != "pressure:cpu" for d in spike)
    none = drive(CPU_POLICY, [pressured(4, None)] * 5)
    assert none[-1].desired == 30


@pytest.mark.parametrize("rule, field", [
    (EvidenceRule(source="pressure:disk", threshold=50.0), "evidence[0].source"),
    (EvidenceRule(source="pressure:io", threshold=0.0), "evidence[0].threshold"),
    (EvidenceRule(source="probe:db", threshold=1.0), "evidence[0].threshold"),
    (EvidenceRule(source="db", threshold=3.0), "evidence[0].source"),
])
def test_a_bad_rule_is_refused_by_name(rule, field):
    with pytest.raises(PolicyConfigError) as caught:
        PoolPolicy(evidence=(rule,))
    assert caught.value.field == field
