"""What each way an attempt can end does to its job, its executions and the rates.

Settling, recovering a gone worker's jobs and rescuing a dead host's all end
attempts; ``Endings`` is the one place that says what each ending writes.  It only
collects rows: a dialect's ``Tx.write_endings`` writes them, one statement (or one
batch) per kind.  The tuples are in the order the dialects' statements take them.
"""

from __future__ import annotations

import random
from typing import NamedTuple

from .backoff import retry_delay
from ..types import OutcomeKind


class LeasedRow(NamedTuple):
    """A running job as recovery and rescue read it (``Tx.expired_leases``, ``Tx.leases_of``)."""

    id: int
    attempts: int
    max_attempts: int
    owner: str | None
    started_at: float | None
    queue: str
    tenant: str
    mark: str | None  # lease_outcome: what the owner asked for should it exit first
    error: str | None


class Endings:
    """The row changes of attempts that ended, collected for one write per kind."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.ids: list[int] = []  # every job whose attempt ended (or was deferred)
        self.acks: list[tuple] = []        # (finished_at, result, id)
        self.releases: list[tuple] = []    # (id,): no attempt used, same place
        self.losses: list[tuple] = []      # (error, id): the attempt counts, same place
        self.retries: list[tuple] = []     # (delayed, run_at, error, id)
        self.deaths: list[tuple] = []      # (finished_at, error, id)
        self.deferrals: list[tuple] = []   # (run_at, dependency, id): never started
        self.executions: list[tuple] = []  # (job_id, attempt, worker, started_at, finished_at, outcome, error)
        self.tallies: dict[tuple[str, str], list[int]] = {}  # (queue, tenant) -> [completions, failures]

    def ack(self, job_id: int, result: str, queue: str, tenant: str) -> None:
        self.acks.append((self.now, result, job_id))
        self._tally(queue, tenant, 0)

    def release(self, job_id: int) -> None:
        self.releases.append((job_id,))

    def defer(self, job_id: int, run_at: float, dependency: str) -> None:
        self.deferrals.append((run_at, dependency, job_id))
        self.ids.append(job_id)

    def bury(self, job_id: int, error: str | None, queue: str, tenant: str) -> None:
        self.deaths.append((self.now, error, job_id))
        self._tally(queue, tenant, 1)

    def fail(self, job_id: int, attempts: int, max_attempts: int, error: str | None, queue: str,
             tenant: str, rng: random.Random) -> None:
        if attempts >= max_attempts:
            self.bury(job_id, error, queue, tenant)
            return
        run_at = self.now + retry_delay(attempts, rng=rng)
        self.retries.append((run_at > self.now, run_at, error, job_id))
        self._tally(queue, tenant, 1)

    def lose(self, job_id: int, attempts: int, max_attempts: int, error: str, queue: str,
             tenant: str) -> None:
        """Lost with its worker: the attempt counts (a job that kills its worker must not loop
        forever), but the job keeps its place, so it runs before later work."""
        if attempts >= max_attempts:
            self.bury(job_id, error, queue, tenant)
            return
        self.losses.append((error, job_id))
        self._tally(queue, tenant, 1)  # a lost attempt is a failed one

    def record(self, job_id: int, attempt: int, worker: str | None, started_at: float | None,
               outcome: str, error: str | None) -> None:
        self.executions.append((job_id, attempt, worker, started_at, self.now, outcome, error))
        self.ids.append(job_id)

    def recover(self, row: LeasedRow, reason: str, rng: random.Random) -> None:
        """End the attempt of a gone owner: as its ``abandon`` mark says, else lost."""
        if row.mark == OutcomeKind.RELEASE.value:
            self.release(row.id)  # given up at the end of a drain
            self.record(row.id, row.attempts, row.owner, row.started_at, row.mark, None)
        elif row.mark == OutcomeKind.FAIL.value:
            self.fail(row.id, row.attempts, row.max_attempts, row.error, row.queue, row.tenant, rng)
            self.record(row.id, row.attempts, row.owner, row.started_at, row.mark, row.error)
        else:
            error = f"{reason} (worker {row.owner})"
            self.lose(row.id, row.attempts, row.max_attempts, error, row.queue, row.tenant)
            self.record(row.id, row.attempts, row.owner, row.started_at, "lost", error)

    def rates(self) -> list[tuple[str, str, int, int, int, int]]:
        """The completions and failures to add: (queue, tenant, second, 0, completions, failures)."""
        second = int(self.now)
        return [(queue, tenant, second, 0, completions, failures)
                for (queue, tenant), (completions, failures) in sorted(self.tallies.items())]

    def _tally(self, queue: str, tenant: str, which: int) -> None:
        self.tallies.setdefault((queue, tenant), [0, 0])[which] += 1
