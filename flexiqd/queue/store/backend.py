"""The store's interface: every statement its callers need, and the contract of each.

``Backend`` is what the daemon, the workers, the HTTP face and the tools hold; the one
store behind it is ``lifecycle.Store``, over either dialect (SQLite embedded, PostgreSQL
shared).  It is a ``Protocol``, not a base class: nothing here runs, so a method the
store lacks is an error (tests/unit/test_store_interface.py compares the two), and a test
may hand any object with these methods where a ``Backend`` is expected.  A new store
feature is one method here, its lifecycle in ``Store``, and each dialect's SQL.

Contracts common to all methods:
- ``now`` is epoch seconds and always an argument, so tests never patch clocks; callers
  take it from ``clock()``, the store's time, not from their own wall clock;
- every method is one transaction: it happens whole or not at all;
- an instance is safe to use from one thread at a time (callers that share one
  across threads must serialise their calls);
- store failures raise ``QueueError`` (``StoreUnavailable`` for missing,
  read-only, corrupt or locked stores) with a message naming the store.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from ..declarations import TaskDeclaration
from ..hosts import HostInfo
from ..limits import DependencyLimit
from ..schedules import LedgerRow, ScheduleRecord, SlotDecision, SlotOutcome
from ..types import ClaimRequest, Deferral, DependencyStats, Exchanged, Job, JobState, NewJob, Outcome, Stats


@dataclasses.dataclass(frozen=True)
class EndedAttempt:
    """One attempt that ended, as ``Backend.ended_attempts`` reports it (for counters).

    ``outcome``: ack, fail, dead, release or lost (its worker died with it) -- the
    ``executions`` outcome.  ``seconds``: how long it ran (None when its start is
    unknown).  ``dead_lettered``: the job went to the dead letters with this attempt.
    """

    queue: str
    task: str
    outcome: str
    seconds: float | None
    dead_lettered: bool


class Backend(Protocol):
    """A durable job store with leases."""

    url: str

    def clock(self) -> float:
        """The store's time, epoch seconds: the ``now`` to give every method.  Every process
        sharing the store reads the same time from it, whatever its own wall clock says, and
        a step of the wall clock does not move it (``flexiqd.queue.store.clock``).  Never blocks;
        thread-safe."""

    def enqueue(self, jobs: Sequence[NewJob], *, now: float) -> list[int]:
        """Store ``jobs`` and return their ids, in order.

        A job whose idempotency key is held by a queued or running job is not
        stored again: that job's id is returned in its place.
        """

    def claim(self, request: ClaimRequest, *, now: float) -> list[Job]:
        """Lease up to ``request.limit`` runnable jobs to ``request.owner``.

        Highest priority first, then the longest runnable, then enqueue order.
        Each claimed job uses one attempt.  Expired leases are recovered first
        (their jobs are runnable again with that attempt counted), so a job is
        never leased to two live owners.  With ``request.tenant_caps``, the jobs of a
        tenant running its cap's worth (in every queue, across every owner) are
        skipped for the next ones of other tenants (see ``ClaimRequest``).
        """

    def settle(self, owner: str, outcomes: Iterable[Outcome], *, now: float) -> list[int]:
        """Apply ``outcomes`` for jobs leased to ``owner``; return the ids settled.

        An outcome for a job the owner no longer holds (lease expired and
        re-claimed, or cancelled) is ignored and its id left out of the result.
        Every outcome frees the dependency slots the job held (``admit``).
        ``DEFER`` (a job ``admit`` refused, never started) puts the job back with
        no attempt used and no execution recorded, *waiting for its dependency*
        (``Stats.waiting_for_dependency``) until a worker claims it again, which
        it may from ``now + outcome.wait`` plus a jitter on: never runnable,
        delayed or coming due meanwhile, and no arrival when it comes back.
        """

    def settle_and_claim(self, owner: str, outcomes: Iterable[Outcome],
                         request: ClaimRequest | None, *, now: float) -> tuple[list[int], list[Job]]:
        """``settle`` then ``claim``, in one transaction."""

    def abandon(self, owner: str, outcomes: Iterable[Outcome], *, now: float) -> list[int]:
        """Record what should become of jobs ``owner`` still holds but cannot settle yet.

        For a worker about to exit while a thread it cannot stop may still be
        running these jobs.  Each job stays ``running`` and leased to ``owner``
        (nothing else may start it); the outcome -- ``RELEASE`` (no attempt used)
        or ``FAIL`` (the attempt counts; retried with backoff or dead-lettered) --
        is applied only once the owner is known to be gone: by ``recover_owner``,
        or when the lease expires and the owner is not a live process of this
        host.  Returns the ids marked; jobs the owner no longer holds are left out.
        """

    def renew(self, owner: str, job_ids: Iterable[int], lease_seconds: float, *, now: float) -> list[int]:
        """Extend the leases ``owner`` still holds; return the ids still held."""

    def recover_expired(self, *, now: float) -> int:
        """Settle the jobs whose lease expired; return how many.

        Leases of an owner that is a live process of this host are left to it;
        those of a worker of another host registered by ``heartbeat`` are left to
        that host while it is alive, and to ``rescue_dead_hosts`` once it is dead.
        Each other job gets what its owner's ``abandon`` asked for, or is *lost*:
        runnable again in its place (priority and run_at kept) with the attempt
        counted, or dead-lettered when it had no attempts left.  Idempotent.
        """

    def recover_owner(self, owner: str, *, now: float, reason: str) -> int:
        """Settle every job ``owner`` holds as ``recover_expired`` would, expired or not:
        the owner is known to be gone.  Return how many."""

    def lease_owners(self) -> dict[str, int]:
        """Running jobs per lease owner (cheap: reads only running jobs)."""

    def cancel(self, job_id: int, *, now: float) -> bool:
        """Cancel a queued, running or dead job; False if it had already finished."""

    def get(self, job_id: int) -> Job:
        """The job with this id, or ``JobNotFound``."""

    def list_jobs(self, *, queue: str | None = None, state: JobState | None = None, task: str | None = None,
                  tenant: str | None = None, before: int | None = None, limit: int = 50) -> list[Job]:
        """Jobs, newest first, optionally filtered; ``before``: only ids below it (the next page
        starts below the last id of this one)."""

    def retry_dead(self, *, queue: str | None = None, job_ids: Iterable[int] | None = None,
                   now: float) -> int:
        """Make dead jobs runnable again with fresh attempts; return how many.

        A dead job whose idempotency key is held by a queued or running job (or
        by a newer dead job revived in the same call) stays dead.
        """

    def purge(self, *, states: Sequence[JobState], finished_before: float,
              queue: str | None = None, sweep: bool = False, job_ids: Iterable[int] | None = None) -> int:
        """Delete finished jobs (in ``states``) that finished before the given time
        (``job_ids``: only those of them; ``queue`` is then not looked at).

        ``sweep``: a periodic retention sweep, which a store shared by several
        daemons runs once per fleet -- one that finds another sweeping returns 0
        and leaves the work to it.  An operator's purge (``sweep=False``) always runs.
        """

    def stats(self, queue: str, *, now: float, window: float = 60.0, horizon: float = 0.0) -> Stats:
        """The queue's current signals (see ``Stats``); ``horizon``: count the delayed jobs
        coming due within that many seconds (``Stats.coming_due``).

        Cheap at any shape: the cost follows the tenants with jobs or recent
        events, never the backlog, the delayed jobs or the tenants of the past
        (the jobs coming due are counted up to a bound).
        """

    def first_claims(self, owners: Iterable[str]) -> dict[str, float]:
        """When each of these lease owners first claimed a job (epoch seconds), for the owners
        that ever did and whose attempts are still recorded."""

    def queues(self) -> list[str]:
        """Names of the queues that hold jobs, finished ones not yet purged included."""

    def executions(self, *, job_id: int | None = None, limit: int | None = None) -> list[dict]:
        """Who ran what: one row per settled or lost attempt (job_id, attempt, worker, outcome, ...)."""

    def ended_attempts(self, after: int | None, *, limit: int = 10_000) -> tuple[int, list[EndedAttempt]]:
        """Attempts that ended after the cursor ``after``, oldest first, at most ``limit``;
        and the cursor to pass next time.

        ``after=None`` asks only for the current cursor (no attempts): counters
        start from there.  Cheap at any size: a range of the attempts' ids.  An
        attempt whose job was purged since is left out.
        """

    def arrivals_since(self, queue: str, second: int) -> dict[int, int]:
        """Jobs that arrived in ``queue`` (as ``Stats.arrival_rate`` counts them) per epoch second,
        for the seconds from ``second`` on that had any.

        A second's count only grows (a delayed job arrives in the second of its
        run_at, counted when it is promoted); seconds older than an hour may be gone.
        """

    # -- dependency limits (see flexiqd.queue.limits) ---------------------------------------

    def admit(self, owner: str, job_id: int, dependencies: Sequence[DependencyLimit], *,
              now: float) -> Deferral | None:
        """Let ``owner``'s job ``job_id`` enter every dependency in ``dependencies``, or none.

        All or nothing, in one transaction: when each dependency has a free
        concurrency slot (fewer holds than its ``concurrency``) and a start
        within its rate (GCRA, ``limits.gcra``), the job takes a hold of each
        (and a start of each rate) and None is returned.  Otherwise nothing
        is taken and the answer is a ``Deferral``: the dependency that refused
        with the longest wait, and that wait in seconds (for a rate, exact; for
        concurrency, an estimate from the recent hold times).

        A hold lasts until the job's attempt ends in any way: ``settle`` (any
        outcome), ``abandon``-then-recovery, ``recover_expired``,
        ``recover_owner``, ``cancel`` -- in the transaction that ends it, so a
        crashed worker never leaks a slot.  A hold counts only while its job
        is running leased to the owner that took it.  A job that already holds
        its concurrency slots is admitted again without taking more (a rate's
        start is taken by each admission that takes slots, or by each call for a
        rate-only limit).  A job the owner does not hold is refused with wait 0
        and nothing taken (its deferral is then ignored like any outcome for a
        job the owner no longer holds).
        Limits are the caller's: every caller must pass the same limits for a
        dependency (they come from one config file).
        """

    def admit_many(self, owner: str, requests: Sequence[tuple[int, Sequence[DependencyLimit]]], *,
                   now: float) -> dict[int, Deferral | None]:
        """``admit`` for each ``(job_id, dependencies)`` in turn, in one transaction (one commit
        for a claim's batch instead of one per job); the answer per job id.  All or nothing as a whole: an error admits none of them."""

    def exchange(self, owner: str, outcomes: Iterable[Outcome], request: ClaimRequest | None, *,
                 admit: Sequence[tuple[int, Sequence[DependencyLimit]]] = (), now: float) -> Exchanged:
        """``settle_and_claim``, admitting the jobs of ``admit`` in between (as ``admit_many``)
        and deferring the ones refused (as ``Outcome.defer``), in one transaction."""

    def admit_locally(self, owner: str, job_id: int, dependencies: Sequence[DependencyLimit], *,
                      now: float) -> bool:
        """Admit a job to concurrency limits without a store call, where this process holds room
        for ``owner`` (its share of each limit); the hold is stored by ``owner``'s next
        ``exchange``, which the caller makes soon.  False: ask the store (``exchange``'s
        ``admit``).  Thread-safe."""

    def dependency_stats(self, dependency: str, *, now: float, window: float = 60.0) -> DependencyStats:
        """The dependency's use now and over the last ``window`` seconds (see ``DependencyStats``).

        Cheap: reads the holds of this dependency and the recent hold times and
        events (bounded), never the backlog.
        """

    def subscribe(self, queues: Sequence[str], wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake()`` -- from another thread, soon after the commit -- when jobs become
        due on one of ``queues``; return a function that stops it (idempotent).

        A hint, not a delivery: callers still poll, and may be woken when there is
        nothing left to claim.  Stores that cannot push (SQLite) do nothing here.
        """

    # -- hosts of a fleet (see flexiqd.queue.hosts) -----------------------------------------

    #: Whether processes on several machines may share this store (their leases are then
    #: kept by the shared-store timing, flexiqd.queue.hosts.LeaseTiming).
    shared_by_hosts: bool
    #: The newest schema step this code knows, per dialect (flexiqd.queue.store.schema_steps): what
    #: a host reports with its beat, so a contract step waits while older code runs.
    schema_versions: Mapping[str, int]

    def heartbeat(self, host: str, *, now: float, interval: float,
                  report: Mapping[str, Any] | None = None) -> None:
        """Register ``host`` (or renew it): it beat at ``now`` and beats every ``interval``
        seconds; ``report`` (JSON-able) is what it publishes for the others.  Idempotent."""

    def hosts(self, *, now: float) -> list[HostInfo]:
        """Every registered host, by name, alive or not as of ``now``."""

    def forget_host(self, host: str) -> bool:
        """Remove ``host``'s registration (a clean shutdown); False if it was not registered."""

    def retire_host(self, host: str, *, now: float) -> int | None:
        """Forget a host that is gone for good, in one transaction: hand back the running jobs
        of its workers whose leases have expired (as ``rescue_dead_hosts`` does: no attempt
        used), then remove its registration.  The jobs handed back; None if it was not
        registered.  Whether the host is alive is the caller's to check: a daemon that still
        beats registers again at its next beat."""

    def rescue_dead_hosts(self, *, now: float, exclude: Sequence[str] = ()) -> dict[str, int]:
        """Hand back the running jobs of dead hosts; return how many per host.

        A job is rescued when the host of its lease owner is registered and dead
        (``hosts.is_alive``) and its lease has expired: runnable again in its place
        with no attempt used (like a release), or what its owner's ``abandon``
        asked for.  Hosts in ``exclude`` (the caller's own) are left alone.  One
        caller at a time does the work; the others return ``{}`` at once.
        Idempotent.
        """

    # -- the tasks' declarations (see flexiqd.queue.declarations) ----------------------------

    def declare_tasks(self, declared: Sequence[TaskDeclaration], *, by: str, now: float) -> int:
        """Store these tasks' declarations, written by worker ``by`` at ``now``, each replacing
        the one stored for its task (the last written wins); a declaration unchanged is left
        as it stands.  Return how many were new or changed.  Idempotent."""

    def task_declarations(self, tasks: Sequence[str] | None = None) -> dict[str, TaskDeclaration]:
        """The stored declarations of ``tasks`` (None: of every task), by task name; a task no
        worker declared is left out."""

    # -- schedules (see flexiqd.queue.schedules) ----------------------------------------------

    def ensure_schedules(self, names: Sequence[str], *, now: float) -> None:
        """Register the schedules not known yet as first seen at ``now`` (no slot before it
        fires); the others are left as they are.  Idempotent."""

    def fire_slot(self, decision: SlotDecision, *, host: str, now: float) -> SlotOutcome | None:
        """Decide one slot, in one transaction: insert its ledger row -- and only if no row
        held its key, enqueue its job (or record why it is skipped: planned, paused, or
        the previous slot's job still live with ``overlap_skip``).  None: another caller
        decided the slot first (nothing was written).  Safe from any number of processes
        and hosts at once; a caller that dies before its commit leaves the slot undecided."""

    def run_schedule(self, name: str, job: NewJob, *, host: str, now: float) -> int:
        """Enqueue ``job`` for the schedule now, outside its slots, recorded in the ledger as a
        run; the job's id."""

    def pause_schedule(self, name: str, paused: bool, *, now: float) -> bool:
        """Pause (its slots are skipped, reason paused) or resume the schedule for every host;
        whether that changed it.  Idempotent."""

    def schedule_records(self, names: Sequence[str]) -> dict[str, ScheduleRecord]:
        """The schedules of ``names`` that the store knows, by name."""

    def schedule_ledger(self, name: str, *, limit: int = 20) -> list[LedgerRow]:
        """The schedule's newest ledger rows (slots and runs), newest first."""

    def prune_ledger(self, *, now: float) -> int:
        """Delete ledger rows older than ``LEDGER_KEEP`` but each schedule's newest; how many."""

    def close(self) -> None:
        """Release the store's resources.  Idempotent."""
