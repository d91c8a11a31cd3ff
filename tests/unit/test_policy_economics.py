"""Rules shaped by what a start costs: the break-even hold, one-step scale-up, staggered starts,
work coming due, signals that describe now, an honest throughput, and a hidden ceiling found early."""

from __future__ import annotations

import json
import math

from dataclasses import replace

import pytest

from flexiqd.policy import (
    Behavior,
    Dependency,
    DependencyUse,
    History,
    Observation,
    PoolInput,
    PoolPolicy,
    Targets,
    decide,
    decide_fleet,
    pool_policy_from_mapping,
)
from flexiqd.policy.economics import LONGEST_HOLD, break_even_hold, down_hold, lead_time, reversal
from flexiqd.policy.history import history_from_dict, history_to_dict, with_external_change
from flexiqd.policy.signals import base_arrival_rate, finished_mean, job_duration, per_worker_throughput
from flexiqd.policy.types import KneeState, LoadSample, ScaleChange, ThroughputSample

from test_policy_support import metrics, observe, run


def costing(active: int, cost: float | None, **fields) -> Observation:
    """``observe`` with a measured start cost."""
    obs = observe(active, **fields)
    return Observation(pool=obs.pool, active=obs.active, starting=obs.starting, draining=obs.draining,
                       concurrency=obs.concurrency, metrics=obs.metrics, start_cost=cost)


# ---------------------------------------------------------------- rent or buy

@pytest.mark.parametrize("cost, age, tick, hold", [
    (0.0, 30.0, 5.0, 0.0),             # free starts: give idle workers back at once
    (0.5, 5.0, 1.0, 0.5),              # a measured systemd start, a 5 s target, 1 s ticks
    (5.0, 60.0, 5.0, 5.0),             # the simulator's cold start
    (5.0, 10.0, 2.0, 5.0),             # a reaction that leaves 3 s of a 10 s target: still the cost
    (5.0, 10.0, 5.0, LONGEST_HOLD),    # a reaction that does not fit in the target at all
    (20.0, 10.0, 1.0, LONGEST_HOLD),
])
def test_an_idle_worker_is_held_for_the_break_even_time(cost, age, tick, hold):
    assert break_even_hold(cost, age, tick) == pytest.approx(hold)


def test_the_hold_allows_for_the_wait_until_the_next_decision():
    # The same start cost and target: a restart that fits with quick decisions does not with
    # slow ones, and then the idle worker is held.
    assert break_even_hold(1.0, 10.0, 5.0) == pytest.approx(1.0)
    assert break_even_hold(1.0, 10.0, 9.0) == LONGEST_HOLD


def test_the_operators_down_window_overrides_the_break_even_hold():
    targets = Targets(age=60)
    obs = costing(4, 5.0)
    assert down_hold(obs, Behavior(), targets) == pytest.approx(5.0)
    assert down_hold(obs, Behavior(down_window=120.0), targets) == 120.0
    # Not measured yet: the configured fallback.
    assert down_hold(costing(4, None), Behavior(start_cost=2.0), targets) == pytest.approx(2.0)
    # The daemon's own tick when the observation carries it: the default 5 s tick leaves no
    # room in a 9 s target for a 5 s start, a 1 s tick does.
    tight = Targets(age=9)
    assert down_hold(obs, Behavior(), tight) == LONGEST_HOLD
    assert down_hold(replace(obs, tick=1.0), Behavior(), tight) == pytest.approx(5.0)


def idle_after_busy(policy: PoolPolicy, cost: float):
    busy_obs = costing(4, cost, running=14, completion_rate=14.0, arrival_rate=14.0)
    idle_obs = costing(4, cost, running=0, completion_rate=14.0, arrival_rate=0.0)
    return run(policy, [(0.0, busy_obs), (5.0, idle_obs), (10.0, idle_obs), (15.0, idle_obs)])


def test_idle_workers_are_given_back_once_the_hold_has_passed():
    decisions = idle_after_busy(PoolPolicy(max_workers=10), cost=3.0)
    # hold = 3 x 30 / (30 - 3 - 5) = 4.1 s: the busy tick 5 s earlier no longer holds anything.
    assert [d.desired for d in decisions] == [4, 1, 1, 1]
    assert decisions[1].reason == "ScaleDownIdle"
    assert decisions[1].message.startswith("no runnable or running jobs")


def test_a_costly_start_holds_idle_workers_longer():
    decisions = idle_after_busy(PoolPolicy(max_workers=10), cost=20.0)  # hold 60 s on a 30 s target
    assert [d.desired for d in decisions] == [4, 4, 4, 4]
    assert decisions[1].reason == "ScaleDownStabilized"


@pytest.mark.parametrize("changes, change, expected", [
    ((ScaleChange(90.0, -3),), 2, 2),            # restarts two of the three given back
    ((ScaleChange(90.0, -3),), 5, 3),            # only three were given back
    ((ScaleChange(90.0, 3),), -2, 0),            # a scale-down after a scale-up costs nothing more
    ((ScaleChange(-30.0, -3),), 2, 0),           # given back too long ago
    ((), 4, 0),
])
def test_a_reversal_is_a_restart_of_workers_given_back(changes, change, expected):
    assert reversal(changes, 100.0, change, 120.0) == expected


def test_a_reversal_is_reported_with_its_cost():
    policy = PoolPolicy(max_workers=10, targets=Targets(age=30, lead_time=10))
    shrunk = decide(costing(4, 5.0, running=0), policy, None, 0.0)
    shrunk = decide(costing(4, 5.0, running=0), policy, shrunk.history, 10.0)
    assert shrunk.desired == 1
    back = decide(costing(1, 5.0, runnable_depth=100, running=4, oldest_runnable_age=15.0,
                          completion_rate=4.0, arrival_rate=4.0), policy, shrunk.history, 20.0)
    assert back.desired > 1 and "reversal" in back.smoothing
    assert f"restarts {back.desired - 1} of the workers given back" in back.message
    assert f"about {5.0 * (back.desired - 1):.1f} worker-seconds of starts" in back.message


# ---------------------------------------------------------------- defaults that follow each other

@pytest.mark.parametrize("targets, cost, expected", [
    (Targets(age=30), 5.0, 10.0),             # start cost plus a tick
    (Targets(age=5), 0.5, 2.5),               # never more than half the target
    (Targets(age=60), 0.5, 5.5),
    (Targets(age=30, lead_time=3), 5.0, 3.0),  # set explicitly: as set
])
def test_the_lead_time_follows_the_start_cost_and_the_age_target(targets, cost, expected):
    assert lead_time(targets, cost) == pytest.approx(expected)


def test_the_lead_time_follows_the_decision_interval():
    assert lead_time(Targets(age=30), 0.5, 1.0) == pytest.approx(1.5)


def test_an_age_target_alone_is_accepted():
    policy = pool_policy_from_mapping({"targets": {"age": 5}})
    assert policy.targets.age == 5 and policy.targets.lead_time is None
    assert decide(costing(1, 0.5, runnable_depth=3, running=4, oldest_runnable_age=1.0), policy, None, 0.0).desired >= 1


# ---------------------------------------------------------------- one step up for a real backlog

BACKLOG = dict(runnable_depth=400, running=8, oldest_runnable_age=10.0, completion_rate=8.0, arrival_rate=8.0)


def test_a_backlog_starts_what_it_needs_in_one_step():
    decision = decide(costing(2, 5.0, **BACKLOG), PoolPolicy(max_workers=40), None, 0.0)
    # slack = 30 - 10 / 2 - 10 = 15 s (the backlog arrived over the oldest job's 10 s); no history
    # for Little's law yet, so the mean of the jobs just finished (p50 1 s, p95 2 s: 1.09 s);
    # 400 waiting + 8 x 15 arriving + the 8 running hold their slots; each worker starts 4 at
    # once and 4 x 15 / 1.09 more: 528 / 59.0 = 8.9 -> 9 workers, at once.
    assert decision.desired == 9
    assert (decision.reason, decision.winner, decision.smoothing) == ("ScaleUpAge", "age", ())


def test_utilisation_is_still_rate_limited():
    busy = costing(2, 5.0, running=40, completion_rate=40.0, arrival_rate=40.0, concurrency=4)
    decision = decide(busy, PoolPolicy(max_workers=40), None, 0.0)
    assert decision.winner == "util" and decision.reason == "RateLimited"
    assert decision.desired == 6  # +4 per 15 s, the HPA's up limit


def test_creating_the_pool_does_not_use_up_the_scale_up_budget():
    policy = PoolPolicy(max_workers=8, targets=Targets(age=5))
    created = with_external_change(None, policy, 0.0, 0, 1)
    burst = costing(1, 0.5, runnable_depth=300, running=4, oldest_runnable_age=4.0, completion_rate=4.0,
                    arrival_rate=4.0, duration_p50=1.0, duration_p95=1.0)
    decision = decide(burst, policy, created, 1.0)
    assert decision.desired == 8 and decision.reason == "CappedByMax"


def test_starts_of_a_dependencys_users_are_staggered():
    db = Dependency(name="db", capacity=1000, start_burst=6)
    uses = (DependencyUse(dependency="db", per_worker=1),)
    policy = PoolPolicy(max_workers=40, dependencies=uses)
    flood = metrics(**dict(BACKLOG, runnable_depth=2000))
    pools = [PoolInput(observation=Observation(pool=name, active=2, starting=starting, concurrency=4,
                                               metrics=flood), policy=policy)
             for name, starting in (("a", 1), ("b", 0))]
    decisions = decide_fleet(pools, [db], 0.0)
    # 6 may start at once; pool a already has 1 starting: it adds 5, pool b none.
    assert (decisions["a"].desired, decisions["a"].reason) == (3 + 5, "StartStaggered")
    assert (decisions["b"].desired, decisions["b"].reason) == (2, "StartStaggered")
    assert decisions["a"].binding_cap == ("starting:db", 8)


def test_start_burst_must_be_a_positive_count():
    with pytest.raises(Exception, match="dependencies.db.start_burst"):
        Dependency(name="db", capacity=10, start_burst=0)


# ---------------------------------------------------------------- work coming due

def test_work_coming_due_starts_workers_before_it_is_runnable():
    due = costing(1, 5.0, running=0, completion_rate=0.0, coming_due=600, coming_due_within=10.0)
    decision = decide(due, PoolPolicy(max_workers=40), None, 0.0)
    # 600 jobs to start within the 30 s target at 4 jobs/s per worker (p50 1 s, 4 slots, mean 1.09 s).
    per_worker = 4 / finished_mean(due.metrics)
    assert decision.desired == math.ceil(600 / 30 / per_worker)
    assert decision.reason == "ScaleUpComingDue"
    assert "600 jobs come due within 10s" in decision.message


def test_nothing_coming_due_has_no_opinion():
    decision = decide(costing(1, 5.0, running=0), PoolPolicy(), None, 0.0)
    assert "due" not in {rec.signal for rec in decision.recommendations}


# ---------------------------------------------------------------- signals that describe now

def test_an_idle_pool_is_not_read_as_busy():
    # The issue: "ScaleDownIdle ... while keeping 3 and 2 workers" -- a mean over two minutes.
    policy = PoolPolicy(max_workers=8, targets=Targets(age=5))

    def seen(**fields) -> Observation:
        return replace(costing(4, 0.5, **fields), tick=1.0)  # the installed daemon decides every second

    ticks = [(float(t), seen(running=16, completion_rate=16.0, arrival_rate=16.0)) for t in range(0, 60, 5)]
    ticks += [(60.0, seen(running=0, completion_rate=16.0)), (65.0, seen(running=0))]
    last = run(policy, ticks)[-1]
    assert (last.desired, last.reason) == (1, "ScaleDownIdle")


def test_a_pool_shrunk_by_an_operator_is_not_read_as_overloaded():
    # The issue: 4 -> 5 on "utilisation 0.97 (15.5/16 slots)" after an operator's scale-down from 8.
    policy = PoolPolicy(max_workers=8, targets=Targets(age=5))
    ticks = [(float(t), costing(8, 0.5, running=15, completion_rate=15.0)) for t in range(0, 60, 5)]
    history = run(policy, ticks)[-1].history
    history = with_external_change(history, policy, 61.0, 8, 4)
    after = decide(costing(4, 0.5, running=2, completion_rate=15.0), policy, history, 65.0)
    assert after.desired <= 4
    util = next(rec for rec in after.recommendations if rec.signal == "util")
    # Running jobs now (below the 30 s mean) against the slots of the same 30 s, not today's 16.
    assert util.workers == 1 and "utilisation 0.07 (2.0/28.8 slots)" in util.detail


def test_the_base_arrival_rate_counts_a_burst_once_and_follows_a_fall_at_once():
    quiet = [LoadSample(float(t), 2, 4, 2.0, 2.0) for t in range(0, 240, 10)]
    burst = [LoadSample(float(t), 2, 4, 2.0, 12.0) for t in range(240, 300, 10)]
    assert base_arrival_rate(metrics(arrival_rate=12.0), tuple(quiet + burst)) == 2.0
    flood = [LoadSample(float(t), 20, 80, 60.0, 60.0) for t in range(0, 300, 10)]
    assert base_arrival_rate(metrics(arrival_rate=3.0), tuple(flood)) == 3.0


# ---------------------------------------------------------------- throughput from the first second

@pytest.mark.parametrize("p50, p95, mean", [
    (1.0, 1.0, 1.0),
    (1.0, None, 1.0),
    (1.0, 3.5, 1.0 * math.exp((math.log(3.5) / 1.645) ** 2 / 2)),  # lognormal: about 1.34
    (None, 2.0, None),
])
def test_the_mean_duration_of_the_jobs_just_finished(p50, p95, mean):
    value = finished_mean(metrics(duration_p50=p50, duration_p95=p95))
    assert value == (None if mean is None else pytest.approx(mean))


def test_a_window_that_predates_the_burst_does_not_pass_for_slow_jobs():
    # 300 s of a trickle (0.1 jobs/s), then the burst: 16 running now.  Little's law over the
    # history says 16 s per job; the jobs just finished took 0.2 s.
    load = tuple(LoadSample(float(t), 4, 0, 0.1, 0.1) for t in range(0, 300, 10)) + (LoadSample(300.0, 4, 16, 0.1, 20.0),)
    now = metrics(running=16, completion_rate=0.1, duration_p50=0.2, duration_p95=0.2)
    assert per_worker_throughput(now, 4, load) == pytest.approx(20.0)


def test_before_anything_finishes_the_jobs_in_flight_bound_the_duration():
    nothing = metrics(running=8, completion_rate=None, duration_p50=None, duration_p95=None, running_age_mean=3.0)
    assert job_duration(nothing, (), floor=2.5) == 6.0
    # On the first tick of a burst the jobs have run milliseconds: the lead time counts, not the milliseconds.
    early = [metrics(running=8, completion_rate=None, duration_p50=None, duration_p95=None, running_age_mean=age)
             for age in (0.001, 0.05, 0.9)]
    assert {job_duration(m, (), floor=2.5) for m in early} == {2.5}


@pytest.mark.parametrize("p50, p95, age, duration", [
    # Before Little's law can tell, the estimate errs long: the jobs in flight have run at
    # least this long (a tail of 20 s jobs among 0.5 s ones), whatever the finished ones took.
    (0.5, 20.0, 20.0, 20.0),
    (2.0, 2.0, 1.0, 2.0),
    # Nothing finished yet: twice what the jobs in flight have run.
    (None, None, 5.0, 10.0),
])
def test_before_littles_law_the_jobs_in_flight_are_a_floor(p50, p95, age, duration):
    m = metrics(running=8, completion_rate=None, duration_p50=p50, duration_p95=p95, running_age_mean=age)
    assert job_duration(m, ()) == pytest.approx(duration)


def test_the_first_step_of_a_burst_does_not_depend_on_milliseconds():
    policy = PoolPolicy(max_workers=8, targets=Targets(age=5))
    steps = set()
    for age in (0.001, 0.01, 0.2):
        obs = costing(1, 0.5, runnable_depth=392, running=8, oldest_runnable_age=0.3, completion_rate=None,
                      duration_p50=None, duration_p95=None, running_age_mean=age, concurrency=8)
        steps.add(decide(obs, policy, None, 0.0).desired)
    assert len(steps) == 1
