"""True counters read from the store: monotonic while the daemon lives.

The store keeps every ended attempt (``Backend.ended_attempts``, read by cursor)
and arrivals per second (``Backend.arrivals_since``).  ``Counters`` turns both
into totals that only grow: attempts are counted once each by their id, and a
second's arrivals by how much its count grew since the last read -- a delayed
job arrives in the second of its run_at, which may be a second already read.

Everything starts at zero when the daemon starts (Prometheus handles the reset).
Not thread-safe: the daemon's I/O thread alone calls ``read``; ``frozen`` gives
the copy a snapshot holds.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Iterable, Mapping

from ..queue.store.backend import Backend, EndedAttempt

# Job durations: from tens of milliseconds to eight hours.
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                    600.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0)
# Arrivals are re-read this far back: a delayed job promoted later than this after its run_at
# (no claim nor stats read of any queue for five minutes) is not counted.
ARRIVALS_LOOKBACK = 300
# Ended attempts read per tick at most; a larger backlog is caught up over the next ticks.
ATTEMPTS_PER_READ = 10_000


@dataclasses.dataclass
class Histogram:
    """Counts per bucket (not cumulative; the last is +Inf), their sum and count."""

    bounds: tuple[float, ...] = DURATION_BUCKETS
    buckets: list[int] = dataclasses.field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.buckets:
            self.buckets = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.buckets[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def copy(self) -> "Histogram":
        return Histogram(self.bounds, list(self.buckets), self.total, self.count)

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, count)`` pairs as Prometheus wants them, ``+Inf`` last."""
        running, pairs = 0, []
        for bound, n in zip((*map(_bound, self.bounds), "+Inf"), self.buckets):
            running += n
            pairs.append((bound, running))
        return pairs


def _bound(value: float) -> str:
    return repr(float(value))


@dataclasses.dataclass
class QueueTally:
    """One queue's counters.  ``failures`` counts failed attempts, lost ones included."""

    arrivals: int = 0
    completions: int = 0
    failures: int = 0
    dead_letters: int = 0
    releases: int = 0
    crash_reruns: int = 0
    durations: dict[str, Histogram] = dataclasses.field(default_factory=dict)  # per task


def count_attempts(tallies: dict[str, QueueTally], attempts: Iterable[EndedAttempt]) -> None:
    """Add ended attempts to the queues' tallies (pure but for the mutation)."""
    for attempt in attempts:
        tally = tallies.setdefault(attempt.queue, QueueTally())
        if attempt.outcome == "ack":
            tally.completions += 1
            if attempt.seconds is not None:
                tally.durations.setdefault(attempt.task, Histogram()).observe(max(0.0, attempt.seconds))
        elif attempt.outcome == "release":
            tally.releases += 1
        else:  # fail, dead, lost
            tally.failures += 1
            if attempt.outcome == "lost" and not attempt.dead_lettered:
                tally.crash_reruns += 1  # runnable again: it runs a second time
        if attempt.dead_lettered:
            tally.dead_letters += 1


def grown_arrivals(seen: dict[int, int], read: Mapping[int, int], oldest: int) -> tuple[int, dict[int, int]]:
    """How many arrivals ``read`` adds to ``seen`` (per second), and the seconds to keep seeing."""
    added = sum(max(0, n - seen.get(second, 0)) for second, n in read.items())
    kept = {second: max(n, seen.get(second, 0)) for second, n in read.items() if second >= oldest}
    return added, kept


class Counters:
    """The counters of the queues the daemon serves; see the module docstring."""

    def __init__(self) -> None:
        self.tallies: dict[str, QueueTally] = {}
        self._cursor: int | None = None
        self._arrivals_seen: dict[str, dict[int, int]] = {}

    def read(self, backend: Backend, queues: Iterable[str], now: float) -> None:
        """Catch up with the store (raises ``QueueError``; a failed read is retried next time)."""
        cursor, attempts = backend.ended_attempts(self._cursor, limit=ATTEMPTS_PER_READ)
        if self._cursor is not None:
            count_attempts(self.tallies, attempts)
        self._cursor = cursor
        oldest = int(now) - ARRIVALS_LOOKBACK
        for queue in queues:
            tally = self.tallies.setdefault(queue, QueueTally())
            read = backend.arrivals_since(queue, oldest)
            first = queue not in self._arrivals_seen
            added, self._arrivals_seen[queue] = grown_arrivals(self._arrivals_seen.get(queue, {}), read, oldest)
            if not first:  # the first read is the baseline: counters start at zero
                tally.arrivals += added

    def frozen(self) -> dict[str, QueueTally]:
        """A deep copy, for a snapshot that must not change after it is published."""
        return {queue: dataclasses.replace(
                    tally, durations={task: h.copy() for task, h in tally.durations.items()})
                for queue, tally in self.tallies.items()}
