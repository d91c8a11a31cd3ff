"""The flexiq autoscaler's decision, as a compatibility mode.

``compute_desired_workers`` reproduces flexiq 2.1's formula and rationale
strings exactly, as its Python package writes them (``overload=True``,
``util_ratio=0.75``) -- including applying the tolerance after the min/max
clamp and counting every "pending" job the caller passes, so pass runnable
jobs only if its delayed-jobs defect is not wanted.

``decide_flexiq`` adds flexiq's documented stabilisation windows, done as the
HPA does them (clamped toward the current count, down window seeded at the
first call), which flexiq itself does not, in the policy's own terms
(``Observation`` and ``History`` in, ``Decision`` out), so a daemon sees one
shape whichever policy a pool runs; ``flexiq_log_line`` is flexiq's decision
log line for it, byte for byte (``LOG_FORMAT``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from ..settings_schema import default
from .config import Behavior, PoolPolicy
from .errors import PolicyConfigError
from .smoothing import record, stabilize
from .types import CapValue, Decision, History, Observation, SignalRecommendation, TimedCount
from .validation import require_int, require_number

# flexiq 2.1's decision log line (AutoscaleController.serve_forever), %-style:
# pending, running, current workers, desired workers, rationale.
LOG_FORMAT = "autoscale: pending=%s running=%s workers=%s -> %s (%s)"


@dataclass(frozen=True)
class FlexiqResult:
    """flexiq's answer: the worker count and its rationale string (and the two signals in it)."""

    desired_workers: int
    rationale: str
    depth: int = 0
    util: int = 0


def compute_desired_workers(
    pending: int,
    running: int,
    current_workers: int,
    *,
    min_workers: int = default("pools.<pool>.min_workers"),
    max_workers: int = default("pools.<pool>.max_workers"),
    target_queue_depth_per_worker: float = default("pools.<pool>.flexiq.target_queue_depth_per_worker"),
    target_utilisation: float = default("pools.<pool>.flexiq.target_utilisation"),
    concurrency_per_worker: int = default("pools.<pool>.concurrency"),
    tolerance: float = default("pools.<pool>.flexiq.tolerance"),
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

    # Python's spelling, as flexiq's Python package formats it: overload=True, util_ratio.
    if desired > workers:
        rationale = f"scale-up: depth={depth} util={util} overload={overloaded}"
    elif desired < workers:
        rationale = f"scale-down: depth={depth} util={util}"
    else:
        rationale = f"stable: depth={depth} util={util} util_ratio={utilisation:.2f}"
    return FlexiqResult(desired, rationale, depth, util)


def _windows(raw: int, workers: int, seeded: bool, earlier: tuple[TimedCount, ...], now: float,
             up_window: float, down_window: float) -> tuple[int, str | None, tuple[TimedCount, ...]]:
    """The count after the windows, which window changed it, and the recommendations to keep.

    An unseeded history first records the current count, so the first
    scale-down waits a whole down window.
    """
    behavior = Behavior(up_window=up_window, down_window=down_window, up_limit=None, down_limit=None)
    if not seeded:
        earlier = record((), now, workers, 0.0)
    stabilized, window = stabilize(workers, raw, earlier, now, behavior)
    return stabilized, window, record(earlier, now, raw, max(up_window, down_window))


def _windowed_rationale(raw: FlexiqResult, stabilized: int) -> str:
    """flexiq's rationale, with its suffix when the windows changed the count."""
    if stabilized == raw.desired_workers:
        return raw.rationale
    return f"{raw.rationale} (windowed -> {stabilized})"


class FlexiqOptions(Protocol):
    """A pool's flexiq options, as ``flexiqd.config.FlexiqOptions`` holds them."""

    target_queue_depth_per_worker: float
    target_utilisation: float
    tolerance: float
    scale_up_window: float
    scale_down_window: float


# The reason tokens of a flexiq decision (stable: logs, events and tests use them).
SCALE_UP, SCALE_DOWN, STABLE, HOLD = "ScaleUp", "ScaleDown", "Stable", "HoldMetricsUnavailable"


def decide_flexiq(observation: Observation, policy: PoolPolicy, options: FlexiqOptions,
                  history: History | None, now: float) -> Decision:
    """flexiq's formula and windows for one pool, as a ``Decision``; pure.

    Without flexiq's defects: "pending" is the runnable depth only (delayed
    jobs need no worker yet), a failed metrics read (``metrics`` None) holds
    the pool, the windows clamp toward the current count and are seeded at
    the first decision.  ``current`` is active plus starting workers (a
    draining one is leaving).  ``message`` is flexiq's rationale, byte for
    byte; ``recommendations`` its two signals, ``depth`` and ``utilisation``;
    ``history`` keeps ``seeded`` and ``recommendations`` only.  Raises
    ``PolicyConfigError`` on invalid options.
    """
    history = history or History()
    current = observation.current
    caps = (CapValue("max", policy.max_workers),)
    metrics = observation.metrics
    if metrics is None:
        return Decision(pool=observation.pool, current=current, desired=current, raw_desired=current,
                        capped=current, stabilized=current, reason=HOLD,
                        message="stable: metrics unavailable, holding", recommendations=(), winner=None,
                        caps=caps, binding_cap=None, smoothing=(), history=history)
    raw = compute_desired_workers(
        metrics.runnable_depth, metrics.running, current, min_workers=policy.min_workers,
        max_workers=policy.max_workers, target_queue_depth_per_worker=options.target_queue_depth_per_worker,
        target_utilisation=options.target_utilisation, concurrency_per_worker=observation.concurrency,
        tolerance=options.tolerance)
    stabilized, window, recommendations = _windows(
        raw.desired_workers, current, history.seeded, history.recommendations, now,
        options.scale_up_window, options.scale_down_window)
    signals = (SignalRecommendation("depth", raw.depth, f"{metrics.runnable_depth} runnable jobs, "
                                    f"{options.target_queue_depth_per_worker:g} per worker"),
               SignalRecommendation("utilisation", raw.util, f"{metrics.running} running on "
                                    f"{max(1, current * observation.concurrency)} slots, target "
                                    f"{options.target_utilisation:g}"))
    winner = max(signals, key=lambda signal: signal.workers).signal if raw.depth or raw.util else None
    binding = caps[0] if stabilized == policy.max_workers and max(raw.depth, raw.util) > policy.max_workers else None
    reason = SCALE_UP if stabilized > current else SCALE_DOWN if stabilized < current else STABLE
    return Decision(pool=observation.pool, current=current, desired=stabilized, raw_desired=max(raw.depth, raw.util),
                    capped=raw.desired_workers, stabilized=stabilized, reason=reason,
                    message=_windowed_rationale(raw, stabilized), recommendations=signals, winner=winner,
                    caps=caps, binding_cap=binding, smoothing=(window,) if window else (),
                    history=History(seeded=True, recommendations=recommendations, changes=history.changes,
                                    load=history.load, knee=history.knee))


def flexiq_log_line(observation: Observation, decision: Decision) -> str:
    """flexiq's log line for ``decision`` (made by ``decide_flexiq`` from ``observation``).

    ``autoscale: pending=P running=R workers=C -> D (rationale)``, as flexiq
    2.1 writes it.  With no metrics, pending and running show as ``?``.
    """
    metrics = observation.metrics
    pending = "?" if metrics is None else metrics.runnable_depth
    running = "?" if metrics is None else metrics.running
    return LOG_FORMAT % (pending, running, decision.current, decision.desired, decision.message)
