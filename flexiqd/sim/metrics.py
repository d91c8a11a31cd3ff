"""What a run is judged on, summarised from a finished simulation."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from .engine import Simulation


def percentile(ordered: list[float], q: float) -> float | None:
    """Nearest-rank percentile ``q`` (0..1) of an ascending list; None when empty."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def time_weighted_percentile(seconds_at: Mapping[float, float], q: float) -> float | None:
    """The value below which the run spent ``q`` of its time; None without samples."""
    total = sum(seconds_at.values())
    if total <= 0:
        return None
    reached = 0.0
    for value in sorted(seconds_at):
        reached += seconds_at[value]
        if reached >= q * total:
            return value
    return max(seconds_at)


@dataclass(frozen=True)
class TimelinePoint:
    """The pool at one sampling instant (for plots)."""

    at: float
    oldest_age: float
    workers: int
    dependency_utilisation: float | None


@dataclass(frozen=True)
class RunResult:
    """One policy on one trace.

    Waits are ages at start (a re-run of a killed job counts from its first
    run-at).  ``slo_seconds``: time the oldest runnable job was older than the
    age target.  ``worker_seconds``: booting, active and draining workers.
    ``inflation_*``: request-path latency over its unloaded latency
    (time-weighted), None without a dependency.  ``flaps``: direction changes
    within ``FLAP_WINDOW`` of the previous change.  The job counts at the end
    satisfy ``enqueued == completed + queued + running + requeue_pending + delayed``.
    """

    trace: str
    policy: str
    wait_p50: float
    wait_p95: float
    wait_max: float
    slo_seconds: float
    worker_seconds: float
    over_capacity_seconds: float
    inflation_p95: float | None
    inflation_mean: float | None
    scale_events: int
    flaps: int
    killed: int
    enqueued: int
    completed: int
    queued: int
    running: int
    requeue_pending: int
    delayed: int
    timeline: tuple[TimelinePoint, ...] = ()

    def as_dict(self, *, timeline: bool = False) -> dict[str, Any]:
        data = asdict(self)
        if not timeline:
            del data["timeline"]
        return data


def summarise(sim: "Simulation", policy: str, timeline: tuple[TimelinePoint, ...]) -> RunResult:
    """The ``RunResult`` of a simulation that has run to its end."""
    waits = sorted(sim.waits)
    seconds = sum(sim.inflation.values())
    mean = sum(factor * span for factor, span in sim.inflation.items()) / seconds if seconds else None
    delayed = sim.delayed()
    return RunResult(
        trace=sim.trace.name,
        policy=policy,
        wait_p50=percentile(waits, 0.50) or 0.0,
        wait_p95=percentile(waits, 0.95) or 0.0,
        wait_max=waits[-1] if waits else 0.0,
        slo_seconds=sim.slo_seconds,
        worker_seconds=sim.worker_seconds,
        over_capacity_seconds=sim.over_capacity_seconds,
        inflation_p95=time_weighted_percentile(sim.inflation, 0.95) if sim.trace.dependency else None,
        inflation_mean=mean if sim.trace.dependency else None,
        scale_events=sim.scale_events,
        flaps=sim.flaps,
        killed=sim.killed,
        enqueued=sim.next_enqueue,
        completed=sim.completed,
        queued=len(sim.queue),
        running=len(sim.running),
        requeue_pending=sim.requeue_pending,
        delayed=delayed,
        timeline=timeline,
    )
