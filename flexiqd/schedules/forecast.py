"""What the next firing of a pool's schedules will bring, from the firings measured before it.

For the policy to start workers before a schedule fires (issue 25, item 5): per pool,
the next fire of the schedules whose queue it serves, and the measured size of
their past firings -- the jobs each put in the queue and their total run time.
Not wired into the policy yet: ``pool_forecasts`` is what it would take as input.

A firing enqueues one job per slot; a task that fans out (enqueues more jobs) is
not followed, so ``jobs`` counts the slot's own job.  ``seconds`` is the sum of its
jobs' run times, known once they finished.

Pure: no clock reads, no I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

# The past firings a size is the mean of (the newest ones).
SAMPLE = 10


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


def firings_from(rows: Sequence[tuple[float, int | None, float | None, float | None]]) -> list[Firing]:
    """Firings from (slot, job id, the job's started_at, finished_at) of fired ledger rows: a job not
    finished (or deleted since: no times) is a firing of one job with no time yet."""
    found = []
    for at, job_id, started, finished in rows:
        if job_id is None:
            continue
        seconds = finished - started if started is not None and finished is not None else None
        found.append(Firing(at=at, jobs=1, seconds=seconds))
    return found
