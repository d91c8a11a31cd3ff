"""Stage 4, smoothing: stabilisation windows and rate limits, with the HPA's semantics.

Windows.  Every tick's recommendation is recorded, including the ones that
ask for no change.  The up-recommendation is the MIN over the up window (grow
only when every tick in it agreed), the down-recommendation the MAX over the
down window (shrink only to what the whole window could live with).  A
recommendation also notes its sustained part (what keeping up with arrivals
takes, without draining the backlog of its instant); once that backlog is long
gone, the down window counts only that part (``decide.down_window_view``).  The
result is the current count moved toward them and never past it the wrong
way: a low tick inside the up window can hold a scale-up back but never turn
it into a scale-down.

Rate limits.  From the changes decided inside each limit's period, the count
at the period's start is recovered; the result may move from there by at most
the larger of ``workers`` and ``percent`` % (up) or shrink by the larger of
them (down).
"""

from __future__ import annotations

import math

from .config import Behavior, RateLimit
from .types import ScaleChange, TimedCount


def record(
    recommendations: tuple[TimedCount, ...], now: float, workers: int, keep: float, sustained: int | None = None
) -> tuple[TimedCount, ...]:
    """``recommendations`` plus this tick's, without those older than ``keep`` seconds.

    ``sustained``: the part of ``workers`` that keeps up with arrivals (None: all of it).
    """
    kept = tuple(rec for rec in recommendations if rec.at > now - keep)
    return kept + (TimedCount(now, workers, sustained),)


def stabilize(
    current: int,
    recommendation: int,
    recommendations: tuple[TimedCount, ...],
    now: float,
    behavior: Behavior,
    down_view: tuple[TimedCount, ...] | None = None,
) -> tuple[int, str | None]:
    """The count after the windows, and ``"window up"``/``"window down"`` when they changed it.

    ``recommendations`` are the earlier ones (this tick's is ``recommendation``).
    ``down_view``, when given, is what the down window takes its maximum over
    instead (the same ticks, possibly counted lower; see
    ``decide.down_window_view``).  A window of 0 s looks at this tick only.
    """
    earlier_down = recommendations if down_view is None else down_view
    up = min([recommendation] + [r.workers for r in recommendations if r.at > now - behavior.up_window])
    down_window = behavior.down_window or 0.0  # None (the break-even hold) is resolved by the caller
    down = max([recommendation] + [r.workers for r in earlier_down if r.at > now - down_window])
    stabilized = current
    if up > stabilized:
        stabilized = up
    if down < stabilized:
        stabilized = down
    if stabilized == recommendation:
        return stabilized, None
    return stabilized, "window up" if recommendation > current else "window down"


def changes_in_period(changes: tuple[ScaleChange, ...], now: float, period: float) -> tuple[int, int]:
    """Workers added and removed by the changes decided in the last ``period`` seconds."""
    inside = [c.change for c in changes if c.at > now - period]
    return sum(c for c in inside if c > 0), -sum(c for c in inside if c < 0)


def up_limit(current: int, changes: tuple[ScaleChange, ...], now: float, limit: RateLimit) -> int:
    """The most workers allowed now under ``limit`` (never below ``current``)."""
    added, removed = changes_in_period(changes, now, limit.period)
    start = current - added + removed
    allowed = max(start + limit.workers, math.ceil(start * (1 + limit.percent / 100)))
    return max(allowed, current)


def down_limit(current: int, changes: tuple[ScaleChange, ...], now: float, limit: RateLimit) -> int:
    """The fewest workers allowed now under ``limit`` (never above ``current``)."""
    added, removed = changes_in_period(changes, now, limit.period)
    start = current + removed - added
    allowed = min(start - limit.workers, math.floor(start * (1 - limit.percent / 100)))
    return min(max(allowed, 0), current)


def rate_limit(
    current: int, stabilized: int, changes: tuple[ScaleChange, ...], now: float, behavior: Behavior
) -> tuple[int, str | None]:
    """The count after the rate limits, and ``"rate up"``/``"rate down"`` when they changed it."""
    if stabilized > current and behavior.up_limit is not None:
        ceiling = up_limit(current, changes, now, behavior.up_limit)
        if stabilized > ceiling:
            return ceiling, "rate up"
    if stabilized < current and behavior.down_limit is not None:
        floor = down_limit(current, changes, now, behavior.down_limit)
        if stabilized < floor:
            return floor, "rate down"
    return stabilized, None


def record_change(
    changes: tuple[ScaleChange, ...], now: float, current: int, desired: int, behavior: Behavior,
    at_least: float = 0.0,
) -> tuple[ScaleChange, ...]:
    """``changes`` plus this decision's (if any), without those older than every period
    (and than ``at_least`` seconds)."""
    periods = [limit.period for limit in (behavior.up_limit, behavior.down_limit) if limit is not None]
    keep = max(periods + [at_least])
    kept = tuple(change for change in changes if change.at > now - keep)
    if desired != current:
        kept += (ScaleChange(now, desired - current),)
    return kept
