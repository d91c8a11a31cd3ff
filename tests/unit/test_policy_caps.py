"""Caps: max_workers, shared dependencies (fair by weight), dependency latency, the knee."""

from __future__ import annotations

import dataclasses

import pytest

from flexiqd.policy import (
    Behavior,
    Dependency,
    DependencyUse,
    KneeConfig,
    Observation,
    PoolDemand,
    PoolInput,
    PoolPolicy,
    decide,
    decide_fleet,
    share_dependencies,
    water_fill,
)
from flexiqd.policy.types import DependencyObservation

from test_policy_support import busy, observe, run

UNSMOOTHED = Behavior(down_window=0.0, up_limit=None, down_limit=None)
FLOODED = dict(runnable_depth=5000, oldest_runnable_age=60.0)


def test_max_workers_caps_and_is_named():
    decision = decide(observe(4, **FLOODED, **busy(4)), PoolPolicy(max_workers=10, behavior=UNSMOOTHED), None, 0.0)
    assert decision.desired == 10
    assert decision.reason == "CappedByMax"
    assert decision.binding_cap == ("max", 10)
    assert "cap max=10" in decision.line()


def test_water_fill_shares_by_weight():
    assert water_fill(40, {"a": 30, "b": 30}, {"a": 1, "b": 1}) == {"a": 20, "b": 20}
    assert water_fill(40, {"a": 30, "b": 30}, {"a": 3, "b": 1}) == {"a": 30, "b": 10}


def test_water_fill_gives_what_a_small_demand_leaves_to_the_others():
    shares = water_fill(40, {"small": 5, "a": 50, "b": 50}, {"small": 1, "a": 1, "b": 1})
    assert shares == {"small": 5, "a": 17.5, "b": 17.5}
    assert water_fill(40, {"a": 0, "b": 10}, {"a": 1, "b": 1}) == {"a": 0.0, "b": 10}


def test_two_pools_share_a_database_by_weight():
    db = Dependency(name="db", capacity=40)
    reports = PoolDemand(pool="reports", workers=10, uses=(DependencyUse(dependency="db", per_worker=4),))
    mailer = PoolDemand(pool="mailer", workers=10, uses=(DependencyUse(dependency="db", per_worker=2),))
    caps = share_dependencies([db], [reports, mailer])
    # Equal weights: 20 connections each; the mailer needs exactly its 20.
    assert (caps["reports"].workers, caps["mailer"].workers) == (5, 10)
    assert caps["reports"].dependency == "db"

    heavy = PoolDemand(pool="reports", workers=10, uses=(DependencyUse(dependency="db", per_worker=4, weight=3),))
    caps = share_dependencies([db], [heavy, mailer])
    # Weight 3:1 -> 30 and 10 connections: 7 report workers (28), 5 mailers (10).
    assert (caps["reports"].workers, caps["mailer"].workers) == (7, 5)


def test_the_reserve_for_the_request_path_is_not_shared_out():
    db = Dependency(name="db", capacity=40, reserved=10)
    pool = PoolDemand(pool="p", workers=50, uses=(DependencyUse(dependency="db", per_worker=3),))
    assert share_dependencies([db], [pool])["p"].workers == 10


def test_the_smallest_dependency_cap_binds():
    deps = [Dependency(name="db", capacity=40), Dependency(name="api", capacity=100)]
    uses = (DependencyUse(dependency="db", per_worker=2), DependencyUse(dependency="api", per_worker=25))
    cap = share_dependencies(deps, [PoolDemand(pool="p", workers=30, uses=uses)])["p"]
    assert (cap.workers, cap.dependency) == (4, "api")
    assert dict(cap.per_dependency) == {"api": 4, "db": 20}


def test_an_undeclared_dependency_is_refused():
    with pytest.raises(ValueError, match="pool p uses dependency 'db', which is not declared"):
        share_dependencies([], [PoolDemand(pool="p", workers=1, uses=(DependencyUse(dependency="db", per_worker=1),))])


def test_decide_fleet_caps_both_pools_at_their_share_and_never_past_capacity():
    db = Dependency(name="db", capacity=40)
    pools = []
    for name, per_worker in (("reports", 4.0), ("mailer", 2.0)):
        policy = PoolPolicy(max_workers=50, behavior=UNSMOOTHED,
                            dependencies=(DependencyUse(dependency="db", per_worker=per_worker),))
        obs = dataclasses.replace(observe(4, **FLOODED, **busy(4)), pool=name)
        pools.append(PoolInput(observation=obs, policy=policy))
    decisions = decide_fleet(pools, [db], 0.0)
    assert decisions["reports"].desired == 5 and decisions["mailer"].desired == 10
    assert 5 * 4 + 10 * 2 <= 40
    for decision in decisions.values():
        assert decision.reason == "CappedByDependency"
        assert decision.binding_cap.cap == "dependency:db"


def test_decide_fleet_holds_a_pool_whose_metrics_failed_and_still_counts_its_workers():
    db = Dependency(name="db", capacity=20)
    use = (DependencyUse(dependency="db", per_worker=2),)
    blind = PoolInput(observation=Observation(pool="blind", active=6, metrics=None),
                      policy=PoolPolicy(max_workers=50, dependencies=use))
    busy_pool = PoolInput(observation=observe(2, **FLOODED, **busy(2)),
                          policy=PoolPolicy(max_workers=50, behavior=UNSMOOTHED, dependencies=use))
    decisions = decide_fleet([blind, busy_pool], [db], 0.0)
    assert decisions["blind"].reason == "HoldMetricsUnavailable"
    assert decisions["blind"].desired == 6
    # The blind pool's 6 workers hold 12 connections; the other gets the 8 left.
    assert decisions["default"].desired == 4
    assert decisions["default"].reason == "CappedByDependency"


def test_a_slow_dependency_stops_growth_at_the_current_count():
    policy = PoolPolicy(max_workers=50, behavior=UNSMOOTHED,
                        dependencies=(DependencyUse(dependency="api", per_worker=5, max_latency=0.2),))
    slow = (DependencyObservation(name="api", latency=0.9),)
    decision = decide(observe(4, dependencies=slow, **FLOODED, **busy(4)), policy, None, 0.0)
    assert decision.desired == 4
    assert decision.reason == "CappedByLatency"
    fast = (DependencyObservation(name="api", latency=0.1),)
    assert decide(observe(4, dependencies=fast, **FLOODED, **busy(4)), policy, None, 0.0).desired > 4


# --- the knee ----------------------------------------------------------------------------------

KNEE = KneeConfig(settle_time=30.0, reprobe_interval=300.0)
KNEE_POLICY = PoolPolicy(max_workers=40, behavior=UNSMOOTHED, knee=KNEE)


def saturated(workers: int, completion_rate: float, p50: float = 1.0, window: float = 10.0):
    """A pool with a backlog whose ``workers`` are all busy (rates over a 10 s window: 160+ completions)."""
    return observe(workers, runnable_depth=500, oldest_runnable_age=20.0, running=workers * 4,
                   completion_rate=completion_rate, arrival_rate=30.0, duration_p50=p50, rate_window=window)


def steady_at(start: int, end: int, workers: int, rate: float, window: float = 10.0, p50: float | None = None):
    """One tick a second from ``start`` to ``end`` (inclusive), ``workers`` busy, ``rate`` jobs/s;
    the finished jobs' p50 is 1 s x workers / 4 x 16 / rate (as slow as the rate is short of linear)
    unless given."""
    p50 = p50 if p50 is not None else workers / 4 * 16.0 / rate
    return [(float(t), saturated(workers, rate, p50=p50, window=window)) for t in range(start, end + 1)]


def knee_found():
    """4 workers did 16 jobs/s (1 s each); 6 workers, held for a window, do 16.2 jobs/s (1.5 s each)."""
    return run(KNEE_POLICY, steady_at(0, 60, 4, 16.0) + steady_at(61, 75, 6, 16.2))


def test_a_scale_up_that_added_no_throughput_holds_at_the_last_count_that_helped():
    decisions = knee_found()
    assert all(d.desired > 4 for d in decisions[:61])  # before the knee: more, please
    knee = decisions[-1]
    assert knee.desired == 4
    assert knee.reason == "CappedByKnee"
    assert knee.binding_cap == ("knee", 4)
    assert knee.history.knee.held_at == 4


def test_the_knee_is_reprobed_one_step_up_after_the_interval():
    history = knee_found()[-1].history
    held = decide(saturated(4, 16.0), KNEE_POLICY, history, 300.0)
    assert held.desired == 4
    probe = decide(saturated(4, 16.0), KNEE_POLICY, held.history, 376.0)
    assert probe.desired == 5
    assert probe.binding_cap == ("knee", 5)


def test_a_late_backlog_reprobes_the_knee_as_soon_as_a_sample_can_settle():
    history = knee_found()[-1].history
    late = dataclasses.replace(saturated(4, 16.0), metrics=dataclasses.replace(
        saturated(4, 16.0).metrics, oldest_runnable_age=45.0))  # over its 30 s target
    probe = decide(late, KNEE_POLICY, history, 75.0 + 2 * KNEE.settle_time)
    assert probe.binding_cap == ("knee", 5)


def test_without_a_shared_dependency_a_false_knee_is_lifted_by_its_reprobe():
    # Noise held the pool at 4; the probe at 5 completes a quarter more: the knee moves up.
    history = knee_found()[-1].history
    ticks = steady_at(376, 400, 5, 20.0)
    assert run(KNEE_POLICY, ticks, history)[-1].history.knee.held_at == 5


def test_a_probe_that_helps_moves_the_knee_up_and_allows_the_next_step():
    history = knee_found()[-1].history
    helped = run(KNEE_POLICY, steady_at(376, 390, 5, 19.5), history)[-1]
    assert helped.history.knee.held_at == 5
    assert helped.binding_cap == ("knee", 7)  # a quarter more, at least one


def test_a_probe_that_does_not_help_confirms_the_knee_for_another_interval():
    history = knee_found()[-1].history
    # Over a minute's completions: too few more to be anything but the same ceiling.
    failed = run(KNEE_POLICY, steady_at(376, 440, 5, 16.1, window=60.0), history)[-1]
    assert failed.desired == 4
    assert failed.reason == "CappedByKnee"
    assert failed.history.knee.held_since == 440.0


def test_the_knee_settles_at_the_best_throughput_measured_never_below_it():
    # 4 -> 16/s, 8 -> 30/s, 16 -> 24/s (overloaded): hold at 8, the best, not at 4.
    ticks = steady_at(0, 60, 4, 16.0) + steady_at(61, 80, 8, 30.0) + steady_at(81, 100, 16, 24.0)
    assert run(KNEE_POLICY, ticks)[-1].history.knee.held_at == 8


def test_no_knee_while_more_workers_add_throughput():
    ticks = steady_at(0, 60, 4, 16.0) + steady_at(61, 75, 6, 23.0)
    assert run(KNEE_POLICY, ticks)[-1].history.knee.held_at is None


def test_durations_rising_alone_are_no_knee():
    # 6 workers' jobs take 1.5 s instead of 1 s (the mix changed) but complete 50 % more: no ceiling.
    ticks = steady_at(0, 60, 4, 16.0) + steady_at(61, 75, 6, 24.0, p50=1.5)
    assert run(KNEE_POLICY, ticks)[-1].history.knee.held_at is None


def test_fewer_completions_without_slower_finished_jobs_are_a_new_mix_not_a_knee():
    # A batch of slow jobs took slots: completions fell, but the jobs that finished took as long as before.
    ticks = steady_at(0, 60, 4, 16.0) + steady_at(61, 75, 6, 12.0, p50=1.0)
    assert run(KNEE_POLICY, ticks)[-1].history.knee.held_at is None


def test_no_knee_while_the_pool_ramps():
    # The busy count changed within the window: its completions lag its starts, no sample.
    ticks = steady_at(0, 60, 4, 16.0) + [(61.0 + i, saturated(6 + i, 16.2)) for i in range(15)]
    assert run(KNEE_POLICY, ticks)[-1].history.knee.samples[-1].workers == 4


def test_no_knee_is_judged_before_the_backlog_has_lasted_the_settle_time():
    ticks = steady_at(0, 20, 4, 16.0)
    assert run(KNEE_POLICY, ticks)[-1].history.knee.samples == ()


def test_no_knee_from_a_handful_of_completions():
    # The same readings over a 2 s window: 32 completions, within the noise of a few dozen.
    ticks = steady_at(0, 60, 4, 16.0, window=2.0) + steady_at(61, 75, 6, 16.2, window=2.0)
    assert run(KNEE_POLICY, ticks)[-1].history.knee.held_at is None
