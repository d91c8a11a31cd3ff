"""What a SQL dialect gives the store core: transactions, and the statements run inside them.

``Store`` (lifecycle.py) writes the job lifecycle once -- claim, settle, release,
recover, retry, cancel, purge, stats, admission, tenant caps, hosts and rescue --
in terms of this interface; the packages ``sqlite`` and ``postgres`` implement it with
their own SQL text, transactions, schema and wake-ups, and nothing else.  The
rows' meaning is one (rows.py); each statement is one index range or a bounded
read, as the dialect's schema makes it.

A dialect's ``Tx`` methods run inside the transaction ``Database.write`` or
``Database.read`` opened; a body given to them may run more than once (a dropped
connection, a deadlock): it must keep nothing from a run that was rolled back.
"""

from __future__ import annotations

import abc
import time
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

from ..declarations import TaskDeclaration
from .endings import Endings, LeasedRow
from .figures import StatsRows
from ..limits import TenantCaps
from .shares import Share
from ..types import Job, JobState

T = TypeVar("T")
# (queue, tenant, second, arrivals, completions, failures): an addition to the rates.
RateRow = tuple[str, str, int, int, int, int]


class Tx(abc.ABC):
    """The statements of one transaction, in one dialect."""

    # -- enqueue and promotion -------------------------------------------------------------

    @abc.abstractmethod
    def insert_jobs(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple[int, bool]]:
        """Insert the rows (``rows.NEW_JOB_COLUMNS``) in order; for each, its job's id and whether
        it is new (False: a queued or running job held its idempotency key, and that is its id)."""

    @abc.abstractmethod
    def bump_rates(self, rows: Sequence[RateRow]) -> None:
        """Add arrivals, completions and failures to the per-second rates."""

    @abc.abstractmethod
    def notify(self, queues: Iterable[str]) -> None:
        """Tell idle workers listening on ``queues`` that jobs became due (at commit)."""

    @abc.abstractmethod
    def promote(self, now: float, limit: int) -> list[tuple[str, str, float, int, str | None]]:
        """Make up to ``limit`` delayed jobs whose run_at has come runnable, earliest first
        (rows another transaction holds are skipped); (queue, tenant, run_at, attempts,
        waiting_for) of each."""

    # -- claim -----------------------------------------------------------------------------

    @abc.abstractmethod
    def lease_next(self, queue: str, owner: str, expires: float, now: float, want: int) -> list[Job]:
        """Lease the first ``want`` runnable jobs of ``queue`` in claim order (run_at <= now)."""

    @abc.abstractmethod
    def lease(self, job_ids: Sequence[int], owner: str, expires: float, now: float) -> list[Job]:
        """Lease the runnable jobs ``job_ids`` (found by ``capped_candidates``)."""

    @abc.abstractmethod
    def store_caps(self, caps: TenantCaps) -> None:
        """Store the tenant caps the workers claim with, in place of the ones stored."""

    @abc.abstractmethod
    def running_by_tenant(self, tenants: Sequence[str] | None = None) -> dict[str, int]:
        """Running jobs per named tenant in every queue (of ``tenants`` only, when given)."""

    @abc.abstractmethod
    def capped_candidates(self, queue: str, full: set[str], want: int,
                          now: float) -> tuple[list[tuple[int, str]], bool]:
        """(id, tenant) of the first ``want`` runnable jobs of ``queue`` in claim order, of
        tenants not in ``full``; and False when jobs other transactions hold were left out
        (so fewer than ``want`` does not mean there are no more)."""

    @abc.abstractmethod
    def lock_tenants(self, tenants: Sequence[str]) -> list[str]:
        """Take each tenant's cap lock without waiting; the tenants locked.  Claims that hold
        it count the tenant's running jobs after every claim that held it before."""

    @abc.abstractmethod
    def stamped(self, owner: str, now: float) -> list[Job]:
        """The jobs running leased to ``owner`` since ``now``: what a claim whose COMMIT may
        have been lost took."""

    # -- settle, renew, abandon ------------------------------------------------------------

    @abc.abstractmethod
    def leased_to(self, owner: str, job_ids: Sequence[int]) -> dict[int, tuple]:
        """(queue, tenant, attempts, max_attempts, started_at) of the jobs of ``job_ids`` running
        leased to ``owner``, locked until the transaction ends."""

    @abc.abstractmethod
    def write_endings(self, endings: Endings) -> None:
        """Write the row changes ``endings`` collected (not the rates, not the holds)."""

    @abc.abstractmethod
    def free_holds(self, job_ids: Sequence[int], now: float, *, measure: bool) -> None:
        """Delete the dependency holds of these jobs; record their hold times when ``measure``."""

    @abc.abstractmethod
    def renew(self, owner: str, job_ids: Sequence[int], expires: float) -> set[int]:
        """Extend the leases ``owner`` holds among ``job_ids``; the ids it holds."""

    @abc.abstractmethod
    def mark_abandoned(self, marks: Sequence[tuple[str, str | None, int, str]]) -> list[int]:
        """Set (outcome, error, id, owner): the lease outcome of running jobs ``owner`` holds."""

    # -- recovery and maintenance ----------------------------------------------------------

    @abc.abstractmethod
    def expired_leases(self, now: float) -> list[LeasedRow]:
        """Running jobs whose lease expired before ``now`` (rows others hold are skipped)."""

    @abc.abstractmethod
    def leases_of(self, owner: str) -> list[LeasedRow]:
        """Running jobs leased to ``owner``."""

    @abc.abstractmethod
    def host_names(self) -> set[str]:
        """The hosts registered by a heartbeat."""

    @abc.abstractmethod
    def lead(self, duty: str) -> bool:
        """Whether this transaction may do a fleet-wide ``duty`` ("maintenance", "rescue");
        False while another process does it."""

    @abc.abstractmethod
    def fold(self) -> None:
        """Move appended count and rate changes into their totals (where a dialect appends)."""

    @abc.abstractmethod
    def drop_old(self, rates_before: int, holds_before: float) -> None:
        """Drop rate and dependency-event seconds before ``rates_before``, and hold times
        that ended and shares that lapsed before ``holds_before``."""

    @abc.abstractmethod
    def lease_owners(self) -> dict[str, int]:
        """Running jobs per lease owner."""

    # -- management ------------------------------------------------------------------------

    @abc.abstractmethod
    def cancel(self, job_id: int, now: float) -> bool:
        """Cancel the job if queued, running or dead; whether it was."""

    @abc.abstractmethod
    def job(self, job_id: int) -> Job | None:
        """The job, or None."""

    @abc.abstractmethod
    def jobs(self, queue: str | None, state: JobState | None, limit: int, *, task: str | None = None,
             tenant: str | None = None, before: int | None = None) -> list[Job]:
        """The newest jobs first, of ``queue``, ``state``, ``task`` and ``tenant`` when given, and
        with an id below ``before`` (the next page)."""

    @abc.abstractmethod
    def revive_dead(self, now: float, queue: str | None, job_ids: Sequence[int] | None) -> list[tuple[str, str]]:
        """Queue again (attempts 0, run_at ``now``) the dead jobs without an idempotency key,
        of ``queue`` / ``job_ids`` when given; (queue, tenant) of each."""

    @abc.abstractmethod
    def dead_with_keys(self, queue: str | None, job_ids: Sequence[int] | None) -> list[tuple[int, str]]:
        """(id, idempotency key) of the dead jobs that have one, newest first."""

    @abc.abstractmethod
    def revive_if_key_free(self, now: float, job_id: int, key: str) -> list[tuple[str, str]]:
        """``revive_dead`` of one keyed job, unless a queued or running job holds its key."""

    @abc.abstractmethod
    def queues(self) -> list[str]:
        """Every queue that holds jobs, by name."""

    @abc.abstractmethod
    def delete_finished(self, queue: str, state: JobState, before: float) -> int:
        """Delete the jobs of ``queue`` in ``state`` finished before ``before``, with their
        executions; how many jobs."""

    @abc.abstractmethod
    def delete_finished_ids(self, job_ids: Sequence[int], states: Sequence[JobState], before: float) -> int:
        """``delete_finished`` of the jobs ``job_ids`` that are in one of ``states``."""

    @abc.abstractmethod
    def executions(self, job_id: int | None, limit: int | None) -> list[tuple]:
        """(job_id, attempt, worker, started_at, finished_at, outcome, error) in id order."""

    @abc.abstractmethod
    def last_attempt_id(self) -> int:
        """The newest execution's id (0 when none)."""

    @abc.abstractmethod
    def attempts_after(self, after: int, limit: int) -> list[tuple]:
        """(id, queue, task, outcome, seconds, dead_lettered, settled) of the executions after
        ``after`` in id order; queue None when the job was purged; settled False while a
        transaction still open may yet write an id below this one."""

    @abc.abstractmethod
    def arrivals_since(self, queue: str, second: int) -> dict[int, int]:
        """Arrivals per second from ``second`` on, seconds with none left out."""

    @abc.abstractmethod
    def first_claims(self, owners: Sequence[str]) -> dict[str, float]:
        """Each owner's earliest start among its running jobs and ended attempts."""

    @abc.abstractmethod
    def stats_rows(self, queue: str, now: float, window: float, due_within: float, *,
                   unless_due: bool = False) -> StatsRows | None:
        """What ``figures.stats_from_rows`` needs, read in one snapshot; None when ``unless_due``
        and a delayed job's run_at has come (promote first).  Runs as ``Database.read_one``'s
        one statement where the dialect's round trips cost."""

    # -- dependency limits -----------------------------------------------------------------

    @abc.abstractmethod
    def leased_ids(self, owner: str, job_ids: Sequence[int]) -> set[int]:
        """The jobs of ``job_ids`` running leased to ``owner``; none of them can end until
        this transaction does."""

    @abc.abstractmethod
    def admitted_ids(self, owner: str, job_ids: Sequence[int]) -> set[int]:
        """The jobs of ``job_ids`` holding a dependency slot taken by ``owner``."""

    @abc.abstractmethod
    def lock_dependencies(self, names: Sequence[str]) -> dict[str, float | None]:
        """Lock the dependencies' admission rows (in name order, created if new) until the
        transaction ends; each one's GCRA time (None when never rate limited)."""

    @abc.abstractmethod
    def live_holds(self, names: Sequence[str]) -> list[tuple[str, float]]:
        """(dependency, since) of the holds of jobs still running leased to their taker."""

    @abc.abstractmethod
    def recent_hold_times(self, name: str, since: float, limit: int) -> list[float]:
        """The newest ``limit`` hold durations of ``name`` that ended after ``since``."""

    @abc.abstractmethod
    def add_holds(self, holds: Sequence[tuple[str, int, str, float]], *, count: bool = False) -> None:
        """Insert (dependency, job_id, owner, since) holds, each only while its job still runs
        leased to its owner (holds admitted in a worker's memory arrive later); with ``count``,
        count each as an admission in the second of its ``since`` too."""

    @abc.abstractmethod
    def own_shares(self, owner: str, names: Sequence[str]) -> dict[str, Share]:
        """``owner``'s shares of these dependencies."""

    @abc.abstractmethod
    def owner_holds(self, owner: str, names: Sequence[str]) -> dict[str, int]:
        """``owner``'s live holds per dependency."""

    @abc.abstractmethod
    def shares_of(self, name: str) -> dict[str, Share]:
        """Every owner's share of ``name`` (read under the dependency's lock)."""

    @abc.abstractmethod
    def holds_by_owner(self, name: str) -> dict[str, int]:
        """Live holds of ``name`` per owner."""

    @abc.abstractmethod
    def set_share(self, name: str, owner: str, share: Share) -> None:
        """Store ``owner``'s share of ``name``."""

    @abc.abstractmethod
    def wanted_by_others(self, owner: str, names: Sequence[str], now: float) -> dict[str, int]:
        """Slots owners other than ``owner`` with live shares were refused, per dependency."""

    @abc.abstractmethod
    def drop_shares(self, owners: Sequence[str]) -> None:
        """Delete the shares of gone owners."""

    @abc.abstractmethod
    def set_tat(self, name: str, tat: float) -> None:
        """Store a dependency's GCRA time (its row is locked by ``lock_dependencies``)."""

    @abc.abstractmethod
    def bump_dependency(self, name: str, second: int, admitted: int, deferred: int) -> None:
        """Add admissions and refusals to a dependency's per-second events."""

    @abc.abstractmethod
    def waiting_for(self, name: str, limit: int) -> int:
        """Queued jobs waiting for ``name``, counted up to ``limit``."""

    @abc.abstractmethod
    def dependency_events(self, name: str, since: float) -> tuple[int, int]:
        """(admitted, deferred) of ``name`` after ``since``."""

    # -- hosts -----------------------------------------------------------------------------

    @abc.abstractmethod
    def beat(self, host: str, now: float, interval: float, report: str) -> None:
        """Record a host's heartbeat (registering it the first time)."""

    @abc.abstractmethod
    def host_rows(self) -> list[tuple[str, float, float, str, float]]:
        """(name, last_beat, interval, report, registered_at) of every host, by name."""

    @abc.abstractmethod
    def forget_host(self, host: str) -> bool:
        """Delete a host's row; whether there was one."""

    # -- the tasks' declarations (see flexiqd.queue.declarations) --------------------------

    @abc.abstractmethod
    def declare_tasks(self, declared: Sequence[TaskDeclaration], by: str, now: float) -> int:
        """Upsert the declarations (in the order given), leaving unchanged ones alone; how many
        rows were written."""

    @abc.abstractmethod
    def task_declarations(self, tasks: Sequence[str] | None) -> dict[str, TaskDeclaration]:
        """The stored declarations of ``tasks`` (None: all), by task name."""

    # -- schedules (see flexiqd.queue.schedules) --------------------------------------------

    @abc.abstractmethod
    def ensure_schedules(self, names: Sequence[str], now: float) -> None:
        """Give each schedule not known yet its row, first seen at ``now``."""

    @abc.abstractmethod
    def insert_slot(self, schedule: str, kind: str, at: float, host: str, now: float) -> bool:
        """Insert the ledger row of (``schedule``, ``kind``, ``at``), undecided, unless one exists
        (``ON CONFLICT DO NOTHING``, waiting for a transaction inserting it now); whether it did."""

    @abc.abstractmethod
    def decide_slot(self, schedule: str, kind: str, at: float, outcome: str, reason: str | None,
                    slots: int, job_id: int | None) -> None:
        """Record what became of the ledger row this transaction inserted."""

    @abc.abstractmethod
    def schedule_paused(self, name: str) -> bool:
        """Whether the schedule is paused (False for one not known)."""

    @abc.abstractmethod
    def previous_job_live(self, name: str, before: float) -> bool:
        """Whether the job of the schedule's newest fired slot before ``before`` is queued or running."""

    @abc.abstractmethod
    def count_slots(self, name: str, fired: int, skipped: int) -> None:
        """Add to the schedule's totals of fired and skipped slots."""

    @abc.abstractmethod
    def set_paused(self, name: str, paused: bool, now: float) -> bool:
        """Pause or resume the schedule (first seen at ``now`` if not known); whether that changed it."""

    @abc.abstractmethod
    def schedule_rows(self, names: Sequence[str]) -> list[tuple[str, float, bool, int, int]]:
        """(name, since, paused, fired, skipped) of the schedules in ``names`` that are known."""

    @abc.abstractmethod
    def newest_slot(self, name: str, kind: str) -> tuple | None:
        """The schedule's newest ledger row of ``kind`` as ``schedules.ledger_row`` reads it."""

    @abc.abstractmethod
    def slot_rows(self, name: str, limit: int) -> list[tuple]:
        """The schedule's newest ``limit`` ledger rows of every kind, newest first (as ``newest_slot``)."""

    @abc.abstractmethod
    def prune_slots(self, before: float) -> int:
        """Delete ledger rows of slots before ``before``, except each schedule's newest of each
        kind; how many."""


class Database(abc.ABC):
    """A dialect's connection and its transactions.  Thread-safe: calls are serialised."""

    url: str
    # Whether the counts and rates are appended as changes that ``Tx.fold`` moves into their
    # totals (so a store only workers use folds every so many claims).
    appends_changes = False
    # Whether several hosts share the store (``Backend.shared_by_hosts``).
    shared_by_hosts = False
    # This dialect's name and the newest schema step this code knows (``Backend.schema_versions``).
    schema_versions: Mapping[str, int] = {}

    @abc.abstractmethod
    def write(self, operation: str, body: Callable[[Tx], T]) -> T:
        """Run ``body`` in one write transaction; QueueError naming ``operation`` on failure."""

    @abc.abstractmethod
    def read(self, operation: str, body: Callable[[Tx], T]) -> T:
        """Run ``body`` in one read-only transaction that sees one snapshot."""

    def clock(self) -> float:
        """The store's time in epoch seconds (``flexiqd.queue.store.clock``): the ``now`` its
        processes write and judge leases, beats and run-ats by.  Never blocks."""
        return time.time()

    def clock_error(self) -> float:
        """How far ``clock()`` may be from the store's time, in seconds (0: it is the store's
        time): a delayed job is written due that much later and promoted that much later, so
        it never starts before its delay has passed on the store's clock."""
        return 0.0

    def refresh_clock(self) -> None:
        """Have the next transaction measure the store's clock again first (where it is measured)."""

    def clock_steady(self) -> bool:
        """False while the store's clock has just stepped and processes may disagree on it (a
        host must not be found dead meanwhile)."""
        return True

    def read_one(self, operation: str, body: Callable[[Tx], T]) -> T:
        """``read`` of a body that makes one ``Tx`` call reading one snapshot: a dialect whose
        single statements see their own snapshot runs it without a transaction's round trips."""
        return self.read(operation, body)

    def subscribe(self, queues: Sequence[str], wake: Callable[[], None]) -> Callable[[], None] | None:
        """See ``Backend.subscribe``; None when the dialect has no wake-ups of its own."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection; calls after it raise QueueError."""
