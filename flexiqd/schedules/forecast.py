"""What the next firing of a pool's schedules will bring, from the firings measured before it.

For the policy to start workers before a schedule fires: per pool, the next fire
of the schedules whose queue it serves, and the measured size of their past
firings -- the jobs each put in the queue and their total run time.  The
controller counts a firing due within the lead time as jobs coming due.

A firing enqueues one job per slot; a task that fans out (enqueues more jobs into
the queue) brings more.  ``jobs`` is what the queue's arrivals rose by in the
``FAN_OUT_WINDOW`` after the slot, against the same span before it (``fan_out``;
at least the slot's own job); arrivals are kept an hour, so older firings count
their own job alone.  ``seconds`` is the sum of the slot's own job's run time,
known once it finished.

Pure: no clock reads, no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

# The past firings a size is the mean of (the newest ones).
SAMPLE = 10

# A firing's jobs are those its queue's arrivals rose by within this many seconds of its slot.
FAN_OUT_WINDOW = 60


@dataclasses.dataclass(frozen=True)
class Firing:
    """One past firing of a schedule: its slot ``at``, the jobs it enqueued, and their total run
    time in seconds (None until every one has finished)."""

    at: float
    jobs: int
    seconds: float | None


@dataclasses.dataclass(frozen=True)
class Forecast:
    """A pool's next firing: which schedule, when (``at``), and the mean size of its last
    ``samples`` measured firings (``jobs``; ``seconds`` None when none has finished)."""

    pool: str
    schedule: str
    at: float
    jobs: float
    seconds: float | None
    samples: int


def size(firings: Sequence[Firing], sample: int = SAMPLE) -> tuple[float, float | None, int]:
    """(mean jobs, mean total seconds, firings measured) of the newest ``sample`` firings; a firing
    still running counts for its jobs, not for the seconds."""
    newest = sorted(firings, key=lambda f: f.at)[-sample:]
    if not newest:
        return 0.0, None, 0
    timed = [f.seconds for f in newest if f.seconds is not None]
    return (sum(f.jobs for f in newest) / len(newest), sum(timed) / len(timed) if timed else None, len(newest))


def pool_forecasts(pool_queues: Mapping[str, Sequence[str]], upcoming: Mapping[str, tuple[str, float | None]],
                   history: Mapping[str, Sequence[Firing]]) -> dict[str, Forecast]:
    """Per pool, the first next fire among the schedules whose queue it serves, with that
    schedule's measured size.  ``upcoming``: schedule -> (queue, next fire or None);
    ``history``: schedule -> its past firings.  Pools no schedule feeds are left out."""
    forecasts = {}
    for pool, queues in sorted(pool_queues.items()):
        candidates = [(at, name) for name, (queue, at) in upcoming.items() if queue in queues and at is not None]
        if not candidates:
            continue
        at, name = min(candidates)
        jobs, seconds, samples = size(history.get(name, ()))
        forecasts[pool] = Forecast(pool=pool, schedule=name, at=at, jobs=jobs, seconds=seconds, samples=samples)
    return forecasts


def fan_out(arrivals: Mapping[int, int], slot: float, window: int = FAN_OUT_WINDOW) -> int:
    """The jobs a firing at ``slot`` brought to its queue: the arrivals (per epoch second) in the
    ``window`` seconds from the slot's second, less those of the same span before it."""
    start = int(slot)
    after = sum(arrivals.get(second, 0) for second in range(start, start + window))
    before = sum(arrivals.get(second, 0) for second in range(start - window, start))
    return max(0, after - before)


def firings_from(rows: Sequence[tuple[float, int | None, float | None, float | None]],
                 jobs: Mapping[float, int] | None = None) -> list[Firing]:
    """Firings from (slot, job id, the job's started_at, finished_at) of fired ledger rows: a job not
    finished (or deleted since: no times) is a firing with no time yet.  ``jobs``: per slot, the
    jobs measured (``fan_out``); a slot not in it brought its own job alone."""
    found = []
    for at, job_id, started, finished in rows:
        if job_id is None:
            continue
        seconds = finished - started if started is not None and finished is not None else None
        found.append(Firing(at=at, jobs=max(1, (jobs or {}).get(at, 1)), seconds=seconds))
    return found


def jobs_coming_due(forecast: Forecast | None, now: float, within: float) -> int:
    """The jobs a pool's next firing brings within ``within`` seconds of ``now`` (the lead time:
    what a worker started now would be ready for), as whole jobs; 0 when it fires later or has
    fired (its jobs are then in the queue)."""
    if forecast is None or not now < forecast.at <= now + within:
        return 0
    return math.ceil(forecast.jobs)
