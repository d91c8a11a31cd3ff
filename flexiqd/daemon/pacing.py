"""When the control loop decides: every ``tick`` seconds, and sooner when something happened.

The tick is for the signals that need time (rates, averages) and the fallback; what a
decision must answer at once wakes it: new work committed to a pool's queue (the
store's wake-up, ``Backend.subscribe``), a delayed job coming due, a worker unit that
changed state; and, while a pool's growth waits for workers still stopping and no unit
change will say when they have exited (the process fleet), a look every ``STOPPING_GAP``.
Wake-ups are rate-bounded, so a stream of commits or unit changes
costs a few decisions a second, not one each.  Pure: times are given, in seconds of
one clock.
"""

from __future__ import annotations

import math

# After a wake-up from a worker unit's change (or a reload), decide at most this soon
# after the last decision.
UNIT_CHANGE_GAP = 0.2
# New work is decided on at once, then at most once per this many seconds while it
# keeps coming (the decisions in between would see the same burst half-committed); and
# decided on again this long after, whatever comes: the first look sees a burst before
# the running workers took their share, when whether they are enough is not known yet.
NEW_WORK_GAP = 0.2
# While a pool's growth waits for stopping workers to exit, decide again this soon after the
# last decision when nothing reports their exit (an idle worker takes about 0.3 s to exit).
STOPPING_GAP = 0.25
# A delayed job coming due is decided on at its run-at, but never sooner than this
# after the last decision (retries backing off come due in a scatter).
COMING_DUE_GAP = 0.2


def next_tick(last_tick: float, tick: float, due_at: float | None, follow_up: float | None = None) -> float:
    """When the next decision is due with nothing waking the loop: a ``tick`` after the last,
    or sooner when the next delayed job comes due or new work asked for a ``follow_up``."""
    at = last_tick + tick
    if due_at is not None:
        at = min(at, max(due_at, last_tick + COMING_DUE_GAP))
    if follow_up is not None:
        at = min(at, follow_up)
    return at


def stopping_follow_up(last_tick: float, follow_up: float | None) -> float:
    """``follow_up`` brought forward to a look at the stopping workers ``STOPPING_GAP`` after the last tick."""
    at = last_tick + STOPPING_GAP
    return at if follow_up is None else min(follow_up, at)


def after_new_work(now: float, last_new_work_tick: float) -> tuple[float, float]:
    """When to decide after new work woke the loop at ``now``, and when to decide again."""
    at = max(now, last_new_work_tick + NEW_WORK_GAP)
    return at, at + NEW_WORK_GAP


def after_unit_change(now: float, last_tick: float) -> float:
    """When to decide after a worker unit changed state at ``now``."""
    return max(now, last_tick + UNIT_CHANGE_GAP)


def due_at(next_due: float | None, store_now: float, clock_now: float) -> float | None:
    """``next_due`` (a run-at, in the store's time: ``Backend.clock``, read as ``store_now``) on
    the loop's clock; None when nothing is delayed or it is due already (the decision just
    made saw it)."""
    if next_due is None or not math.isfinite(next_due) or next_due <= store_now:
        return None
    return clock_now + (next_due - store_now)
