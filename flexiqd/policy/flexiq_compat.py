"""The flexiq autoscaler's decision, as a compatibility mode.

``compute_desired_workers`` reproduces flexiq 2.1's formula and rationale
strings exactly -- including applying the tolerance after the min/max clamp
and counting every "pending" job the caller passes, so pass runnable jobs
only if its delayed-jobs defect is not wanted.  ``compute_desired_workers_windowed``
adds flexiq's documented stabilisation windows, done as the HPA does them
(clamped toward the current count, down window seeded at the first call),
which flexiq itself does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .config import Behavior
from .errors import PolicyConfigError
from .smoothing import record, stabilize
from .types import TimedCount
from .validation import require_int, require_number


@dataclass(frozen=True)
class FlexiqResult:
    """flexiq's answer: the worker count and its rationale string."""

    desired_workers: int
    rationale: str


def compute_desired_workers(
    pending: int,
    running: int,
    current_workers: int,
    *,
    min_workers: int = 1,
    max_workers: int = 10,
    target_queue_depth_per_worker: float = 15,
    target_utilisation: float = 0.75,
    concurrency_per_worker: int = 4,
    tolerance: float = 0.1,
) -> FlexiqResult:
    """flexiq's desired worker count for one poll; raises ``PolicyConfigError`` on invalid options."""
    require_int("pending", pending, minimum=0)
    require_int("running", running, minimum=0)
    require_int("current_workers", current_workers)
    require_int("min_workers", min_workers, minimum=0)
    require_int("max_workers", max_workers, minimum=0)
    if max_workers < min_workers:
        raise PolicyConfigError("max_workers", f"must be >= min_workers ({min_workers}), got {max_workers}")
    require_number("target_queue_depth_per_worker", target_queue_depth_per_worker, low=0, low_open=True)
    require_number("target_utilisation", target_utilisation, low=0, high=1, low_open=True, high_open=True)
    require_int("concurrency_per_worker", concurrency_per_worker, minimum=1)
    require_number("tolerance", tolerance, low=0, high=1, high_open=True)

    # The formula, line for line as flexiq computes it.
    workers = max(0, current_workers)
    capacity = max(1, workers * concurrency_per_worker)
    depth = math.ceil(pending / target_queue_depth_per_worker)
    utilisation = running / capacity
    util = math.ceil(workers * utilisation / target_utilisation) if workers > 0 and utilisation > 0 else 0
    overloaded = workers > 0 and running > capacity
    desired = max(depth, util, min_workers)
    if overloaded:
        desired = max(desired, workers + 1)
    desired = min(max(desired, min_workers), max_workers)
    if workers > 0 and not overloaded and abs(desired - workers) / workers < tolerance:
        desired = workers

    if desired > workers:
        rationale = f"scale-up: depth={depth} util={util} overload={'true' if overloaded else 'false'}"
    elif desired < workers:
        rationale = f"scale-down: depth={depth} util={util}"
    else:
        rationale = f"stable: depth={depth} util={util} utilRatio={utilisation:.2f}"
    return FlexiqResult(desired, rationale)


@dataclass(frozen=True)
class FlexiqWindowHistory:
    """The windowed variant's memory: pass the one returned to the next call."""

    seeded: bool = False
    recommendations: tuple[TimedCount, ...] = ()


@dataclass(frozen=True)
class WindowedResult:
    desired_workers: int
    rationale: str
    history: FlexiqWindowHistory


def compute_desired_workers_windowed(
    pending: int,
    running: int,
    current_workers: int,
    *,
    now: float,
    history: FlexiqWindowHistory | None = None,
    scale_up_window: float = 0.0,
    scale_down_window: float = 300.0,
    **options: object,
) -> WindowedResult:
    """flexiq's decision through its stabilisation windows, with the HPA's clamping.

    ``options`` are ``compute_desired_workers``'s.  Every call's raw result is
    recorded; the first call also records the current count, so the first
    scale-down waits for a whole down window.  When the windows change the
    result, `` (windowed -> N)`` is appended to the rationale, as flexiq does.
    """
    raw = compute_desired_workers(pending, running, current_workers, **options)  # type: ignore[arg-type]
    behavior = Behavior(up_window=scale_up_window, down_window=scale_down_window, up_limit=None, down_limit=None)
    history = history or FlexiqWindowHistory()
    workers = max(0, current_workers)
    earlier = history.recommendations if history.seeded else record((), now, workers, 0.0)
    stabilized, _ = stabilize(workers, raw.desired_workers, earlier, now, behavior)
    keep = max(scale_up_window, scale_down_window)
    new_history = FlexiqWindowHistory(seeded=True, recommendations=record(earlier, now, raw.desired_workers, keep))
    rationale = raw.rationale
    if stabilized != raw.desired_workers:
        rationale += f" (windowed -> {stabilized})"
    return WindowedResult(stabilized, rationale, new_history)
