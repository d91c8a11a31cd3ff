"""What starting a worker costs each pool, measured: from the decision to start it to its first claim.

A worker is measured when this daemon started it while its pool had runnable
jobs (so it had work to claim the moment it was ready): the cost runs from the
start decision to the earliest ``started_at`` of its lease owner in the store
(``Backend.first_claims``).  systemd's own timestamps of the unit (inactive-exit
to active-enter, which is ``READY=1`` for a ``Type=notify`` worker) give the part
of it spent starting the unit.  Each pool keeps its last ``KEEP`` samples; its
estimate is their median, so one slow start (a cold page cache, a busy host)
does not move it.  A worker that has not claimed within ``GIVE_UP`` seconds is
not measured: its pool's work was done by others before it was ready.

Workers asked for together are one sample: the first of them to claim.  The
estimate is what one start costs (what an idle worker given back costs to get
again); twenty units starting at once on a small host wait for each other, and
counting each of them would make one start look as dear as twenty.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import statistics
from typing import Iterable, Mapping

from ..fleet.base import WorkerInfo, WorkerState
from ..queue.owners import owner_name

log = logging.getLogger(__name__)

KEEP = 9
GIVE_UP = 120.0


@dataclasses.dataclass(frozen=True)
class StartCost:
    """A pool's start cost: the median over its last ``samples`` starts, in seconds.

    ``seconds``: start decision to first claim; ``ready``: the unit's own start
    (inactive-exit to active-enter), None when the fleet does not report it.
    """

    seconds: float
    ready: float | None
    samples: int

    def as_dict(self) -> dict:
        return {"seconds": self.seconds, "ready": self.ready, "samples": self.samples}


@dataclasses.dataclass
class _Expected:
    pool: str
    decided_at: float
    batch: int      # workers asked for by one decision share a batch


class StartCosts:
    """Per pool, the start costs of the workers it started for waiting work.  Not thread-safe."""

    def __init__(self, keep: int = KEEP, give_up: float = GIVE_UP) -> None:
        self.keep = keep
        self.give_up = give_up
        self._expected: dict[str, _Expected] = {}          # instance -> when it was decided
        self._samples: dict[str, collections.deque] = {}   # pool -> (seconds, ready)
        self._batches = 0

    def started(self, pool: str, instances: Iterable[str], now: float) -> None:
        """This daemon just asked for these workers of ``pool``, which has runnable jobs."""
        self._batches += 1
        for instance in instances:
            self._expected[instance] = _Expected(pool, now, self._batches)

    def waiting(self, workers: Iterable[WorkerInfo], host: str, now: float) -> dict[str, WorkerInfo]:
        """Lease owner name -> worker, for the ready workers whose first claim is still to be read.

        Forgets workers that are gone or that waited past ``give_up``.
        """
        present = {w.instance: w for w in workers}
        owners = {}
        for instance, expected in list(self._expected.items()):
            worker = present.get(instance)
            if worker is None or now - expected.decided_at > self.give_up:
                del self._expected[instance]
            elif worker.state is WorkerState.ACTIVE and worker.pid:
                owners[owner_name(instance, worker.pid, host)] = worker
        return owners

    def claimed(self, first_claims: Mapping[str, float], owners: Mapping[str, WorkerInfo]) -> None:
        """Record the workers whose first claim the store now shows: per batch, the first to claim."""
        for owner, at in sorted(first_claims.items(), key=lambda item: item[1]):
            worker = owners.get(owner)
            expected = self._expected.pop(worker.instance, None) if worker is not None else None
            if expected is None:
                continue
            # The rest of its batch is not measured: they started together with this one.
            self._expected = {i: e for i, e in self._expected.items() if e.batch != expected.batch}
            seconds = at - expected.decided_at
            if 0 <= seconds <= self.give_up:
                self.record(expected.pool, seconds, worker.ready_after)
                detail = ""
                if worker.ready_after is not None and worker.started_at is not None:
                    detail = (f" (the unit started in {worker.ready_after:.2f}s, and claimed "
                              f"{at - worker.started_at:.2f}s after systemd saw it ready)")
                log.info("Worker %s claimed its first job %.2fs after the decision to start it%s.",
                         worker.instance, seconds, detail)

    def record(self, pool: str, seconds: float, ready: float | None) -> None:
        self._samples.setdefault(pool, collections.deque(maxlen=self.keep)).append((seconds, ready))

    def estimate(self, pool: str) -> StartCost | None:
        samples = self._samples.get(pool)
        if not samples:
            return None
        readies = [ready for _, ready in samples if ready is not None]
        return StartCost(seconds=statistics.median(seconds for seconds, _ in samples),
                         ready=statistics.median(readies) if readies else None, samples=len(samples))

    def forget_pools(self, keep: Iterable[str]) -> None:
        keep = set(keep)
        self._samples = {pool: s for pool, s in self._samples.items() if pool in keep}
        self._expected = {i: e for i, e in self._expected.items() if e.pool in keep}

    # -- kept across restarts, with the histories -------------------------------------------------

    def to_dict(self) -> dict[str, list]:
        return {pool: [list(sample) for sample in samples] for pool, samples in sorted(self._samples.items())}

    def load(self, data: object) -> None:
        """Samples kept by a previous daemon; anything malformed is skipped."""
        if not isinstance(data, dict):
            return
        for pool, samples in data.items():
            if not isinstance(samples, list):
                continue
            for sample in samples[-self.keep:]:
                if (isinstance(sample, list) and len(sample) == 2 and _number(sample[0])
                        and (sample[1] is None or _number(sample[1]))):
                    self.record(str(pool), float(sample[0]), None if sample[1] is None else float(sample[1]))


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
