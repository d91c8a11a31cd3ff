"""What a run is judged on, summarised from a finished simulation; and the queue's
statistics as the job store computes them, for the simulated queue.

The store's definitions (``flexiqd.queue.sqlite.database``), shared so that the policy
sees in the simulator what it sees in the daemon:

- rates count events in one-second buckets (the second an event happened,
  truncated) and take the buckets *after* ``now - window``, over ``window``
  (60 s, the daemon's) whatever the time since the start;
- a job *arrives* when it becomes runnable -- at enqueue, or at its run-at if
  it was enqueued delayed -- once: a killed or released job queued again does
  not arrive again;
- duration percentiles are nearest-rank (the store's ``percentile``) over the
  ``DURATION_SAMPLE`` most recent completions no older than
  ``max(window, DURATION_HORIZON)``; the recent p50 over those of them that
  finished in the last ``RECENT_WINDOW`` seconds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Mapping

# The store's own function and bounds, not copies: a change there changes the simulator too.
from ..queue.store.figures import DURATION_HORIZON, DURATION_SAMPLE, percentile
from ..queue.types import RECENT_WINDOW

if TYPE_CHECKING:
    from .engine import Simulation

__all__ = ["DURATION_HORIZON", "DURATION_SAMPLE", "RECENT_WINDOW", "EventCounter", "RecentDurations", "percentile"]


class EventCounter:
    """Events counted per second, as the store's ``rates`` table counts them.

    ``add`` must be called in time order (a simulation's clock only advances).
    """

    __slots__ = ("buckets",)

    def __init__(self, buckets: deque[list[float]] | None = None) -> None:
        self.buckets: deque[list[float]] = buckets if buckets is not None else deque()  # [second, count]

    def add(self, at: float, count: int = 1) -> None:
        second = int(at)
        if self.buckets and self.buckets[-1][0] == second:
            self.buckets[-1][1] += count
        else:
            self.buckets.append([second, count])

    def count(self, now: float, window: float) -> int:
        """Events in the buckets after ``now - window`` (older buckets are dropped)."""
        buckets = self.buckets
        while buckets and not buckets[0][0] > now - window:
            buckets.popleft()
        return int(sum(bucket[1] for bucket in buckets))

    def series(self, now: float, window: float) -> tuple[tuple[int, int], ...]:
        """(second, events) of the buckets after ``now - window``, oldest first (as the store's
        ``completion_series``)."""
        return tuple((int(second), int(count)) for second, count in self.buckets
                     if second > now - window and count)

    def copy(self) -> "EventCounter":
        return EventCounter(deque([list(bucket) for bucket in self.buckets]))


class RecentDurations:
    """The most recent completions' durations, the sample the store's percentiles come from."""

    __slots__ = ("finished",)

    def __init__(self, finished: deque[tuple[float, float]] | None = None) -> None:
        self.finished: deque[tuple[float, float]] = (
            finished if finished is not None else deque(maxlen=DURATION_SAMPLE))  # (finished_at, duration)

    def add(self, finished_at: float, duration: float) -> None:
        self.finished.append((finished_at, duration))

    def sample(self, now: float, window: float) -> list[float]:
        """Ascending durations of the completions at or after ``now - max(window, DURATION_HORIZON)``."""
        horizon = now - max(window, DURATION_HORIZON)
        finished = self.finished
        while finished and finished[0][0] < horizon:
            finished.popleft()
        return sorted(duration for _, duration in finished)

    def recent(self, now: float) -> list[float]:
        """Ascending durations of the sample's completions in the last ``RECENT_WINDOW`` seconds."""
        return sorted(duration for at, duration in self.finished if at >= now - RECENT_WINDOW)

    def copy(self) -> "RecentDurations":
        return RecentDurations(deque(self.finished, maxlen=self.finished.maxlen))


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
    ``completion_p95``: the p95 of the jobs' time from runnable to done (what a
    waiting user sees: a job claimed by a worker that cannot make progress waits on, where
    the age of the oldest runnable job no longer shows it); a job not done when the run ends
    counts with the time it has been runnable, so a policy that starts long jobs late is not
    judged on the quick ones alone.
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
    completion_p95: float = 0.0

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
        completion_p95=percentile(sorted(sim.turnarounds + sim.unfinished_times()), 0.95) or 0.0,
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
