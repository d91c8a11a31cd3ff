"""Stabilisation windows, tolerance, overload, rate limits, and a failed metrics read."""

from __future__ import annotations

from flexiqd.policy import (Behavior, Dependency, DependencyUse, History, PoolPolicy, RateLimit, Targets,
                            compute_desired_workers, decide, decide_fleet)
from flexiqd.policy.config import DEFAULT_DOWN_LIMIT
from flexiqd.policy.decide import DRAINED_BACKLOG_HOLD
from flexiqd.policy.fleet import PoolInput
from flexiqd.policy.smoothing import stabilize
from flexiqd.policy.types import TimedCount

from test_policy_support import observe, run

NO_LIMITS = dict(up_limit=None, down_limit=None)


# The depth signal answers at once (no averaging), which makes each tick's wish exact.
# An explicit drain time (the age target's default, 30 s): a pool that does not run lean, so
# the windows alone move it.
BY_DEPTH = Targets(depth_per_worker=10, drain_time=30)


def wanting(workers: int, current: int):
    """An observation whose signals ask for exactly ``workers`` (10 runnable jobs per worker)."""
    return observe(current, runnable_depth=workers * 10, running=1, completion_rate=1.0)


def policy(**behavior) -> PoolPolicy:
    # These tests are about the windows an operator can set; the default hold is in test_policy_economics.
    behavior = {**NO_LIMITS, "down_window": 300.0, **behavior}
    return PoolPolicy(max_workers=50, targets=BY_DEPTH, behavior=Behavior(**behavior))


def test_a_low_tick_inside_the_up_window_never_turns_a_scale_up_into_a_scale_down():
    # flexiq drops to 3 here; the HPA's clamping keeps 5 until every tick agrees on more.
    decisions = run(policy(up_window=60.0), [(0.0, wanting(5, 5)), (10.0, wanting(3, 5)), (20.0, wanting(8, 5))])
    assert [d.desired for d in decisions] == [5, 5, 5]
    assert decisions[1].reason == "ScaleDownStabilized"
    assert decisions[2].reason == "ScaleUpStabilized"
    later = decide(wanting(8, 5), policy(up_window=60.0), decisions[-1].history, 80.0)
    assert later.desired == 8  # the 3 has left the up window


def test_stabilize_clamps_toward_the_current_count():
    recs = (TimedCount(0.0, 5), TimedCount(10.0, 3))
    behavior = Behavior(up_window=60.0, down_window=0.0)
    assert stabilize(5, 8, recs, 20.0, behavior) == (5, "window up")
    assert stabilize(5, 8, (), 20.0, behavior) == (8, None)


def test_the_first_dip_after_a_start_is_held_for_the_down_window():
    first = decide(wanting(2, 8), policy(), None, 1000.0)
    assert first.desired == 8
    assert first.reason == "ScaleDownStabilized"
    assert first.history.seeded
    ticks = [(1000.0 + t, wanting(2, 8)) for t in range(10, 300, 10)]
    assert all(d.desired == 8 for d in run(policy(), ticks, first.history))
    assert decide(wanting(2, 8), policy(), run(policy(), ticks, first.history)[-1].history, 1301.0).desired == 2


def test_a_spike_after_a_held_dip_scales_up_at_once_and_never_down():
    ticks = [(float(t), wanting(2, 6)) for t in range(0, 100, 10)] + [(100.0, wanting(10, 6))]
    decisions = run(policy(), ticks)
    assert {d.desired for d in decisions[:-1]} == {6}
    assert decisions[-1].desired == 10
    assert decisions[-1].reason == "ScaleUpDepth"
    dip_again = decide(wanting(2, 10), policy(), decisions[-1].history, 110.0)
    assert dip_again.desired == 10


def test_every_tick_is_recorded_also_the_ones_asking_for_no_change():
    decisions = run(policy(), [(0.0, wanting(6, 6)), (10.0, wanting(6, 6))])
    assert [rec.workers for rec in decisions[-1].history.recommendations] == [6, 6, 6]  # seed + two ticks


def test_tolerance_holds_small_changes():
    held = decide(wanting(11, 10), policy(down_window=0.0), None, 0.0)
    assert held.desired == 10
    assert held.reason == "DesiredWithinRange"
    assert "tolerance" in held.smoothing
    assert decide(wanting(12, 10), policy(down_window=0.0), None, 0.0).desired == 12


def test_tolerance_comes_before_the_clamp_so_it_cannot_hold_a_pool_below_min():
    # flexiq applies the tolerance last: 10 workers, min 11, tolerance 0.2 -> it keeps 10.
    assert compute_desired_workers(0, 30, 10, min_workers=11, max_workers=20, tolerance=0.2).desired_workers == 10
    tolerant = PoolPolicy(min_workers=11, max_workers=20, targets=BY_DEPTH,
                          behavior=Behavior(tolerance=0.2, down_window=0.0, **NO_LIMITS))
    decision = decide(wanting(10, 10), tolerant, None, 0.0)
    assert decision.desired == 11
    assert decision.reason == "RaisedToMinimum"


def test_tolerance_does_not_hold_back_growth_to_a_cap_the_signals_want_beyond():
    # The signals want 20; max_workers caps them at 11: one more worker is 10 %, inside the band,
    # but it is the cap that makes the step small, not noise.
    capped = PoolPolicy(max_workers=11, targets=BY_DEPTH, behavior=Behavior(down_window=0.0, **NO_LIMITS))
    decision = decide(wanting(20, 10), capped, None, 0.0)
    assert (decision.desired, decision.reason) == (11, "CappedByMax")
    assert "tolerance" not in decision.smoothing
    # Uncapped, the same small step is still held.
    assert decide(wanting(11, 10), capped, None, 0.0).desired == 10


def test_staggered_starts_reach_the_maximum_instead_of_stopping_inside_the_band():
    # The last staggered step of a 0 -> 40 left 38 up and busy; the late backlog wants far more.
    pool = PoolPolicy(max_workers=40, targets=Targets(age=10),
                      dependencies=(DependencyUse(dependency="db", per_worker=2),))
    late = observe(38, concurrency=1, runnable_depth=300, running=38, oldest_runnable_age=12.0,
                   completion_rate=2.0, duration_p50=10.0, duration_p95=10.0)
    db = Dependency(name="db", capacity=100, start_burst=8)
    decision = decide_fleet([PoolInput(observation=late, policy=pool)], [db], 100.0)["default"]
    assert (decision.desired, decision.reason) == (40, "CappedByMax")


def test_an_overloaded_pool_bypasses_the_tolerance():
    # 41 jobs running on 40 slots (a draining worker's jobs, or another host's): 11 wanted.
    full = PoolPolicy(max_workers=50, targets=Targets(utilisation=1.0), behavior=Behavior(down_window=0.0, **NO_LIMITS))
    decision = decide(observe(10, running=41, completion_rate=41.0), full, None, 0.0)
    assert decision.desired == 11
    assert "overload" in decision.smoothing
    assert decide(observe(10, running=40, completion_rate=40.0), full, None, 0.0).desired == 10


def test_scale_up_is_limited_to_the_hpa_default_per_15_seconds():
    limited = PoolPolicy(max_workers=100, targets=BY_DEPTH)  # default limits
    first = decide(wanting(40, 2), limited, None, 0.0)
    assert first.desired == 6  # max(2 + 4, 2 x 2)
    assert first.reason == "RateLimited"
    again = decide(wanting(40, 6), limited, first.history, 5.0)
    assert again.desired == 6  # the period started at 2
    later = decide(wanting(40, 6), limited, again.history, 16.0)
    assert later.desired == 12  # max(6 + 4, 6 x 2)


def test_scale_down_is_limited_per_period():
    gentle = PoolPolicy(max_workers=100, targets=BY_DEPTH,
                        behavior=Behavior(down_window=0.0, down_limit=RateLimit(workers=1, percent=10, period=60)))
    first = decide(wanting(2, 20), gentle, None, 0.0)
    assert first.desired == 18  # the larger of -1 and -10 %
    assert first.reason == "RateLimited"
    assert decide(wanting(2, 18), gentle, first.history, 30.0).desired == 18
    assert decide(wanting(2, 18), gentle, first.history, 61.0).desired == 16


def test_a_failed_metrics_read_holds_and_records_nothing():
    quiet = run(policy(), [(0.0, wanting(6, 6))])[-1].history
    failed = decide(observe(6, failed=True), policy(), quiet, 10.0)
    assert failed.desired == 6
    assert failed.reason == "HoldMetricsUnavailable"
    assert failed.history == quiet
    # A blip at start neither seeds nor records anything.
    assert decide(observe(6, failed=True), policy(), None, 0.0).history == History()


def test_a_failed_read_is_not_taken_for_an_idle_pool():
    ticks = [(float(t), observe(8, failed=True)) for t in range(0, 600, 10)]
    assert {d.desired for d in run(PoolPolicy(max_workers=10), ticks)} == {8}


# -- a drained backlog ---------------------------------------------------------------------------

def steady(workers: int, **fields):
    """8 jobs running on 1 s jobs arriving at 4/s (4 jobs/s per busy worker): 3 workers' worth at 90 %."""
    values = dict(running=8, completion_rate=8.0, arrival_rate=4.0)
    values.update(fields)
    return observe(workers, **values)


def burst_then_quiet(policy: PoolPolicy, quiet_until: float):
    """Quiet at 3 workers, a backlog from t=400 to t=450 that wants 10, then quiet again."""
    ticks = [(float(t), steady(3)) for t in range(0, 400, 10)]
    decisions = run(policy, ticks)
    current = decisions[-1].desired
    for t in range(400, int(quiet_until), 5):
        waiting = 100 if t <= 450 else 0
        decision = decide(steady(current, runnable_depth=waiting), policy, decisions[-1].history, float(t))
        decisions.append(decision)
        current = decision.desired
    return {d.history.recommendations[-1].at: d for d in decisions}


def test_a_drained_backlog_is_held_for_two_minutes_then_only_what_keeping_up_takes():
    by_time = burst_then_quiet(policy(), 700.0)
    assert by_time[400.0].desired == 10  # depth 100 at 10 per worker
    # The backlog tick's record keeps the part that keeps up with 4 jobs/s: ceil(4 / (4 x 0.9)) = 2.
    assert by_time[400.0].history.recommendations[-1] == TimedCount(400.0, 10, 2)
    assert DRAINED_BACKLOG_HOLD == 120.0
    last_backlog = 450.0
    released_at = last_backlog + DRAINED_BACKLOG_HOLD
    held = [d for at, d in by_time.items() if last_backlog < at < released_at]
    assert len(held) == 23 and all(d.desired == 10 and d.reason == "ScaleDownStabilized" for d in held)
    # In one step (the default down limit), to the utilisation signal's 3 -- not the 10 the
    # backlog's recommendations would hold until t=750 if they still counted in full.
    assert by_time[released_at].desired == 3
    assert all(d.desired == 3 for at, d in by_time.items() if at >= released_at)


def test_while_jobs_wait_the_down_window_counts_every_recommendation_in_full():
    fresh = burst_then_quiet(policy(), 560.0)
    assert fresh[555.0].desired == 10  # 105 s after the last backlog tick
    small = decide(steady(10, runnable_depth=20), policy(), fresh[555.0].history, 560.0)
    assert small.desired == 10  # a small backlog: the burst's 10s still count in full
    assert small.reason == "ScaleDownStabilized"


def test_a_new_backlog_brings_the_full_window_back_but_never_scales_up_by_it():
    by_time = burst_then_quiet(policy(), 600.0)
    assert by_time[595.0].desired == 3
    # The burst's 10s are still inside the 300 s window and count in full again,
    # but a window only holds a pool: it never moves one up.
    again = decide(steady(3, runnable_depth=20), policy(), by_time[595.0].history, 600.0)
    assert again.desired == 3


def test_without_a_known_throughput_the_whole_recommendation_is_sustained():
    unknown = observe(2, runnable_depth=40, running=8, completion_rate=None, duration_p50=None, arrival_rate=4.0)
    decision = decide(unknown, policy(), None, 0.0)
    assert decision.history.recommendations[-1].sustained is None


def test_the_seed_and_recommendations_without_a_backlog_count_in_full():
    assert TimedCount(0.0, 8).after_drain == 8
    assert TimedCount(0.0, 8, 2).after_drain == 2
    assert TimedCount(0.0, 8, 9).after_drain == 8
    quiet = decide(steady(3), policy(), None, 0.0)
    assert [rec.sustained for rec in quiet.history.recommendations] == [None, None]


def test_the_down_view_never_touches_the_up_window():
    recs = (TimedCount(0.0, 5, 1), TimedCount(10.0, 8, 1))
    view = tuple(TimedCount(r.at, r.after_drain) for r in recs)
    behavior = Behavior(up_window=60.0, down_window=300.0)
    # Up: the min over the recorded counts (5), not over the view (1).
    assert stabilize(4, 9, recs, 20.0, behavior, view) == (5, "window up")
    # Down: the max over the view.
    assert stabilize(8, 2, recs, 20.0, behavior, view) == (2, None)
    assert stabilize(8, 2, recs, 20.0, behavior) == (8, "window down")


def test_the_default_down_limit_is_the_hpas():
    assert Behavior().down_limit == DEFAULT_DOWN_LIMIT == RateLimit(workers=0, percent=100.0, period=15.0)
    defaults = PoolPolicy(max_workers=100, targets=BY_DEPTH, behavior=Behavior(down_window=0.0))
    assert decide(wanting(2, 20), defaults, None, 0.0).desired == 2  # the window decides, in one step
