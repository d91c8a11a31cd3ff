"""Stabilisation windows, tolerance, overload, rate limits, and a failed metrics read."""

from __future__ import annotations

from flexiqd.policy import Behavior, History, PoolPolicy, RateLimit, Targets, compute_desired_workers, decide
from flexiqd.policy.smoothing import stabilize
from flexiqd.policy.types import TimedCount

from test_policy_support import observe, run

NO_LIMITS = dict(up_limit=None, down_limit=None)


# The depth signal answers at once (no averaging), which makes each tick's wish exact.
BY_DEPTH = Targets(depth_per_worker=10)


def wanting(workers: int, current: int):
    """An observation whose signals ask for exactly ``workers`` (10 runnable jobs per worker)."""
    return observe(current, runnable_depth=workers * 10, running=1, completion_rate=1.0)


def policy(**behavior) -> PoolPolicy:
    behavior = {**NO_LIMITS, **behavior}
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
