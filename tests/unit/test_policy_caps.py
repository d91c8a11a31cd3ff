"""Caps: max_workers, shared dependencies (fair by weight), dependency latency, the knee."""

from __future__ import annotations

import math
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
    Targets,
    decide,
    decide_fleet,
    share_dependencies,
    water_fill,
)
from flexiqd.policy.knee import describe, knee_cap
from flexiqd.policy.types import DependencyObservation, KneeProbe, KneeState, KneeTrim, PoolMetrics, ThroughputSample

from test_policy_support import busy, observe

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
# The knee's own rules: a pool that does not run lean (an explicit drain time, the age target's
# default), so the counts below are the signals' and the knee's alone (lean pools and the knee:
# test_policy_lean).
KNEE_POLICY = PoolPolicy(max_workers=40, behavior=UNSMOOTHED, knee=KNEE, targets=Targets(drain_time=30))


def counted(now: float, workers: int, rate: float, *, starting: int = 0, age: float = 20.0,
            rates: dict[int, float] | None = None, arriving: float = 1000.0, depth: int = 5000):
    """A pool at ``now`` whose ``workers`` (concurrency 4) are all busy with a backlog of ``depth``, the store
    reporting ``rate`` completions a second over the recent 15 s (``rates``: per second instead,
    for the seconds it names) -- durations as long as the rate makes them (Little's law)."""
    second = int(now)
    series = tuple((s, round((rates or {}).get(s, rate))) for s in range(second - 14, second + 1))
    running = workers * 4
    return Observation(pool="default", active=workers, starting=starting, concurrency=4, tick=1.0, metrics=PoolMetrics(
        runnable_depth=depth, running=running, oldest_runnable_age=age, arrival_rate=arriving,
        completion_rate=rate, rate_window=60.0, duration_p50=running / rate, duration_p95=1.5 * running / rate,
        recent_duration_p50=running / rate, recent_completions=round(15 * rate), recent_window=15.0,
        completion_series=series, series_reported=True))


def ramp(policy: PoolPolicy, pace: dict[int, float], start: float = 0.0, end: float = 60.0,
         history=None, follow: bool = True, workers: int = 1, schedule: list[tuple[float, int]] | None = None,
         age: float = 20.0, depth: int = 5000):
    """Decide a tick a second; the pool is at whatever the last decision asked for (its workers
    start at once) -- or, with ``schedule``, at the count it gives from each time on (what the
    signals asked for, the knee aside) -- and completes ``pace[workers]`` jobs a second -- each
    second's count from the count of workers that second; its oldest job ``age`` seconds old, ``depth`` waiting."""
    decisions, by_second = [], {}
    now = start
    while now <= end:
        if schedule:
            workers = max(count for at, count in schedule if at <= now)
        by_second[int(now)] = pace[min(workers, max(pace))]
        decision = decide(counted(now, workers, by_second[int(now)], rates=by_second, age=age, depth=depth),
                          policy, history, now)
        history = decision.history
        decisions.append((now, workers, decision))
        if follow:
            workers = decision.desired
        now += 1.0
    return decisions


# 8 slots' worth: 1 worker 10 jobs/s, 2 workers 20 jobs/s, then flat (the dependency is full).
CEILING = {1: 10.0, 2: 20.0, 3: 20.0, 4: 20.0, 5: 19.0, 6: 19.0, 7: 18.0, 8: 18.0, 12: 17.0, 16: 16.0,
           24: 15.0, 32: 14.0, 40: 13.0}
LINEAR = {n: 10.0 * n for n in range(1, 41)}


def pace_of(table):
    return {n: table[max(k for k in table if k <= n)] for n in range(1, 41)}


def test_a_flash_crowd_on_an_undeclared_ceiling_grows_in_steps_and_holds_at_the_best_throughput():
    decisions = ramp(KNEE_POLICY, pace_of(CEILING), end=40.0)
    counts = [workers for _, workers, _ in decisions]
    # Steps, each judged (from one worker four times, then doubling): never the 40 the signals want.
    assert max(counts) <= 8
    last = decisions[-1][2]
    assert last.desired == 2 and last.reason == "CappedByKnee"
    assert last.history.knee.held_at == 2
    assert "held at a measured ceiling: 2 workers 20.0 jobs/s" in last.message
    assert any("measuring the throughput" in d.message for _, _, d in decisions)


def test_without_a_ceiling_each_step_pays_and_the_pool_doubles():
    decisions = ramp(KNEE_POLICY, LINEAR, end=40.0)
    counts = [workers for _, workers, _ in decisions]
    assert counts[-1] == 40 and decisions[-1][2].history.knee.held_at is None
    steps = sorted(set(counts))
    # At most a doubling per step -- four times from one or two workers, whose counts are slow.
    assert all(b <= (4 if a <= 2 else 2) * a for a, b in zip(steps, steps[1:]))
    assert steps[:3] == [1, 4, 8]


def test_a_held_count_that_keeps_its_pace_stays_held():
    decisions = ramp(KNEE_POLICY, pace_of(CEILING), end=40.0)
    history = decisions[-1][2].history
    assert history.knee.held_at == 2 and history.knee.held_rate == 20.0
    # A minute on at the knee, at its pace (a little under, as counts vary): still held.
    later = ramp(KNEE_POLICY, {**pace_of(CEILING), 2: 17.0}, start=41.0, end=100.0, history=history, workers=2)
    assert all(workers == 2 for _, workers, _ in later)
    assert later[-1][2].history.knee.held_at == 2


def test_a_held_count_whose_pace_falls_far_lets_growth_go_on():
    # Held at 2 workers (20 jobs/s); then slower jobs arrive: the same 2 workers complete 4 jobs/s
    # however many run -- the counts the knee was found on describe other jobs.
    decisions = ramp(KNEE_POLICY, pace_of(CEILING), end=40.0)
    history = decisions[-1][2].history
    slower = {n: 2.0 * n for n in range(1, 41)}
    later = ramp(KNEE_POLICY, slower, start=41.0, end=100.0, history=history, workers=2)
    released = next(now for now, _, d in later if d.history.knee.held_at is None)
    assert released <= 41.0 + 16  # within the store's recent window of the slower pace
    assert max(workers for _, workers, _ in later) > 2


def test_a_reprobe_whose_pace_falls_far_lets_growth_go_on():
    # Held at 2 (20 jobs/s), re-probing at 3 when the jobs turn slow: 3 workers complete 3 jobs/s.
    # Too few completions for a count at 3 (the step is never judged); the pace alone says the
    # knee was found on other jobs.
    decisions = ramp(KNEE_POLICY, pace_of(CEILING), end=40.0)
    history = decisions[-1][2].history
    later = ramp(KNEE_POLICY, {n: 1.0 * n for n in range(1, 41)}, start=400.0, end=430.0, history=history,
                 follow=False, workers=3)
    assert any(d.history.knee.held_at is None for _, _, d in later)


def test_a_held_count_that_completes_nothing_at_all_stays_held():
    # Nothing ends at all (a dependency that hangs): no sign the jobs changed, and growth would
    # only pile more work onto it.
    decisions = ramp(KNEE_POLICY, pace_of(CEILING), end=40.0)
    history = decisions[-1][2].history
    for now in range(41, 71):
        busy = counted(float(now), 2, 20.0)
        hung = dataclasses.replace(busy, metrics=dataclasses.replace(
            busy.metrics, completion_series=tuple((s, 0) for s in range(now - 14, now + 1)), recent_completions=0,
            completion_rate=0.0))
        decision = decide(hung, KNEE_POLICY, history, float(now))
        history = decision.history
        assert history.knee.held_at == 2, f"released at {now}"


def test_longer_durations_at_a_ceiling_do_not_hide_it():
    # The jobs take ever longer as workers queue on the dependency (durations from Little's law);
    # completions alone decide.
    decisions = ramp(KNEE_POLICY, pace_of(CEILING), end=40.0)
    assert decisions[-1][2].history.knee.held_at == 2


def test_the_knee_is_reprobed_one_small_step_up_after_the_interval():
    history = ramp(KNEE_POLICY, pace_of(CEILING), end=40.0)[-1][2].history
    held = decide(counted(200.0, 2, 20.0, age=5.0), KNEE_POLICY, history, 200.0)
    assert held.desired == 2
    assert decide(counted(345.0, 2, 20.0, age=5.0), KNEE_POLICY, held.history, 345.0).binding_cap == ("knee", 3)


def test_a_late_backlog_reprobes_sooner():
    history = ramp(KNEE_POLICY, pace_of(CEILING), end=40.0)[-1][2].history
    late = decide(counted(110.0, 2, 20.0, age=45.0), KNEE_POLICY, history, 110.0)  # over the 30 s target
    assert late.binding_cap == ("knee", 3)


def test_a_late_backlog_reprobes_within_the_age_target():
    # settle_time 30 s would re-probe a late backlog after a minute; the target is 30 s.
    history = ramp(KNEE_POLICY, pace_of(CEILING), end=40.0)[-1][2].history
    since = history.knee.held_since
    assert KNEE_POLICY.targets.age == 30.0 and KNEE.settle_time == 30.0
    early = decide(counted(since + 25.0, 2, 20.0, age=45.0), KNEE_POLICY, history, since + 25.0)
    assert early.binding_cap == ("knee", 2)
    late = decide(counted(since + 31.0, 2, 20.0, age=45.0), KNEE_POLICY, history, since + 31.0)
    assert late.binding_cap == ("knee", 3)


def test_a_reprobe_that_pays_moves_the_knee_up():
    history = ramp(KNEE_POLICY, pace_of(CEILING), end=40.0)[-1][2].history
    faster = {n: (10.0 * n if n <= 3 else 30.0) for n in range(1, 41)}  # the dependency grew
    decisions = ramp(KNEE_POLICY, faster, start=330.0, end=420.0, history=history, workers=2)
    assert decisions[-1][2].history.knee.held_at >= 3
    assert any("probing 3 workers" in d.message for _, _, d in decisions)


def test_no_hold_without_the_stores_per_second_counts():
    # An observer that does not report them (an old store, a hand-made observation): no probing.
    obs = observe(1, runnable_depth=500, oldest_runnable_age=20.0, running=4, completion_rate=4.0,
                  duration_p50=1.0)
    assert decide(obs, KNEE_POLICY, None, 0.0).binding_cap != ("knee", 1)


def test_a_first_count_too_slow_at_one_worker_is_taken_where_it_fits():
    # Half a completion a second per worker (8 s jobs on 4 slots): ten completions at one worker
    # take longer than the probe budget (0.4 x the 30 s target).  Growth does not wait out the
    # budget at one worker (a third of the target lost for no count), nor skip the count (a pool
    # that jumps uncounted has nothing to compare with): the first count is taken at the fewest
    # workers whose count fits once they have started -- 20: ten completions within the 12 s
    # budget less the jobs' 8 s, a second's span, a tick and a start.  No ceiling is made up.
    # (The 300 jobs waiting need 15 s at the 40 workers the pool may have: the budget stands.)
    decisions = ramp(KNEE_POLICY, {n: 0.5 * n for n in range(1, 41)}, end=40.0, depth=300)
    counts = [workers for _, workers, _ in decisions]
    assert counts[:3] == [1, 1, 20]
    assert "knee caps at 20 (measuring the throughput of 20 workers before adding more)" in decisions[1][2].message
    knee = decisions[-1][2].history.knee
    assert knee.held_at is None and counts[-1] == 40
    assert [kept.workers for kept in knee.samples] == [20, 40]  # counted, then a step that paid


def test_a_crowd_whose_first_count_fits_nowhere_within_the_probe_budget_is_counted_within_a_share_of_its_drain():
    # Four slots of 2 s jobs, a 10 s target: the jobs in flight, a second's span and a tick fill
    # the 4 s probe budget before a completion is counted, at any count.  Before, the pool then
    # grew uncounted to its maximum (1 -> 30 on a real pool of 8 connections: requests waited
    # 9 s).  The crowd of 5,000 needs a minute even at the 40 workers the pool may have: its
    # first count may take 0.4 of that, and the steps from it find the dependency full at 4
    # (3, tried below it, clearly completes less).
    policy = PoolPolicy(max_workers=40, behavior=UNSMOOTHED, knee=KNEE, targets=Targets(age=10.0, drain_time=30))
    decisions = ramp(policy, {n: 2.0 * min(n, 4) for n in range(1, 41)}, end=55.0)
    counts = [workers for _, workers, _ in decisions]
    assert counts[:5] == [1] * 5
    assert "measuring the throughput of 1 workers" in decisions[1][2].message
    assert any("counted 1 workers 2.0 jobs/s: up to 4 next" in d.message for _, _, d in decisions)
    assert max(counts) <= 8
    assert decisions[-1][2].history.knee.held_at == 4 and counts[-1] == 4


def test_a_crowds_first_count_is_taken_at_the_fewest_workers_its_longer_budget_fits():
    # Four slots of 2 s jobs, a 14 s target, workers that start in 0.2 s: within the 5.6 s probe
    # budget a count fits at 2 workers, not at 1.  100 jobs waiting, the first count is taken
    # there.  5,000 need two minutes even at the 40 workers the pool may have: their first count
    # may take 0.4 of that, and is taken at the one worker the pool has -- a count taken at more
    # may already be past what is shared, whose jobs then queue and stretch past the count's
    # wait (on a real pool of 8 connections: 1 -> 21 -> 30 uncounted).
    policy = PoolPolicy(max_workers=40, behavior=UNSMOOTHED, knee=KNEE, targets=Targets(age=14.0, drain_time=30))

    def third_decision(depth):
        history = None
        for now in (0.0, 1.0, 2.0):
            decision = decide(dataclasses.replace(counted(now, 1, 2.0, depth=depth), start_cost=0.2),
                              policy, history, now)
            history = decision.history
        return decision

    shallow, deep = third_decision(100), third_decision(5000)
    assert shallow.desired == 2 and "measuring the throughput of 2 workers" in shallow.message
    assert deep.desired == 1 and "measuring the throughput of 1 workers" in deep.message


def test_a_crowds_first_count_waits_no_longer_than_the_age_target():
    # Eight workers of 10 s jobs on 32 slots, a 10 s target, 2,000 jobs waiting: two minutes even
    # at the 40 workers the pool may have, whose share would be 50 s.  A count of jobs as long as
    # the target fits in no budget the target allows: the pool grows as the signals ask, not held
    # at 8 for most of a minute (400 jobs of 10 s on a real daemon were still at 23 of 40 workers
    # when the start-burst test's window ended).
    policy = PoolPolicy(max_workers=40, behavior=UNSMOOTHED, knee=KNEE, targets=Targets(age=10.0, drain_time=30))
    history = None
    for now in (0.0, 1.0, 2.0):
        decision = decide(counted(now, 8, 3.2, depth=2000), policy, history, now)
        history = decision.history
    assert decision.desired > 8, decision.message


def test_a_crowd_the_maximum_drains_in_time_is_not_held_for_a_count_that_fits_nowhere():
    # The same jobs, 40 of them: the maximum drains them within a second and a half, so no
    # first count is waited for beyond the probe budget -- the pool grows as the signals ask.
    policy = PoolPolicy(max_workers=40, behavior=UNSMOOTHED, knee=KNEE, targets=Targets(age=10.0, drain_time=30))
    obs = dataclasses.replace(counted(1.0, 1, 2.0), metrics=dataclasses.replace(
        counted(1.0, 1, 2.0).metrics, runnable_depth=40))
    history = decide(dataclasses.replace(obs, metrics=dataclasses.replace(obs.metrics, completion_series=())),
                     policy, None, 0.0).history
    assert decide(obs, policy, history, 1.0).desired > 1


def test_durations_read_at_other_counts_do_not_skip_the_first_count():
    # A crowd on a pool of one worker (concurrency 2) right after a larger pool ran on the same
    # half-CPU database: the store's p50 reads 2.5 s, so ten completions at one worker seem to
    # need 12 s against a 4 s probe budget.  The jobs take 0.24 s at one worker: the count's own
    # completions show it within a tick, the first count is taken, and the steps that follow
    # find that more workers add nothing.
    policy = PoolPolicy(max_workers=30, targets=Targets(age=10.0))
    pace = {1: 8.0, 4: 10.0}
    history, workers, series, depth, seen = None, 1, {}, 374, []
    for tick in range(12):
        now = 100.3 + tick
        if tick:
            series[int(now) - 1] = pace[min(pace, key=lambda n: abs(n - workers))]
            depth -= series[int(now) - 1]
        metrics = PoolMetrics(runnable_depth=depth, running=2 * workers, oldest_runnable_age=0.2 + tick,
                              recent_completions=sum(series.values()), recent_window=15.0,
                              completion_series=tuple(sorted(series.items())), series_reported=True,
                              running_age_mean=0.1, duration_p50=2.5, duration_p95=3.75, recent_duration_p50=2.5)
        decision = decide(Observation(pool="default", active=workers, starting=0, concurrency=2, tick=1.0,
                                      metrics=metrics, start_cost=0.4), policy, history, now)
        history, workers = decision.history, decision.desired
        seen.append(workers)
    assert seen[0] == 1 and max(seen) <= 4
    assert history.knee.held_at == 1 and seen[-1] == 1


def test_a_backlog_that_comes_while_the_only_worker_starts_is_counted_once_it_is_up():
    # A crowd on a fresh store while the pool's one worker is still starting: that tick has
    # nothing to count.  The next, the worker is up and has claimed 2 of 381 jobs, nothing has
    # completed, and the signals want 27.  Growth waits for the count at one worker.
    policy = PoolPolicy(max_workers=30, targets=Targets(age=10.0))
    fresh = dict(recent_window=15.0, completion_series=(), series_reported=True, duration_p50=None,
                 duration_p95=None)
    ticks = [(51.3, 0, 0, PoolMetrics(runnable_depth=0, running=0, **fresh)),
             (52.3, 0, 1, PoolMetrics(runnable_depth=381, running=0, oldest_runnable_age=0.1, **fresh)),
             (53.3, 1, 0, PoolMetrics(runnable_depth=379, running=2, oldest_runnable_age=0.2,
                                      running_age_mean=0.3, **fresh))]
    history = None
    for now, active, starting, metrics in ticks:
        decision = decide(Observation(pool="default", active=active, starting=starting, concurrency=2, tick=1.0,
                                      metrics=metrics, start_cost=0.4), policy, history, now)
        history = decision.history
    assert decision.desired == 1 and "measuring the throughput of 1 workers" in decision.message


def assert_still_counting_one_worker(policy: PoolPolicy, ticks) -> None:
    """Decide on each (now, metrics) of a pool of one worker (concurrency 2, 1 s ticks) in turn: the
    last decision still waits for the count at one worker."""
    history = None
    for now, metrics in ticks:
        decision = decide(Observation(pool="default", active=1, starting=0, concurrency=2, tick=1.0,
                                      metrics=metrics, start_cost=0.4), policy, history, now)
        history = decision.history
    assert decision.desired == 1 and "measuring the throughput of 1 workers" in decision.message


def test_a_decision_woken_within_the_first_looks_tick_still_waits_for_the_count():
    # New work wakes the loop: the first look comes as the crowd commits (nothing claimed yet),
    # the next decision a third of a second later, 2 jobs claimed and none ended.  Sized on what
    # they have run so far (twice 0.3 s), ten completions at one worker seem out of reach of the
    # probe budget -- but the first look's tick is not over: growth still waits for the count.
    policy = PoolPolicy(max_workers=30, targets=Targets(age=10.0))
    fresh = dict(recent_window=15.0, completion_series=(), series_reported=True, duration_p50=None,
                 duration_p95=None)
    ticks = [(27.0, PoolMetrics(runnable_depth=0, running=0, **fresh)),
             (28.0, PoolMetrics(runnable_depth=381, running=0, oldest_runnable_age=0.0, **fresh)),
             (28.3, PoolMetrics(runnable_depth=379, running=2, oldest_runnable_age=0.3, running_age_mean=0.3,
                                **fresh))]
    assert_still_counting_one_worker(policy, ticks)


def test_a_count_under_way_is_judged_on_its_own_pace_not_on_the_seconds_before_the_crowd():
    # A crowd of 372 jobs onto one worker (2 slots) of a half-CPU database, decisions 1.2 s
    # apart (a daemon's tick runs long).  1.2 s after the first look the count has 11 of its own
    # completions: 0.22 s jobs, ten more well within the probe budget.  The store's durations,
    # read over samples that reach back before the crowd (nothing running then), say 0.36 s:
    # out of reach -- and the daemon's pool went 1 -> 7 -> 24 -> 30 uncounted (request p95 15x
    # one worker's).  Growth keeps waiting for the count.
    policy = PoolPolicy(max_workers=30, targets=Targets(age=10.0))
    crowd = 1000.0

    def metrics_at(now: float) -> PoolMetrics:
        if now < crowd:
            return PoolMetrics(runnable_depth=0, running=0, recent_window=15.0, series_reported=True)
        done = int(9 * (now - crowd - 0.3))
        series = tuple((second, round(9 * (min(second + 1, now) - max(second, crowd + 0.3))))
                       for second in range(int(crowd), int(now) + 1) if min(second + 1, now) > max(second, crowd + 0.3))
        return PoolMetrics(runnable_depth=372 - done, running=2, oldest_runnable_age=now - crowd - 0.3,
                           running_age_mean=0.1, recent_completions=done, recent_window=15.0,
                           completion_series=series, series_reported=True, recent_duration_p50=0.2,
                           recent_duration_p95=0.3, duration_p50=0.2, duration_p95=0.3,
                           completion_rate=done / 60, rate_window=60.0)

    decisions_at = (crowd - 1.1, crowd + 1.0, crowd + 2.2)
    assert_still_counting_one_worker(policy, [(now, metrics_at(now)) for now in decisions_at])


def test_a_crowds_first_count_is_paced_from_its_first_look_not_its_whole_second():
    # `flexiq autoscale` on the CPU-capped server: the crowd's first look came 0.87 s into its
    # second, its one worker idle before it; 1.2 s later ten 0.2 s jobs had ended (nine in the
    # next second, one in the one after).  Paced from the second it began in, they read 0.41 s
    # and the count seemed out of the probe budget's reach: the pool went 1 -> 8 -> 30
    # uncounted.  Over the 1.2 s since the first look: 0.24 s, and growth waits for the count.
    policy = PoolPolicy(max_workers=30, targets=Targets(age=10.0))
    idle = dict(runnable_depth=0, running=0, recent_window=15.0, completion_series=(), series_reported=True)
    counting = dict(recent_window=15.0, series_reported=True, running_age_mean=0.1, duration_p50=0.18,
                    duration_p95=0.21, recent_duration_p50=0.18, recent_duration_p95=0.21)
    ticks = [(15.8, PoolMetrics(**idle)), (16.8, PoolMetrics(**idle)),
             (17.873, PoolMetrics(runnable_depth=371, running=2, oldest_runnable_age=0.0, **counting)),
             (18.065, PoolMetrics(runnable_depth=371, running=2, oldest_runnable_age=0.2, **counting)),
             (19.066, PoolMetrics(runnable_depth=361, running=2, oldest_runnable_age=1.2, recent_completions=10,
                                  completion_series=((18, 9), (19, 1)), **counting))]
    assert_still_counting_one_worker(policy, ticks)


def test_jobs_alike_now_are_counted_whatever_the_minutes_before_ran():
    # A crowd right after a pool of 30 ran the same jobs on a half-CPU database: over the store's
    # minutes they read 0.25 s at the median and 7 s at p95 (stretched at 30 workers), in the
    # last 15 s 0.12 and 0.2 s.  The first count is waited for, at one worker.
    policy = PoolPolicy(max_workers=30, targets=Targets(age=10.0))
    series = tuple((second, 8) for second in range(86, 100))
    metrics = dict(runnable_depth=355, running=2, oldest_runnable_age=0.2, recent_completions=112,
                   recent_window=15.0, completion_series=series, series_reported=True, running_age_mean=0.1,
                   duration_p50=0.25, duration_p95=7.0, recent_duration_p50=0.12)
    now_alike = PoolMetrics(**metrics, recent_duration_p95=0.2)
    decision = decide(Observation(pool="default", active=1, starting=0, concurrency=2, tick=1.0, metrics=now_alike,
                                  start_cost=0.4), policy, None, 100.3)
    assert decision.desired == 1 and "measuring the throughput of 1 workers" in decision.message
    # Unlike in the last seconds too: a mix, not counted.
    now_unlike = PoolMetrics(**metrics, recent_duration_p95=6.0)
    decision = decide(Observation(pool="default", active=1, starting=0, concurrency=2, tick=1.0, metrics=now_unlike,
                                  start_cost=0.4), policy, None, 100.3)
    assert decision.desired > 1


def test_a_recent_window_shorter_than_its_jobs_does_not_speak_for_them():
    from flexiqd.policy.knee import alike_now

    # Alike over the last 15 s, but those are the few 9-12 s jobs that ended first: the minutes say.
    short_lived = PoolMetrics(runnable_depth=50, running=8, recent_completions=12, recent_window=15.0,
                              recent_duration_p50=9.0, recent_duration_p95=12.0, duration_p50=0.5, duration_p95=40.0)
    assert not alike_now(short_lived)
    assert alike_now(dataclasses.replace(short_lived, duration_p95=1.5))
    assert alike_now(dataclasses.replace(short_lived, recent_duration_p50=0.5, recent_duration_p95=0.7))


def test_a_pool_younger_than_the_stores_window_counts_its_durations_over_its_own_life():
    # A pool made with its crowd: three samples a second apart (each standing for the second
    # before it) of 4 jobs running, 60 completions in those 3 s.  Over the store's whole 15 s
    # window they would read as 1 s jobs -- too long to count at one worker within a 10 s
    # target, so a real crowd skipped its first count.
    from flexiqd.policy.knee import mean_duration
    from flexiqd.policy.types import LoadSample

    load = tuple(LoadSample(at=t, active=1, running=4, completion_rate=None, arrival_rate=None, runnable=1500)
                 for t in (98.0, 99.0, 100.0))
    metrics = PoolMetrics(runnable_depth=1500, running=4, recent_completions=60, recent_window=15.0,
                          completion_series=((97, 20), (98, 20), (99, 20)), series_reported=True,
                          recent_duration_p50=0.5)
    assert mean_duration(load, metrics) == pytest.approx(0.2)


def test_a_count_does_not_wait_on_jobs_in_flight_that_have_run_longer_than_it_could_wait():
    # A burst of slow jobs (37 s) on a trickle of quick ones (0.5 s): the pool went to 68 for
    # it, every worker is busy with a slow job, nothing ends, and the store's durations are the
    # trickle's.  Read as 0.5 s jobs, a count at 68 fits the probe budget, and growth waited
    # for one while the jobs in flight ran on -- in the simulator the oldest job went 7 s past
    # its 30 s target.  The jobs in flight last at least what they have run: growth goes on.
    policy = PoolPolicy(max_workers=305, targets=Targets(age=30.0))
    history, seen = None, []
    for tick in range(12):
        now = 100.0 + tick
        metrics = PoolMetrics(runnable_depth=220 + 8 * tick, running=68, oldest_runnable_age=20.0 + tick,
                              running_age_mean=5.0 + tick, recent_completions=3, recent_window=15.0,
                              completion_series=((96, 1), (97, 1), (98, 1)), series_reported=True,
                              duration_p50=0.5, duration_p95=1.2, recent_duration_p50=0.5)
        decision = decide(Observation(pool="default", active=68, starting=0, concurrency=1, tick=1.0,
                                      metrics=metrics, start_cost=1.0), policy, history, now)
        history = decision.history
        seen.append((tick, decision.desired, decision.binding_cap))
    # Once the jobs in flight have run as long as a count could wait (the 12 s budget less a
    # tick, a start and a second's span), the knee holds nothing.
    late = [(tick, desired, cap) for tick, desired, cap in seen if tick >= 6]
    assert all(cap is None or cap[0] != "knee" for _, _, cap in late), seen
    assert all(desired > 68 for _, desired, _ in late), seen


def step_on(pace_at_two: float, age_at_two, ticks: int = 25):
    """A pool of one worker (concurrency 4) counting 10 quick jobs a second, their jobs in flight
    0.2 s old on average, then a step to two whose count completes ``pace_at_two`` a second
    while its jobs in flight are ``age_at_two(seconds since the step began)`` old: the decisions."""
    history, workers, series, seen = None, 1, {}, []
    stepped = None
    for tick in range(ticks):
        now = 100.0 + tick
        if stepped is None and workers > 1:
            stepped = now
        rate = 10.0 if stepped is None else pace_at_two
        series[int(now)] = rate
        obs = counted(now, workers, rate, rates=series, age=10.0)
        age = 0.2 if stepped is None else age_at_two(now - stepped)
        obs = dataclasses.replace(obs, metrics=dataclasses.replace(obs.metrics, running_age_mean=age))
        decision = decide(obs, KNEE_POLICY, history, now)
        history, workers = decision.history, min(decision.desired, 2)
        seen.append(decision)
    return seen


def test_a_step_whose_jobs_in_flight_age_past_what_a_ceiling_makes_is_not_judged_as_one():
    # Slow jobs came as the step began: the step's count is of them, a fifth of the quick jobs'
    # pace, and its jobs in flight age a second a second -- far past the step's doubling of 0.2 s.
    # Nor are the counts kept compared with the new ones apart from the step.
    seen = step_on(2.0, lambda since: 0.2 + since)
    assert any("probing 2 workers" in decision.message for decision in seen)
    assert all(decision.history.knee.held_at is None for decision in seen)


def test_a_ceiling_that_stretches_the_jobs_by_the_steps_share_is_still_one():
    # The same step at a ceiling: the same 10 jobs a second from twice the slots, each job
    # twice as long, its jobs in flight twice as old.
    seen = step_on(10.0, lambda since: 0.4)
    assert seen[-1].history.knee.held_at == 1


def test_growth_waits_for_a_count_that_can_be_taken_in_time():
    # Ten times the pace: ten completions in about a second, well within the budget.
    decisions = ramp(KNEE_POLICY, {n: 5.0 * n for n in range(1, 41)}, end=40.0)
    assert decisions[0][2].desired == 1
    assert "measuring the throughput of 1 workers" in decisions[0][2].message


def test_a_pool_other_hosts_serve_too_is_not_measured_and_forgets_its_knee():
    # The store's completions are then the fleet's, against workers this host does not run: a
    # host dying elsewhere would read as a ceiling here.
    history = ramp(KNEE_POLICY, pace_of(CEILING), end=40.0)[-1][2].history
    assert history.knee.held_at == 2
    shared = dataclasses.replace(counted(41.0, 2, 20.0), other_hosts=1)
    decision = decide(shared, KNEE_POLICY, history, 41.0)
    assert decision.binding_cap != ("knee", 2) and decision.desired > 2
    assert decision.history.knee.held_at is None and not decision.history.knee.samples


def test_a_reprobe_that_pays_forgets_the_knee_and_the_steps_go_on():
    history = ramp(KNEE_POLICY, pace_of(CEILING), end=40.0)[-1][2].history
    decisions = ramp(KNEE_POLICY, LINEAR, start=330.0, end=420.0, history=history, workers=2)
    counts = [workers for _, workers, _ in decisions]
    # Not a quarter more at a time (3, 4, 5, 7, ...): doubling steps, as before any knee was known.
    assert counts[-1] == 40 and decisions[-1][2].history.knee.held_at is None
    steps = sorted(set(counts))
    assert steps[:3] == [2, 3, 6]


def test_a_reprobe_that_pays_stops_where_a_recent_count_of_more_workers_showed_the_ceiling():
    # Held at 3 (a trim whose count read 22 jobs/s), 8 workers counted ten seconds before the
    # hold at 30 jobs/s, as 4 complete.  The late re-probe to 4 pays; the knee moves up to 4,
    # not on to 8 again.  With the count at 8 older than settle_time, the steps go on.
    config = KneeConfig(settle_time=60.0, reprobe_interval=300.0)
    policy = dataclasses.replace(KNEE_POLICY, knee=config)
    pace = {n: (22.0 if n <= 3 else 30.0) for n in range(1, 41)}
    base = ramp(policy, pace_of(CEILING), end=40.0)[-1][2].history

    def after(count_at_8: float):
        knee = KneeState(samples=(ThroughputSample(1, 8.0, 0.5, 20.0, 80),
                                  ThroughputSample(3, 22.0, 0.5, 60.0, 300),
                                  ThroughputSample(8, 30.0, 0.5, count_at_8, 400)),
                         backlog_since=0.0, held_at=3, held_since=60.0, held_rate=22.0)
        history = dataclasses.replace(base, knee=knee)
        return ramp(policy, pace, start=61.0, end=120.0, history=history, workers=3, age=45.0)

    recent = after(50.0)
    counts = [workers for _, workers, _ in recent]
    assert 4 in counts and max(counts) == 4, counts
    assert recent[-1][2].history.knee.held_at == 4
    stale = after(-30.0)
    assert max(workers for _, workers, _ in stale) > 4


def step_after_unclear_ones(pace_at_29: float, completions_at_12: int = 39):
    """A backlog of slow jobs: 12 workers counted 5.6 jobs/s (``completions_at_12`` jobs), a step
    to 20 and one to 24 stayed unclear (judged against 12: 6.7, 7.3 jobs/s, each count short),
    and a step from 24 to 29 -- past a doubling of 12, so judged against 24 -- completes
    ``pace_at_29``: the decisions until its verdict."""
    history = ramp(KNEE_POLICY, pace_of(CEILING), end=5.0)[-1][2].history
    twelve, twenty, twenty_four = (ThroughputSample(12, 5.6, 2.0, 80.0, completions_at_12),
                                   ThroughputSample(20, 6.7, 2.0, 90.0, 87),
                                   ThroughputSample(24, 7.3, 2.0, 99.0, 66))
    knee = dataclasses.replace(history.knee, samples=(twelve, twenty, twenty_four), unclear_from=twelve,
                               held_at=None, held_since=None, backlog_since=60.0,
                               probe=KneeProbe(start=twenty_four, to_workers=29, since=100.0, lag=2.0))
    history, series, seen = dataclasses.replace(history, knee=knee), {}, []
    for tick in range(30):
        now = 101.0 + tick
        series[int(now)] = pace_at_29
        decision = decide(counted(now, 29, pace_at_29, rates=series, age=40.0), KNEE_POLICY, history, now)
        history = decision.history
        seen.append(decision)
        if history.knee.probe is None:
            break
    return seen


@pytest.mark.parametrize("pace_at_29, completions_at_12, held", [(6.9, 39, True), (9.0, 39, False), (7.0, 29, False)])
def test_a_step_after_unclear_ones_is_judged_against_where_they_started_too(pace_at_29, completions_at_12, held):
    # 29 workers at 6.9 jobs/s are within the noise of 24's 7.3, but clearly short of what 29
    # should complete over 12's 5.6: the shortfalls of unclear steps add up as their gains do
    # (the pool went on to 37, twice past an undeclared capacity).  At 9.0 they are not short.
    # Nor against a count of fewer than 30 jobs (7.0 would be short of 12's 5.6 over 29 jobs):
    # of heavy-tailed jobs, too few to be far from luck.
    verdict = step_after_unclear_ones(pace_at_29, completions_at_12)[-1]
    assert verdict.history.knee.probe is None
    assert (verdict.history.knee.held_at is not None) == held
    if held:
        assert verdict.desired < 24
    else:
        assert verdict.desired > 29


def test_completions_that_end_in_bunches_count_as_noisier_than_a_poisson_count():
    from flexiqd.policy.knee import completions_between, noise

    steady = tuple((second, 10) for second in range(100, 110))
    bunched = tuple((second, 20 if second % 2 else 0) for second in range(100, 110))
    assert completions_between(steady, 100.0, 110.0) == (100, 10, 0.0)
    total, seconds, variance = completions_between(bunched, 100.0, 110.0)
    assert (total, seconds) == (100, 10) and variance > 100
    poisson = ThroughputSample(4, 10.0, 1.0, 110.0, 100)
    spread = poisson._replace(error=math.sqrt(variance * seconds) / seconds)
    assert noise(spread) > 3 * noise(poisson)


def test_a_jump_past_the_step_is_not_judged_as_one():
    # Quick jobs counted at 2 workers; then slow jobs arrive and the signals, finding the jobs
    # unlike, take the pool to 20 at once.  Its count (few of the slow jobs ended yet) is of
    # other jobs, not a ceiling: the knee does not judge the jump as a step from 2.
    history = ramp(KNEE_POLICY, pace_of(CEILING), end=7.0)[-1][2].history
    assert any(kept.workers == 4 for kept in history.knee.samples) and history.knee.probe is None
    now, series = 12.0, {}
    for tick in range(30):
        series[int(now)] = 2.0
        obs = counted(now, 20, 2.0, rates=series)
        if tick:  # the slow jobs in flight: far older than the quick ones finished
            obs = dataclasses.replace(obs, metrics=dataclasses.replace(obs.metrics, duration_p50=0.4,
                                                                       duration_p95=0.6, running_age_mean=30.0))
        decision = decide(obs, KNEE_POLICY, history, now)
        history = decision.history
        now += 1.0
    assert history.knee.held_at is None and decision.binding_cap != ("knee", 2)


# A server whose whole capacity one worker already uses (a CPU-capped database): more workers
# add nothing, and short counts at 12 or 13 jobs/s differ by their noise alone.
SATURATED_BY_ONE = {1: 12.0, 2: 12.6, 3: 12.6, 4: 13.0, 8: 13.0, 16: 12.0, 32: 11.0, 40: 10.0}


def test_the_knee_is_the_fewest_workers_no_larger_count_beats_beyond_its_noise():
    decisions = ramp(KNEE_POLICY, pace_of(SATURATED_BY_ONE), end=40.0)
    knee = decisions[-1][2].history.knee
    rates = {kept.workers: kept.completion_rate for kept in knee.samples}
    # A larger count read a little more than 5 % above the single worker's -- within the noise.
    assert rates[1] * 1.05 < max(rates.values())
    assert knee.held_at == 1 and decisions[-1][2].desired == 1


def test_best_still_takes_more_workers_that_clearly_complete_more():
    from flexiqd.policy.knee import best

    few = ThroughputSample(4, 100.0, 0.1, 10.0, 400)
    more = ThroughputSample(8, 140.0, 0.1, 20.0, 560)  # a sub-linear step, but 40 % more, clearly
    assert best((few, more), 0.05).workers == 8
    close = more._replace(completion_rate=104.0, completions=416)  # within one standard error
    assert best((few, close), 0.05).workers == 4


def test_a_crowd_landing_on_idle_workers_waits_for_their_first_count():
    # The first look at the crowd: jobs wait, the one worker up has not claimed yet.  Its count
    # is a tick away; doubling now would skip the count at one worker.
    landing = observe(1, runnable_depth=500, oldest_runnable_age=0.2, running=0, completion_rate=0.0,
                      recent_completions=0, recent_window=15.0, series_reported=True, duration_p50=None,
                      duration_p95=None)
    decision = decide(landing, KNEE_POLICY, None, 0.0)
    assert decision.desired == 1 and decision.binding_cap == ("knee", 1)
    assert "measuring the throughput of 1 workers" in decision.message


def test_a_step_waits_until_the_count_it_will_be_judged_against_is_long_enough():
    from flexiqd.policy.knee import START_SHARE, step_completions

    decisions = ramp(KNEE_POLICY, pace_of(CEILING), end=20.0)
    first_step = next(d for _, workers, d in decisions if d.desired > workers)
    counted_at_one = next(kept for kept in first_step.history.knee.samples if kept.workers == 1)
    assert counted_at_one.completions >= START_SHARE * step_completions(1, 4) > 10  # more than a first sample's ten
    assert "measuring the throughput of 1 workers" in decisions[2][2].message


def test_the_wait_for_a_longer_count_ends_with_the_probe_budget():
    # 3 jobs/s: a doubling's count needs more completions than 0.4 x the 30 s target collects.
    decisions = ramp(KNEE_POLICY, {n: 3.0 * n for n in range(1, 41)}, end=30.0)
    first = next(now for now, workers, d in decisions if d.desired > workers)
    assert first <= 1.0 + 0.4 * 30.0 + 2.0  # a tick to claim, the budget, a count's whole seconds


# --- the jobs in flight: their ages do not judge a step ---------------------------------------------

def aged_ramp(pace: dict[int, float], end: float):
    """``ramp``, with the in-flight ages of a steady state: half the jobs' duration, which is the
    jobs in flight over the completions (Little's law)."""
    decisions, by_second, history, workers, now = [], {}, None, 1, 0.0
    while now <= end:
        rate = pace[min(workers, max(pace))]
        by_second[int(now)] = rate
        obs = counted(now, workers, rate, rates=by_second)
        obs = dataclasses.replace(obs, metrics=dataclasses.replace(
            obs.metrics, running_age_mean=0.5 * obs.metrics.running / rate))
        decision = decide(obs, KNEE_POLICY, history, now)
        history = decision.history
        decisions.append((now, workers, decision))
        workers = decision.desired
        now += 1.0
    return decisions


FULL_AT_FOUR = {n: 10.0 * min(n, 4) for n in range(1, 41)}


def test_jobs_in_flight_as_young_as_before_let_the_step_stand():
    decisions = aged_ramp(LINEAR, end=40.0)
    assert decisions[-1][1] == 40 and decisions[-1][2].history.knee.held_at is None


def test_the_wait_for_a_longer_count_ends_when_the_stores_window_is_full():
    # A 2-minute target leaves a probe budget (48 s) longer than the store's recent window (15 s)
    # holds: a count at 3.6 jobs/s never reaches a doubling's completions, and growth must not
    # wait for it for ever.
    slow_target = dataclasses.replace(KNEE_POLICY, targets=dataclasses.replace(KNEE_POLICY.targets, age=120.0))
    decisions = ramp(slow_target, {n: 3.6 * n for n in range(1, 41)}, end=40.0)
    assert max(workers for _, workers, _ in decisions) > 1
    first = next(now for now, workers, d in decisions if d.desired > workers)
    assert first <= 15.0


def test_a_fast_first_count_is_long_enough_to_step_from():
    # 40 jobs/s: a second's count has more than half the completions the step's own count needs;
    # the step's count can run longer, so growth does not wait a whole second more for the start.
    from flexiqd.policy.knee import step_completions

    decisions = ramp(KNEE_POLICY, {n: 40.0 * n for n in range(1, 41)}, end=10.0)
    first_step = next(d for _, workers, d in decisions if d.desired > workers)
    counted_at_one = next(kept for kept in first_step.history.knee.samples if kept.workers == 1)
    assert counted_at_one.completions < step_completions(1, 2)


def test_no_count_is_taken_while_workers_stop():
    # Held back from 8 to 4: while the 4 surplus workers stop, a count at 4 mixes their last jobs
    # with the others' (one such read half the rate) and must not replace the step's count.
    decisions = ramp(KNEE_POLICY, pace_of(CEILING), end=20.0)
    history = decisions[-1][2].history
    before = {kept.workers: kept for kept in history.knee.samples}
    stopping = dataclasses.replace(counted(21.0, 2, 9.0), draining=2)
    after = decide(stopping, KNEE_POLICY, history, 21.0).history.knee
    assert {kept.workers: kept for kept in after.samples} == before
    assert after.held_at == history.knee.held_at == 2


def test_a_crowd_seen_a_little_late_still_waits_for_the_first_claims():
    landing = observe(1, runnable_depth=500, oldest_runnable_age=1.7, running=0, completion_rate=0.0,
                      recent_completions=0, recent_window=15.0, series_reported=True, duration_p50=None,
                      duration_p95=None)
    decision = decide(dataclasses.replace(landing, tick=1.0), KNEE_POLICY, None, 0.0)
    assert decision.desired == 1 and decision.binding_cap == ("knee", 1)


def measured_at(workers: int, rate: float, at: float, seconds: float = 12.0) -> ThroughputSample:
    return ThroughputSample(workers, rate, 1.0, at, round(rate * seconds))


def test_growth_up_to_a_count_measured_without_a_ceiling_is_not_probed_again():
    # A square wave: the last high phase measured 2 to 32 workers, each step paying; the pool
    # shrank between.  The next phase grows straight back to the measured count, not in steps
    # of a count each (4, 8, 16, 32: half a minute of late jobs every phase).
    earlier = tuple(measured_at(n, 10.0 * n, 100.0 + n) for n in (4, 8, 16, 32))
    state = KneeState(samples=(measured_at(2, 20.0, 299.0),) + earlier, backlog_since=290.0)
    assert knee_cap(state, KNEE, 300.0, obs=counted(300.0, 2, 20.0)) == (32, "proven")
    assert describe(state, "proven", 32) == "up to 32 workers, measured without a ceiling (32 workers 320.0 jobs/s)"
    # Without the earlier counts, a step at a time (four times two workers: a small pool's step).
    assert knee_cap(KneeState(samples=state.samples[:1], backlog_since=290.0), KNEE, 300.0,
                    obs=counted(300.0, 2, 20.0)) == (8, "step")


def test_a_count_measured_past_a_ceiling_is_not_grown_to_again():
    # 16 and 32 workers completed no more than 8 did: growth up to 8 only (the count that paid).
    counts = (measured_at(4, 40.0, 104.0), measured_at(8, 80.0, 108.0), measured_at(16, 82.0, 116.0),
              measured_at(32, 81.0, 132.0))
    state = KneeState(samples=(measured_at(1, 10.0, 299.0),) + counts, backlog_since=290.0)
    assert knee_cap(state, KNEE, 300.0, obs=counted(300.0, 1, 10.0)) == (8, "proven")
    # Counts older than sample_max_age prove nothing: a step at a time again.
    later = 300.0 + KNEE.sample_max_age
    stale = KneeState(samples=(measured_at(1, 10.0, later - 1),) + counts, backlog_since=later - 10)
    assert knee_cap(stale, KNEE, later, obs=counted(later, 1, 10.0)) == (4, "step")


# 10 jobs/s a worker up to 20 workers, then the dependency is full: between a doubling's counts.
FULL_AT_TWENTY = {n: 10.0 * min(n, 20) for n in range(1, 41)}


def test_a_ceiling_inside_a_step_holds_where_the_smaller_counts_pace_reaches_it():
    # Steps of 1, 2, 4, 8, 16 paid in full; 32 gave 200 jobs/s, what 20 workers give at 16's pace.
    # The best count measured is 32, but its last 12 workers only queue on the dependency.
    decisions = ramp(KNEE_POLICY, FULL_AT_TWENTY, end=60.0)
    counts = [workers for _, workers, _ in decisions]
    assert 32 in counts and max(counts) < 40
    found = next(d for _, workers, d in decisions if d.reason == "CappedByKnee" and d.desired == 20)
    assert "held at a measured ceiling: 20 workers, within the step from 16 workers 160.0 jobs/s " \
           "to 32 workers 200.0 jobs/s" in found.message
    # 20 completes as much as 32, and so does 19 within the noise of 32's one-second count; 18
    # clearly does not, and the trim ends at 19.
    knee = decisions[-1][2].history.knee
    assert knee.held_at == 19 and knee.trim is None and decisions[-1][2].desired == 19
    assert {kept.workers for kept in knee.samples} >= {16, 18, 19, 20, 32}
    assert 17 not in {kept.workers for kept in knee.samples}


# 10 jobs/s a worker up to 20, then 2 jobs/s more a worker: a dependency whose throughput creeps
# up past its capacity, as a contended one's does.
CREEPING = {n: 10.0 * n if n <= 20 else 200.0 + 2.0 * (n - 20) for n in range(1, 41)}


def test_the_knee_is_trimmed_a_worker_at_a_time_while_fewer_complete_as_much():
    decisions = ramp(KNEE_POLICY, CREEPING, end=60.0)
    knee = decisions[-1][2].history.knee
    rates = {kept.workers: kept.completion_rate for kept in knee.samples}
    # 32 was the best (224 jobs/s in a one-second count).  Tried: 22, where 16's pace reaches
    # 224 -- clearly less (204); then 24 (208) and 23 (206), each as much within that count's noise.
    assert (rates[22], rates[23], rates[24]) == (204.0, 206.0, 208.0)
    assert knee.held_at == 23 and knee.trim is None and decisions[-1][2].desired == 23
    held = [d.desired for _, _, d in decisions if d.history.knee.held_at is not None]
    assert min(held) == 22 and max(held[3:]) <= 24  # never under the count found short, nor back up


def test_a_trimmed_count_is_judged_on_a_long_count_not_its_first_second():
    # The first seconds at a trimmed count read low (the surplus workers' last jobs); the trim
    # waits for a count as long as a step's verdict before judging it.
    trimmed = next(now for now, _, d in ramp(KNEE_POLICY, CREEPING, end=60.0)
                   if d.history.knee.held_at == 22 and d.history.knee.trim is not None)
    history = ramp(KNEE_POLICY, CREEPING, end=trimmed + 2.0)[-1][2].history  # two ticks at 22, not counted yet
    assert history.knee.held_at == 22 and history.knee.trim == KneeTrim(best=32, floor=16)
    assert not any(kept.workers == 22 for kept in history.knee.samples)
    trim, low = history.knee.trim, {second: 100.0 for second in range(int(trimmed) + 2, int(trimmed) + 6)}
    for now in (trimmed + 3.0, trimmed + 4.0, trimmed + 5.0):
        history = decide(counted(now, 22, 100.0, rates=low), KNEE_POLICY, history, now).history
    counted_at_22 = next(kept for kept in history.knee.samples if kept.workers == 22)
    assert counted_at_22.completion_rate == 100.0 and counted_at_22.completions < 400  # taken, and short
    assert history.knee.held_at == 22 and history.knee.trim == trim  # not judged on it


# A pool of 8 connections under workers of concurrency 2 (bench/ceilings.md): 39 jobs/s a worker,
# full at 4 workers, whose count reads a little short of 2's pace (154 against 156).
CONNECTIONS = {1: 39.0, 2: 78.0, 3: 117.0, 4: 154.0, 5: 157.0, 8: 158.0, 40: 158.0}


def test_a_trim_at_a_few_workers_is_judged_as_soon_as_its_count_tells_a_worker_apart():
    # 4 is held short of 2's pace, so 3 is tried.  A worker is a quarter of the throughput there: a
    # second or two of 117 jobs/s shows 3 clearly short, and 4 is held again -- not after the 13 s
    # a trim at twenty workers needs (drains on the real pool were 1.25 x a fixed 4's with it).
    decisions = ramp(KNEE_POLICY, pace_of(CONNECTIONS), end=40.0)
    trimmed = [now for now, _, d in decisions if d.history.knee.trim is not None]
    assert trimmed, "the knee is never trimmed: the test no longer covers a trim"
    at_three = [now for now, workers, _ in decisions if workers == 3]
    knee = decisions[-1][2].history.knee
    assert knee.held_at == 4 and knee.trim is None and decisions[-1][2].desired == 4
    assert len(at_three) <= 4, at_three


# A contended dependency whose capacity runs out a little under 16 workers: 15 complete within a
# per cent or two of what 16 do, and past 16 every worker slows them all.
FULL_JUST_UNDER_SIXTEEN = {n: 10.0 * n if n < 15 else 158.0 if n == 15 else 160.0 - 6.0 * (n - 16)
                           for n in range(1, 41)}


def test_a_knee_whose_step_kept_pace_is_held_a_worker_under_when_that_completes_as_much():
    # 8 -> 16 kept 8's pace and 32 showed the ceiling: 16 is the best count measured, and it is
    # as likely over the capacity as under it.  One fewer is tried and, completing as much within
    # the counting noise, held; 14, tried next, clearly completes less.
    decisions = ramp(KNEE_POLICY, FULL_JUST_UNDER_SIXTEEN, end=60.0)
    knee = decisions[-1][2].history.knee
    rates = {kept.workers: kept.completion_rate for kept in knee.samples}
    assert rates[16] == 160.0 and 32 in rates and rates[15] == 158.0
    assert knee.held_at == 15 and knee.trim is None and decisions[-1][2].desired == 15
    tried = next(d for _, _, d in decisions if d.history.knee.held_at == 15)
    assert tried.history.knee.trim == KneeTrim(best=16, floor=8)
    assert "held at a measured ceiling: 15 workers, within the step from 8 workers 80.0 jobs/s " \
           "to 16 workers 160.0 jobs/s" in tried.message
    assert rates[14] == 140.0  # tried next, clearly short: the trim ends at 15


def test_a_trimmed_knee_confirmed_by_a_re_probe_is_not_trimmed_again():
    # The re-probe from 15 (to 19) shows the ceiling: 15 is held again, next to 16's count, and
    # the trim is not walked again (14 is not counted twice).
    decisions = ramp(KNEE_POLICY, FULL_JUST_UNDER_SIXTEEN, end=340.0)
    assert 19 in [workers for now, workers, _ in decisions if now > 300]
    knee = decisions[-1][2].history.knee
    assert knee.held_at == 15 and knee.trim is None and decisions[-1][2].desired == 15
    fourteen = next(kept for kept in knee.samples if kept.workers == 14)
    assert fourteen.at < 60 and not any(d.history.knee.trim for now, _, d in decisions if now > 300)


def test_a_knee_whose_worker_under_clearly_completes_less_is_held_where_it_was_found():
    # A pool of 8 connections whose count at 4 workers kept 2's pace in full: 3 is tried, clearly
    # completes a quarter less, and 4 is held again within seconds.
    kept_pace = {**CONNECTIONS, 4: 156.0}
    decisions = ramp(KNEE_POLICY, pace_of(kept_pace), end=40.0)
    knee = decisions[-1][2].history.knee
    at_three = [now for now, workers, _ in decisions if workers == 3]
    assert at_three and len(at_three) <= 4, at_three
    assert knee.held_at == 4 and knee.trim is None and decisions[-1][2].desired == 4
    assert {kept.workers: kept.completion_rate for kept in knee.samples}[3] == 117.0


def test_a_step_that_paid_in_full_or_within_its_noise_is_held_whole():
    from flexiqd.policy.knee import flattened_at

    below = measured_at(16, 160.0, 100.0, seconds=10.0)
    assert flattened_at(measured_at(32, 320.0, 110.0, seconds=10.0), below) == 32  # linear: all paid
    # 4 % short of linear: a 10 s count of 1,600 and 3,100 completions cannot tell that from noise.
    assert flattened_at(measured_at(32, 310.0, 110.0, seconds=10.0), below) == 32
    # Clearly short: where 16's pace reaches 240 jobs/s, 24 workers.
    assert flattened_at(measured_at(32, 240.0, 110.0, seconds=10.0), below) == 24
    # Never at or below the smaller count: a step that added a little added it with its first worker.
    assert flattened_at(measured_at(32, 161.0, 110.0, seconds=10.0), below) == 17


# 1.5 jobs/s a worker up to 30 workers, then flat: the dependency is full at 30.
FLAT_PAST_THIRTY = {n: 1.5 * min(n, 30) for n in range(1, 61)}


def test_an_unclear_step_shows_a_ceiling_only_on_counts_long_enough_to_tell():
    from flexiqd.policy.knee import FLAT_MIN_COMPLETIONS, added_nothing
    # 7 workers completing a third less than 5 did: on counts of a dozen slow, heavy-tailed
    # jobs that is within their noise, and a pool held on it waits minutes past its target.
    short_start, short_step = measured_at(5, 1.5, 100.0, seconds=13.0), measured_at(7, 1.0, 120.0, seconds=13.0)
    assert short_step.completions < FLAT_MIN_COMPLETIONS
    assert not added_nothing(short_step, short_start)
    # The same rates counted ten times as long: the step added nothing, a ceiling.
    long_start, long_step = measured_at(5, 1.5, 100.0, seconds=130.0), measured_at(7, 1.0, 240.0, seconds=130.0)
    assert added_nothing(long_step, long_start)
    # A step that added its share is no ceiling however long it was counted.
    assert not added_nothing(measured_at(7, 2.1, 240.0, seconds=130.0), long_start)


def test_small_steps_that_stay_unclear_are_judged_together_until_one_is_clear():
    # The age signal asks for a tenth more workers at a time.  Each small step alone stays
    # within a count's noise (34 against 30); judged from where the first unclear one started,
    # their gains add up, and the ceiling shows before the pool reaches twice it.
    schedule = [(0.0, 30), (20.0, 34), (45.0, 38)]
    decisions = ramp(KNEE_POLICY, FLAT_PAST_THIRTY, end=60.0, schedule=schedule)
    unclear = next(d for _, workers, d in decisions if d.history.knee.unclear_from is not None)
    assert unclear.history.knee.unclear_from.workers == 30
    probes = {(d.history.knee.probe.start.workers, d.history.knee.probe.to_workers)
              for _, _, d in decisions if d.history.knee.probe is not None}
    assert (30, 34) in probes and (30, 38) in probes and (34, 38) not in probes
    held = next(d for _, _, d in decisions if d.history.knee.held_at is not None)
    assert held.history.knee.held_at <= 30 and held.reason == "CappedByKnee"
    assert describe(unclear.history.knee, "step", 60) == \
        "the step to 34 workers is unclear (34 workers 45.0 jobs/s; 30 workers 45.0 jobs/s): up to 60 next, judged against 30"


def test_a_step_past_an_unclear_ones_reach_is_not_called_paid():
    # A real pool of connections: 4 workers counted 13.3 jobs/s, the step to 8 stayed unclear at
    # 14.4 (within the noise of a few seconds' counts), and growth went on to 16 -- past a
    # doubling of 4, so judged against 8.  The log called the step to 8 paid.
    four, eight = ThroughputSample(4, 13.3, 2.0, 10.0, 60), ThroughputSample(8, 14.4, 2.0, 17.0, 50)
    unclear = KneeState(samples=(four, eight), unclear_from=four)
    assert describe(unclear, "step", 16) == \
        "the step to 8 workers is unclear (8 workers 14.4 jobs/s; 4 workers 13.3 jobs/s): up to 16 next"
    paid = KneeState(samples=(four, ThroughputSample(8, 26.0, 2.0, 17.0, 90)))
    assert describe(paid, "step", 16) == "the step to 8 paid (8 workers 26.0 jobs/s): up to 16 next"


def test_a_reprobe_begun_while_the_jobs_look_unlike_is_judged_on_its_count_apart_from_a_step():
    # Held at 2 (20 jobs/s).  The pool is at 3 while the jobs' durations spread wide, with no
    # fresh count of the knee to begin a step from (a re-probe tried anyway), and 3 then complete 30
    # jobs/s.  Nothing would ever judge that count: the pool stayed at 3 while 20 were wanted
    # (a backlog late by 15 minutes).  Its count beats the knee's own: the knee is forgotten.
    history = ramp(KNEE_POLICY, pace_of(CEILING), end=40.0)[-1][2].history
    by_second, released = {}, None
    for second in range(400, 431):
        now = float(second)
        by_second[second] = 30.0
        busy = counted(now, 3, 30.0, rates=by_second)
        unlike = dataclasses.replace(busy, metrics=dataclasses.replace(
            busy.metrics, duration_p95=10 * busy.metrics.duration_p50))
        decision = decide(unlike, KNEE_POLICY, history, now)
        history = decision.history
        assert history.knee.probe is None  # no step: the knee's count is minutes old
        if history.knee.held_at is None:
            released = now
            break
    assert released is not None and decision.desired > 3


def ramp_from(history, pace: dict[int, float], start: float, end: float, workers: int, *, age: float = 20.0,
              spread: float = 1.5):
    """``ramp`` from ``history`` with the oldest job ``age`` seconds old and the durations' p95
    ``spread`` times their p50 (ten: the stretch past a ceiling, and a crowd's slow first jobs
    still in the store's window, look like that)."""
    decisions, by_second = [], {}
    for second in range(int(start), int(end) + 1):
        now = float(second)
        by_second[second] = pace[min(workers, max(pace))]
        busy = counted(now, workers, by_second[second], rates=by_second, age=age)
        spread_out = dataclasses.replace(busy, metrics=dataclasses.replace(
            busy.metrics, duration_p95=spread * busy.metrics.duration_p50))
        decision = decide(spread_out, KNEE_POLICY, history, now)
        history = decision.history
        decisions.append((now, workers, decision))
        workers = decision.desired
    return decisions


def test_a_reprobe_is_a_step_judged_against_the_knees_fresh_count_whatever_the_spread():
    # Held at 2 (20 jobs/s, flat past it).  The re-probe comes while the durations spread wide.
    # Without a step its count was judged only apart from one, which needs alike jobs: a pool
    # held at 30 workers re-probed to 38 and sat there four minutes past its capacity.  As a
    # step from the knee's own count, seconds old, the ceiling shows within the step's count.
    history = ramp(KNEE_POLICY, pace_of(CEILING), end=40.0)[-1][2].history
    due = history.knee.held_since + KNEE.reprobe_interval
    decisions = ramp_from(history, pace_of(CEILING), due - 10, due + 40, workers=2, spread=10.0)
    probes = {(d.history.knee.probe.start.workers, d.history.knee.probe.to_workers)
              for _, _, d in decisions if d.history.knee.probe is not None}
    assert probes == {(2, 3)}
    confirmed = next(now for now, _, d in decisions if d.history.knee.confirmed)
    assert confirmed - due <= 20  # the step's count, not minutes
    assert decisions[-1][2].desired == 2 and decisions[-1][2].history.knee.held_at == 2


def test_a_reprobe_waits_for_a_fresh_count_of_the_knee_it_starts_from():
    # The knee's only count is minutes old (the pool was not saturated since): the re-probe waits
    # at the knee until the held count is counted again, or, when it cannot be (too few
    # completions), until a second interval has passed.
    state = KneeState(samples=(measured_at(1, 10.0, 10.0), measured_at(2, 20.0, 20.0), measured_at(4, 20.0, 40.0)),
                      backlog_since=300.0, held_at=2, held_since=40.0, held_rate=20.0)
    due = 40.0 + KNEE.reprobe_interval
    assert knee_cap(state, KNEE, due + 1, obs=counted(due + 1, 2, 20.0)) == (2, "held")
    fresh = dataclasses.replace(state, samples=state.samples[:1] + (measured_at(2, 20.0, due),) + state.samples[2:])
    assert knee_cap(fresh, KNEE, due + 1, obs=counted(due + 1, 2, 20.0)) == (3, "reprobe")
    overdue = 40.0 + 2 * KNEE.reprobe_interval
    assert knee_cap(state, KNEE, overdue, obs=counted(overdue, 2, 20.0)) == (3, "reprobe")


def test_each_reprobe_that_confirms_the_knee_doubles_the_wait_for_the_next_while_late():
    # A late backlog at a real ceiling: every re-probe runs a quarter past the capacity for its
    # count.  Confirmed once, the next waits twice as long (up to the reprobe interval).
    history = ramp(KNEE_POLICY, pace_of(CEILING), end=40.0)[-1][2].history
    since = history.knee.held_since
    late = ramp_from(history, pace_of(CEILING), since + 1, since + 150, workers=2, age=45.0)  # target 30 s
    reprobes = [now for now, _, d in late if d.binding_cap == ("knee", 3) and d.history.knee.probe is None]
    confirmations = [(now, d.history.knee.confirmed) for now, _, d in late if d.history.knee.probe is None
                     and d.history.knee.held_since == now]
    assert [count for _, count in confirmations] == [1, 2]
    (first, _), (second, _) = confirmations
    # Due 30 s after the hold (the age target), then 60 s after the first confirmation.
    assert reprobes[0] - since == pytest.approx(30, abs=1.5)
    assert reprobes[1] - first == pytest.approx(60, abs=1.5)
    assert all(workers <= 3 for _, workers, _ in late)


@pytest.mark.parametrize("at_three, knee_after, confirmed", [(22.0, 2, 1), (23.0, 2, 0), (27.0, None, 0)])
def test_a_reprobe_whose_count_stays_unclear_goes_the_way_it_leans(at_three, knee_after, confirmed):
    # Held at 2 (20 jobs/s).  The re-probe to 3 must complete 25 jobs/s to pay; its count stays
    # within the noise of that either way.  Short of it (22, 23), the knee stands: forgotten, a
    # ceiling inside the re-probe was grown past again.  At or above it (27), the knee goes.
    # Leaning flat (22: under a quarter of its worker's share, 22.5), it spaces the next re-probe
    # as a confirmation would; a real ceiling re-probed every 30 s while late, each count
    # unclear, was over its capacity for 18 s of every 48.
    history = ramp(KNEE_POLICY, pace_of(CEILING), end=40.0)[-1][2].history
    due = history.knee.held_since + KNEE.reprobe_interval
    decisions = ramp_from(history, {**pace_of(CEILING), 3: at_three}, due - 10, due + 40, workers=2)
    # The first decision after the re-probe's step ends is its verdict.
    verdict = next(after for (_, _, before), (_, _, after) in zip(decisions, decisions[1:])
                   if before.history.knee.probe is not None and after.history.knee.probe is None)
    assert verdict.history.knee.held_at == knee_after
    assert verdict.history.knee.confirmed == confirmed
    if knee_after is not None:
        assert verdict.desired == 2


# --- a count reached without a smaller one: compared downwards ------------------------------------

# Older than KNEE_POLICY's age target: the maximum does not keep the backlog within it.
LATE = 90.0


def test_a_late_pool_at_its_maximum_with_nothing_smaller_counted_descends_to_the_knee():
    # The pool stands at its maximum of 40 when the count begins (it grew past its first count:
    # jobs too long to count in time, a stalled server).  Nothing smaller compares, and no step up
    # is allowed: half the workers are counted, and the ceiling they show is searched below.
    decisions = ramp(KNEE_POLICY, pace_of(CEILING), end=120.0, workers=40, age=LATE)
    counts = [workers for _, workers, _ in decisions]
    assert counts[0] == 40 and max(counts) == 40
    descending = next(d for _, _, d in decisions if d.reason == "CappedByKnee")
    assert descending.desired == 20
    assert "measuring 20 workers against 40 workers 13.0 jobs/s, reached without a smaller count" \
        in descending.message
    # With nothing measured under a count, its half is tried, judged on a count as long as the
    # step from it would need: 20, 10, 5, then 3 and 2 -- 40 a worker at a time, each count long
    # enough to tell one worker apart, would have counted for minutes.
    assert [20, 10, 5] == sorted({n for n in counts if n >= 5} - {40}, reverse=True)
    at_ten = [now for now, workers, _ in decisions if workers == 10]
    assert len(at_ten) < 13, at_ten  # not the trim's longest count: a half need not tell a worker apart
    knee = decisions[-1][2].history.knee
    assert knee.held_at == 2 and decisions[-1][2].desired == 2 and knee.descent is None
    assert counts[-20:] == [2] * 20


def test_a_maximum_that_pays_over_its_half_is_gone_back_to_and_not_descended_from_again():
    decisions = ramp(KNEE_POLICY, LINEAR, end=200.0, workers=40, age=LATE)
    counts = [workers for _, workers, _ in decisions]
    halved = [now for now, workers, _ in decisions if workers == 20]
    assert halved, "no descent: the test no longer covers one"
    # Counted at 20 until 40 clearly paid over it (a step's verdict), then back to 40 for good.
    assert len(halved) <= 8 and halved == list(range(int(halved[0]), int(halved[-1]) + 1))
    assert counts[-1] == 40 and min(counts[int(halved[-1]) + 1:]) == 40
    knee = decisions[-1][2].history.knee
    assert knee.held_at is None and knee.descent is None and knee.descended_at == halved[0] - 1


def test_a_maximum_that_keeps_the_backlog_within_its_target_is_not_descended_from():
    # Slow jobs at their maximum, on time: a half could only make them late.
    decisions = ramp(KNEE_POLICY, pace_of(CEILING), end=60.0, workers=40)
    assert all(workers == 40 for _, workers, _ in decisions)
    assert all(d.history.knee.descended_at is None for _, _, d in decisions)


def test_a_pool_short_of_its_maximum_steps_up_rather_than_descending():
    # At 16 of 40 with nothing smaller counted, a step up (that pays or shows the ceiling) costs
    # the backlog nothing; a descent would.
    decisions = ramp(KNEE_POLICY, pace_of(CEILING), end=60.0, workers=16, age=LATE)
    counts = [workers for _, workers, _ in decisions]
    assert 32 in counts and 8 not in counts[:counts.index(32)]
    assert all(d.history.knee.descended_at is None for _, _, d in decisions)


def test_a_descent_counts_the_half_less_what_its_stopping_workers_may_end():
    from flexiqd.policy.knee import descent_sample
    from flexiqd.policy.types import KneeDescent, LoadSample

    top = ThroughputSample(40, 13.0, 3.0, 100.0, 130)
    descent = KneeDescent(start=top, to_workers=20, since=100.0, counting_from=103.0, stopping=6)
    obs = counted(110.0, 20, 16.0)
    load = tuple(LoadSample(at, 20, 80, 16.0, None, 5000) for at in range(101, 111))
    sample = descent_sample(descent, obs, load, 110.0)
    # Seconds 103..109: 7 of 16 completions, of which the 6 stopping workers may have ended 6.
    assert (sample.workers, sample.completions) == (20, 7 * 16 - 6)
    assert sample.completion_rate == pytest.approx((7 * 16 - 6) / 7)
    # Before the count begins, or with workers still above the half: no count.
    assert descent_sample(descent._replace(counting_from=None), obs, load, 110.0) is None
    assert descent_sample(descent, counted(110.0, 24, 16.0), load, 110.0) is None


def test_a_descent_whose_verdict_stays_unclear_goes_the_way_it_leans():
    from flexiqd.policy.types import History, KneeDescent, LoadSample

    # 30 workers read 16 jobs/s in bunches (the real pool of 8 connections, 600 ms jobs); the half
    # completes 13.5 a second in bunches too, 27 and 0 by turns: within the noise of both, 30 is
    # neither clearly past a ceiling nor clearly paid.  It is short of what its 15 extra workers
    # must add (half their share: 20.3 jobs/s), so the pool is held, not sent back up to 30.
    top = ThroughputSample(30, 16.0, 3.75, 100.0, 96, error=4.0)
    bunched = {second: (27.0 if second % 2 else 0.0) for second in range(90, 140)}
    knee = KneeState(samples=(top,), backlog_since=90.0, descended_at=100.0,
                     descent=KneeDescent(start=top, to_workers=15, since=100.0, counting_from=102.0))
    history = History(seeded=True, knee=knee,
                      load=tuple(LoadSample(at, 15, 60, 13.5, None, 5000) for at in range(101, 106)))
    decisions = []
    for now in range(106, 125):
        decision = decide(counted(float(now), 15, 13.5, rates=bunched, age=LATE), KNEE_POLICY, history, float(now))
        history = decision.history
        decisions.append(decision)
        if history.knee.descent is None:
            break
    assert history.knee.descent is None, "the descent never ended"
    assert history.knee.held_at is not None and history.knee.held_at <= 15
    assert decisions[-1].desired <= 15
