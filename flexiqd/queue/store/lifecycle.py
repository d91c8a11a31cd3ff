"""The job store's lifecycle, written once over a SQL dialect (dialect.py).

``Store`` implements the interface ``backend.Backend``; each of its methods is one
transaction of the dialect's ``Database``.  This module decides what happens to the
jobs -- which to lease, how an attempt ends, who recovers what, what the stats say --
and when jobs ask to enter their dependencies (``admission`` decides which do); the
dialect's ``Tx`` says it in SQL.  ``SQLiteBackend`` and ``PostgresBackend`` are this
``Store`` over their dialect.

Two things are the same in both stores because they are decided here:
- an attempt ends in one of the ways ``endings.Endings`` lists, whoever ends it
  (its worker's settle, recovery of a gone worker, rescue of a dead host);
- a job runs again only when nothing can still be running it: expired leases of a
  live process of this host are left alone, a dead host's are handed back by
  ``rescue_dead_hosts`` alone, with no attempt used.
"""

from __future__ import annotations

import collections
import logging
import math
import random
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from ...errors import JobNotFound, QueueError, StoreUnavailable
from .. import declarations
from .admission import HOLD_TIMES_RETENTION, Admission, read_dependency_stats
from .backend import EndedAttempt
from .dialect import Database, Tx
from .endings import Endings, LeasedRow
from .figures import stats_from_rows
from ..hosts import HostInfo, encode_report, host_info, is_alive
from ..limits import DependencyLimit, TenantCaps, deferral_delay, room_left, within_caps
from ..owners import owner_alive_here, owner_parts, this_host
from .rows import encode_json, new_row
from ..schedules import (FIRED, LEDGER_KEEP, RUN, SKIPPED, SLOT, LedgerRow, ScheduleRecord, SlotDecision,
                        SlotOutcome, ledger_row)
from ...schedules.words import OVERLAP, PAUSED
from .shares import Share
from ..types import (FINISHED_STATES, ClaimRequest, Deferral, DependencyStats, Exchanged, Job, JobState, NewJob,
                    Outcome, OutcomeKind, Stats)

log = logging.getLogger(__name__)

# Delayed jobs made due per transaction, earliest first: a million jobs due at the same
# instant are promoted in steps of a fraction of a second, between which other writers
# get their turn, not in one transaction that outlasts their busy timeout.
PROMOTION_BATCH = 10_000
# Rate and dependency-event seconds older than this are dropped by the maintenance sweep.
RATE_RETENTION = 3600
# Where the store appends count and rate changes, a worker folds them into their totals
# every this many claims (a stats read adds the ones not folded yet), so a store that
# nobody reads the stats of does not pile them up: a few hundred rows, a millisecond.
FOLD_EVERY = 200
# A stats read that summed more count changes than this folds them after it.
FOLD_AFTER = 100
# A process's claims recover expired leases at most this often, and promote delayed jobs
# that came due at most this often (seconds of the ``now`` they are given).
SWEEP_EVERY = 1.0
PROMOTE_EVERY = 0.05


class CommitUnknown(StoreUnavailable):
    """The connection was lost while a COMMIT was under way: it may or may not have happened.

    Raised by a dialect whose connection can drop mid-commit (a network); the store
    finds out from the jobs a claim stamps (``Store.exchange``)."""


class Store:
    """A durable job store with leases over one SQL dialect's database: the one
    implementation of ``Backend``, whose docstrings are each method's contract."""

    def __init__(self, database: Database, *, rng: random.Random | None = None) -> None:
        self.database = database
        self.url = database.url
        self._rng = rng or random.Random()
        self._claims = 0
        self._swept = self._promoted = -math.inf  # when this process's claims last did each
        self._caps_recorded: TenantCaps | None = None  # the tenant caps this process last stored
        # Who enters the dependency limits, and this process's shares of them.
        self.admission = Admission()

    @property
    def shared_by_hosts(self) -> bool:
        return self.database.shared_by_hosts

    @property
    def schema_versions(self) -> Mapping[str, int]:
        return self.database.schema_versions

    def clock(self) -> float:
        return self.database.clock()

    def close(self) -> None:
        self.database.close()

    # -- enqueue and promotion -------------------------------------------------------------

    def enqueue(self, jobs: Sequence[NewJob], *, now: float) -> list[int]:
        error = self.database.clock_error()
        rows = [new_row(job, now, error) for job in jobs]  # checked and encoded first: fail whole
        if not rows:
            return []
        return self.database.write("enqueue", lambda tx: self.insert_new(tx, jobs, rows, now))

    @staticmethod
    def insert_new(tx: Tx, jobs: Sequence[NewJob], rows: Sequence[Mapping[str, Any]], now: float) -> list[int]:
        """Insert ``jobs`` (their ``rows.new_row``), each with the options it takes from its task's
        declaration, count their arrivals and wake their queues, in ``tx``; their ids.  May run
        more than once (a transaction tried again)."""
        by_name = sorted({job.task for job in jobs if job.from_declaration})
        known = tx.task_declarations(by_name) if by_name else {}
        resolved = [declarations.resolve(row, job, known) for row, job in zip(rows, jobs)]
        placed = tx.insert_jobs(resolved)
        arrivals: collections.Counter = collections.Counter(
            (row["queue"], row["tenant"]) for row, (_, new) in zip(resolved, placed)
            if new and not row["delayed"])  # a delayed job arrives when it comes due
        _add_arrivals(tx, arrivals, int(now))
        return [job_id for job_id, _ in placed]

    def _promote(self, tx: Tx, now: float) -> int:
        """Make delayed jobs whose run_at has come runnable (a batch); return how many.

        A job that never ran *arrives* now, counted in the second of its run_at (when it
        became runnable, however late this runs).  A retry coming due is not an arrival,
        nor a deferred job whose wait is over: it arrived long ago (see ``Stats``).
        """
        # The earliest the store's time can be: a delayed job never starts before its run_at.
        promoted = tx.promote(now - self.database.clock_error(), PROMOTION_BATCH)
        arrivals: collections.Counter = collections.Counter()
        for queue, tenant, run_at, attempts, waiting_for in promoted:
            if attempts == 0 and waiting_for is None:
                arrivals[(queue, tenant, int(run_at))] += 1
        tx.bump_rates([(queue, tenant, second, n, 0, 0) for (queue, tenant, second), n in sorted(arrivals.items())])
        tx.notify({row[0] for row in promoted})
        return len(promoted)

    # -- claim and settle ------------------------------------------------------------------

    def claim(self, request: ClaimRequest, *, now: float) -> list[Job]:
        return self.exchange(request.owner, [], request, now=now).claimed

    def settle(self, owner: str, outcomes: Iterable[Outcome], *, now: float) -> list[int]:
        outcomes = list(outcomes)
        if not outcomes:
            return []
        return self.exchange(owner, outcomes, None, now=now).settled

    def settle_and_claim(self, owner: str, outcomes: Iterable[Outcome],
                         request: ClaimRequest | None, *, now: float) -> tuple[list[int], list[Job]]:
        done = self.exchange(owner, list(outcomes), request, now=now)
        return done.settled, done.claimed

    def exchange(self, owner: str, outcomes: Iterable[Outcome], request: ClaimRequest | None, *,
                 admit: Sequence[tuple[int, Sequence[DependencyLimit]]] = (), now: float) -> Exchanged:
        """Settle ``outcomes``, admit the jobs of ``admit`` (deferring the ones refused), then
        claim for ``request`` -- in one transaction, with the holds this owner admitted in
        memory since its last exchange.  One commit: a busy worker pays one per exchange.

        When the COMMIT's fate is unknown (``CommitUnknown``), the next transaction finds
        out: a claim stamps its jobs with the owner and ``now``, so jobs running under that
        stamp were claimed by it, and are returned (rather than left leased to a worker
        that does not know it holds them).  Finding none, it runs the exchange again --
        safe either way: outcomes already applied are ignored the second time.
        """
        outcomes = list(outcomes)
        claiming = request is not None and request.limit > 0
        # Expired leases and delayed jobs come due on the scale of seconds: a busy worker's
        # claims look for them now and then, not each time.  Decided here, not in ``body``,
        # which may run more than once.
        sweeping = claiming and _due(self._swept, now, SWEEP_EVERY)
        promoting = claiming and _due(self._promoted, now, PROMOTE_EVERY)
        pending = self.admission.take_pending(owner)
        renewing = self.admission.renewal_due(owner, now)
        grants: dict[str, Share] = {}

        def body(tx: Tx) -> Exchanged:
            grants.clear()
            self.admission.store_pending(tx, pending, now)
            settled = self._settle(tx, owner, outcomes, now) if outcomes else []
            refused: dict[int, Deferral] = {}
            if admit:
                answers = self.admission.admit_batch(tx, owner, admit, now, grants)
                refused = {job_id: refusal for job_id, refusal in answers.items() if refusal is not None}
                self._settle(tx, owner, [Outcome.defer(job_id, refusal) for job_id, refusal in refused.items()], now)
            if renewing:
                self.admission.renew_shares(tx, owner, now, grants)
            claimed = self._claim(tx, request, now, sweep=sweeping, promote=promoting) if claiming else []
            return Exchanged(settled, claimed, refused)

        def after_lost_commit(tx: Tx) -> Exchanged:
            if claiming:
                stamped = tx.stamped(owner, now)
                if stamped:
                    stamped.sort(key=lambda j: (request.queues.index(j.queue), -j.priority, j.run_at, j.id))
                    return Exchanged([], stamped)
            return body(tx)

        try:
            try:
                done = self.database.write(self._operation(outcomes, claiming), body)
            except CommitUnknown as exc:
                log.warning("%s; finding out whether it did.", exc)
                done = self.database.write(self._operation(outcomes, claiming), after_lost_commit)
        except BaseException:
            self.admission.restore_pending(owner, pending)
            raise
        self.admission.after_admissions(owner, grants, admitted=[job_id for job_id, _ in admit if job_id not in done.refused],
                               admit=admit, ended=[outcome.job_id for outcome in outcomes] + list(done.refused))
        if sweeping:
            self._swept = now
        if promoting:
            self._promoted = now
        if claiming:
            if request.tenant_caps is not None:
                self._caps_recorded = request.tenant_caps
            self._claims += 1
            if self.database.appends_changes and self._claims % FOLD_EVERY == 0:
                self.database.write("fold counts", lambda tx: tx.fold())
        return done

    @staticmethod
    def _operation(outcomes: list[Outcome], claiming: bool) -> str:
        return "settle and claim" if outcomes and claiming else "claim" if claiming else "settle"

    def _claim(self, tx: Tx, request: ClaimRequest, now: float, *, sweep: bool, promote: bool) -> list[Job]:
        if sweep:
            self._recover(tx, now, owner=None, reason="lease expired")
        if promote:
            self._promote(tx, now)
        caps = request.tenant_caps
        if caps is not None and caps != self._caps_recorded:
            tx.store_caps(caps)
        claimed = self._walk(tx, request, now)
        # Between promotions a claim that comes up short looks for jobs come due all the
        # same: the gate saves a busy worker's statements, never a due job's wait.
        if not promote and len(claimed) < request.limit and self._promote(tx, now):
            claimed += self._walk(tx, replace(request, limit=request.limit - len(claimed)), now)
        return claimed

    def _walk(self, tx: Tx, request: ClaimRequest, now: float) -> list[Job]:
        """Lease up to ``request.limit`` runnable jobs, queue by queue in order of preference."""
        if request.tenant_caps:
            return self._claim_within_caps(tx, request, request.tenant_caps, now)
        claimed: list[Job] = []
        expires = now + request.lease_seconds
        for queue in request.queues:
            want = request.limit - len(claimed)
            if want <= 0:
                break
            claimed.extend(tx.lease_next(queue, request.owner, expires, now, want))
        return claimed

    def _claim_within_caps(self, tx: Tx, request: ClaimRequest, caps: TenantCaps, now: float) -> list[Job]:
        """The claim walk, skipping the jobs of tenants at their cap (their running jobs in every
        queue counted, the ones this claim takes included).  Each walk that finds a tenant out
        of room walks again without it, so there is one walk more per tenant that fills up.

        Before it leases a capped tenant's jobs, a claim takes that tenant's lock (without
        waiting: a tenant another claim is leasing right now is skipped this time) and counts
        its running jobs after it, so claims on many hosts never lease past a cap.
        """
        running = tx.running_by_tenant()  # a hint: tenants full already are not walked
        room: dict[str, int] = {}
        full = {tenant for tenant, n in room_left(caps, running, list(running)).items() if n <= 0}
        claimed: list[Job] = []
        expires = now + request.lease_seconds
        for queue in request.queues:
            while (want := request.limit - len(claimed)) > 0:
                rows, complete = tx.capped_candidates(queue, full, want, now)
                new = sorted({tenant for _, tenant in rows if tenant not in room and caps.cap_of(tenant) is not None})
                locked = tx.lock_tenants(new) if new else []
                if locked:
                    room.update(room_left(caps, tx.running_by_tenant(locked), locked))
                room.update({tenant: 0 for tenant in new if tenant not in locked})
                taken, out_of_room = within_caps(rows, room, caps)
                full |= out_of_room
                if taken:
                    claimed.extend(tx.lease(taken, request.owner, expires, now))
                if len(rows) < want or not complete:
                    break  # no more jobs of tenants with room (or other claims hold them now)
        return claimed

    def _settle(self, tx: Tx, owner: str, outcomes: list[Outcome], now: float) -> list[int]:
        # One read for the whole batch and one write per kind of ending: a busy worker
        # settles dozens of jobs per transaction.
        held = tx.leased_to(owner, sorted({outcome.job_id for outcome in outcomes}))
        endings = Endings(now)
        for outcome in outcomes:
            row = held.pop(outcome.job_id, None)  # popped: a repeated outcome is ignored
            if row is None:
                continue  # not ours any more: expired and re-claimed, or cancelled
            queue, tenant, attempts, max_attempts, started_at = row
            kind, job_id = outcome.kind, outcome.job_id
            if kind is OutcomeKind.ACK:
                endings.ack(job_id, encode_json(outcome.result, f"the result of job {job_id}"), queue, tenant)
            elif kind is OutcomeKind.RELEASE:
                endings.release(job_id)
            elif kind is OutcomeKind.DEFER:
                run_at = now + deferral_delay(outcome.wait, self._rng)
                endings.defer(job_id, run_at, outcome.waiting_for or "")
                continue  # never started: no execution to record
            elif kind is OutcomeKind.DEAD:
                endings.bury(job_id, outcome.error, queue, tenant)
            else:
                endings.fail(job_id, attempts, max_attempts, outcome.error, queue, tenant, self._rng)
            endings.record(job_id, attempts, owner, started_at, kind.value, outcome.error)
        # Only the owner's admissions give its jobs holds, and this process made them: with
        # none, there is nothing to free (a hold of a job no longer running never counts).
        _apply(tx, endings, measure_holds=True, free_holds=self.admission.may_hold(owner))
        return endings.ids

    def renew(self, owner: str, job_ids: Iterable[int], lease_seconds: float, *, now: float) -> list[int]:
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return []
        # An expired lease that nobody recovered is still the owner's: while its process
        # lives, expiry alone never hands the job to another worker.
        held = self.database.write("renew leases", lambda tx: tx.renew(owner, ids, now + lease_seconds))
        return [job_id for job_id in ids if job_id in held]

    def abandon(self, owner: str, outcomes: Iterable[Outcome], *, now: float) -> list[int]:
        marks = []
        for outcome in outcomes:
            if outcome.kind not in (OutcomeKind.RELEASE, OutcomeKind.FAIL):
                raise QueueError(f"job {outcome.job_id}: only release or fail can wait for the "
                                 f"worker's exit, not {outcome.kind.value}")
            marks.append((outcome.kind.value, outcome.error, outcome.job_id, owner))
        if not marks:
            return []
        return self.database.write("abandon jobs", lambda tx: tx.mark_abandoned(marks))

    # -- recovery --------------------------------------------------------------------------

    def recover_expired(self, *, now: float) -> int:
        def body(tx: Tx) -> int:
            # Once per fleet: every daemon sharing the store runs this each minute; one that
            # finds another at it leaves the work to it (its transaction sees the same rows).
            if not tx.lead("maintenance"):
                return 0
            recovered = self._recover(tx, now, owner=None, reason="lease expired")
            tx.fold()
            tx.drop_old(int(now) - RATE_RETENTION, now - HOLD_TIMES_RETENTION)
            return recovered

        return self.database.write("recover expired leases", body)

    def recover_owner(self, owner: str, *, now: float, reason: str) -> int:
        def body(tx: Tx) -> int:
            recovered = self._recover(tx, now, owner=owner, reason=reason)
            tx.drop_shares([owner])  # gone: its share of every limit is free at once
            return recovered

        recovered = self.database.write("recover a worker's jobs", body)
        self.admission.forget_owners([owner])
        return recovered

    def _recover(self, tx: Tx, now: float, *, owner: str | None, reason: str) -> int:
        """Settle the jobs of a gone owner: its ``abandon`` mark if it left one, else "lost".

        Expired leases of an owner that is still a live process of this host are left
        alone: it may still be running them (a thread stuck in C), and a job runs again
        only when nothing can still be running it.  A worker of another registered host
        is left to that host (which can tell whether it still runs) or, dead, to
        ``rescue_dead_hosts``.
        """
        if owner is None:
            rows = [row for row in tx.expired_leases(now) if owner_alive_here(row.owner) is not True]
            rows = self._left_to_recover(tx, rows)
        else:
            rows = tx.leases_of(owner)
        if not rows:
            return 0
        endings = Endings(now)
        for row in rows:
            endings.recover(row, reason, self._rng)
        _apply(tx, endings)
        tx.notify({row.queue for row in rows})
        if owner is None:
            tx.drop_shares(sorted({row.owner for row in rows if row.owner}))
        return len(rows)

    @staticmethod
    def _left_to_recover(tx: Tx, rows: list[LeasedRow]) -> list[LeasedRow]:
        """The expired leases not held by a worker of another registered host."""
        here = this_host()
        others = {parts[0] for parts in (owner_parts(row.owner or "") for row in rows)
                  if parts is not None and parts[0] != here}
        if not others:
            return rows
        elsewhere = tx.host_names() - {here}
        return [row for row in rows if (owner_parts(row.owner or "") or ("",))[0] not in elsewhere]

    def lease_owners(self) -> dict[str, int]:
        return self.database.read("list lease owners", lambda tx: tx.lease_owners())

    # -- management ------------------------------------------------------------------------

    def cancel(self, job_id: int, *, now: float) -> bool:
        def body(tx: Tx) -> bool:
            self._promote(tx, now)  # a job that came due arrived, cancelled or not
            if tx.cancel(job_id, now):
                tx.free_holds([job_id], now, measure=False)
                return True
            if tx.job(job_id) is None:
                raise JobNotFound(f"no job with id {job_id}")
            return False

        return self.database.write("cancel", body)

    def get(self, job_id: int) -> Job:
        job = self.database.read("read a job", lambda tx: tx.job(job_id))
        if job is None:
            raise JobNotFound(f"no job with id {job_id}")
        return job

    def list_jobs(self, *, queue: str | None = None, state: JobState | None = None, task: str | None = None,
                  tenant: str | None = None, before: int | None = None, limit: int = 50) -> list[Job]:
        state = JobState(state) if state is not None else None
        return self.database.read("list jobs", lambda tx: tx.jobs(queue, state, limit, task=task, tenant=tenant,
                                                                  before=before))

    def retry_dead(self, *, queue: str | None = None, job_ids: Iterable[int] | None = None,
                   now: float) -> int:
        ids = list(job_ids) if job_ids is not None else None
        if ids is not None and not ids:
            return 0

        def body(tx: Tx) -> int:
            revived = tx.revive_dead(now, queue, ids)
            # A key may be live again (re-enqueued after this job died) or shared by several
            # dead jobs: reviving them all would run the same work twice (and break the unique
            # index), so only the newest dead job of a free key comes back.
            for job_id, key in tx.dead_with_keys(queue, ids):
                revived += tx.revive_if_key_free(now, job_id, key)
            # A revived job arrives again: it had left the queue for good.
            _add_arrivals(tx, collections.Counter(revived), int(now))
            return len(revived)

        return self.database.write("retry dead jobs", body)

    def purge(self, *, states: Sequence[JobState], finished_before: float,
              queue: str | None = None, sweep: bool = False, job_ids: Iterable[int] | None = None) -> int:
        wanted = []
        for state in states:
            state = JobState(state)
            if state not in FINISHED_STATES:
                raise QueueError(f"only finished jobs can be purged, not {state.value} ones")
            wanted.append(state)

        ids = list(job_ids) if job_ids is not None else None
        if ids is not None and not ids:
            return 0

        def body(tx: Tx) -> int:
            if sweep and not tx.lead("maintenance"):
                return 0  # another process of the fleet sweeps
            if ids is not None:
                return tx.delete_finished_ids(ids, wanted, finished_before)
            names = [queue] if queue is not None else tx.queues()
            # One index range (queue, state, finished_at) per queue and state.
            return sum(tx.delete_finished(name, state, finished_before) for name in names for state in wanted)

        return self.database.write("purge finished jobs", body)

    def queues(self) -> list[str]:
        return self.database.read("list queues", lambda tx: tx.queues())

    def executions(self, *, job_id: int | None = None, limit: int | None = None) -> list[dict]:
        rows = self.database.read("list executions", lambda tx: tx.executions(job_id, limit))
        keys = ("job_id", "attempt", "worker", "started_at", "finished_at", "outcome", "error")
        return [dict(zip(keys, row)) for row in rows]

    def ended_attempts(self, after: int | None, *, limit: int = 10_000) -> tuple[int, list[EndedAttempt]]:
        """See ``Backend``.  Where ids are handed out before commit, a transaction still open
        may yet fill a gap below ids already committed: the cursor stops at a gap until the
        dialect says the row after it is settled."""
        def body(tx: Tx) -> tuple[int, list[EndedAttempt]]:
            if after is None:
                return tx.last_attempt_id(), []
            cursor, ended = after, []
            for attempt_id, queue, task, outcome, seconds, dead, settled in tx.attempts_after(after, limit):
                if attempt_id != cursor + 1 and not settled:
                    break  # an open transaction may still write the ids in between
                cursor = attempt_id
                if queue is not None:  # its job was purged since: left out, as the contract says
                    ended.append(EndedAttempt(queue=queue, task=task, outcome=outcome, seconds=seconds,
                                              dead_lettered=bool(dead)))
            return cursor, ended

        return self.database.read("read ended attempts", body)

    def arrivals_since(self, queue: str, second: int) -> dict[int, int]:
        return self.database.read("read arrivals", lambda tx: tx.arrivals_since(queue, second))

    # -- dependency limits -----------------------------------------------------------------

    def admit(self, owner: str, job_id: int, dependencies: Sequence[DependencyLimit], *,
              now: float) -> Deferral | None:
        """See ``Backend``: ``admit_many`` of one job."""
        return self.admit_many(owner, [(job_id, dependencies)], now=now)[job_id]

    def admit_many(self, owner: str, requests: Sequence[tuple[int, Sequence[DependencyLimit]]], *,
                   now: float) -> dict[int, Deferral | None]:
        """See ``Backend``: one transaction, set-based (``Admission.admit_batch``)."""
        if not any(dependencies for _, dependencies in requests):
            return {job_id: None for job_id, _ in requests}
        pending = self.admission.take_pending(owner)
        grants: dict[str, Share] = {}

        def body(tx: Tx) -> dict[int, Deferral | None]:
            grants.clear()
            self.admission.store_pending(tx, pending, now)
            return self.admission.admit_batch(tx, owner, requests, now, grants)

        try:
            answers = self.database.write("admit jobs to their dependencies", body)
        except BaseException:
            self.admission.restore_pending(owner, pending)
            raise
        self.admission.after_admissions(owner, grants, admitted=[job_id for job_id, refusal in answers.items() if refusal is None],
                               admit=requests, ended=[])
        return answers

    def admit_locally(self, owner: str, job_id: int, dependencies: Sequence[DependencyLimit], *,
                      now: float) -> bool:
        """See ``Backend`` (``Admission.admit_locally``)."""
        return self.admission.admit_locally(owner, job_id, dependencies, now=now)

    def dependency_stats(self, dependency: str, *, now: float, window: float = 60.0) -> DependencyStats:
        if not window > 0:
            raise QueueError(f"a stats window must be more than 0s, got {window!r}")
        return self.database.read("read dependency stats",
                                  lambda tx: read_dependency_stats(tx, dependency, now, window))

    # -- stats -----------------------------------------------------------------------------

    def first_claims(self, owners: Iterable[str]) -> dict[str, float]:
        names = list(owners)
        if not names:
            return {}
        return self.database.read("read first claims", lambda tx: tx.first_claims(names))

    def stats(self, queue: str, *, now: float, window: float = 60.0, horizon: float = 0.0) -> Stats:
        """The queue's signals, read from the counts and rates and a bounded sample.

        Its cost grows with the tenants that hold jobs or had events in the window and
        with the delayed jobs that came due since the last promotion, never with the
        backlog, the delayed jobs or the tenants of the past.  Delayed jobs that came due
        are promoted first and read in the transaction that promoted the last of them, so
        the figures count them (as runnable and as arrivals) exactly.
        """
        if not window > 0:
            raise QueueError(f"a stats window must be more than 0s, got {window!r}")
        if not horizon >= 0 or math.isinf(horizon):
            raise QueueError(f"a coming-due horizon must be 0s or more, got {horizon!r}")

        unfolded = 0

        def read(tx: Tx, unless_due: bool) -> Stats | None:
            nonlocal unfolded
            rows = tx.stats_rows(queue, now, window, horizon, unless_due=unless_due)
            if rows is None:
                return None
            unfolded = rows.unfolded
            return stats_from_rows(queue, rows, now=now, window=window, due_within=horizon)

        def promote_then_read(tx: Tx) -> Stats | None:
            return None if self._promote(tx, now) >= PROMOTION_BATCH else read(tx, False)

        # The common case is one read; a write only when delayed jobs came due.
        found = self.database.read_one("read stats", lambda tx: read(tx, True))
        while found is None:
            found = self.database.write("read stats", promote_then_read)
        if unfolded > FOLD_AFTER:  # the next reads sum a few totals, not these changes
            self.database.write("fold counts", lambda tx: tx.fold())
        return found

    # -- waking idle workers ---------------------------------------------------------------

    def subscribe(self, queues: Sequence[str], wake: Callable[[], None]) -> Callable[[], None]:
        closer = self.database.subscribe(queues, wake)
        return closer if closer is not None else _no_subscription

    # -- hosts of a fleet (see flexiqd.queue.hosts) ------------------------------------------

    def heartbeat(self, host: str, *, now: float, interval: float,
                  report: Mapping[str, Any] | None = None) -> None:
        text = encode_report(report or {})
        self.database.write("record a heartbeat", lambda tx: tx.beat(host, now, interval, text))

    def hosts(self, *, now: float) -> list[HostInfo]:
        return [host_info(*row, now=now) for row in self.database.read("list hosts", lambda tx: tx.host_rows())]

    def forget_host(self, host: str) -> bool:
        return self.database.write("forget a host", lambda tx: tx.forget_host(host))

    def retire_host(self, host: str, *, now: float) -> int | None:
        def body(tx: Tx) -> int | None:
            if host not in tx.host_names():
                return None
            rows = tx.expired_leases(now)
            endings, rescued, queues = _rescue(rows, {host}, now, self._rng)
            _apply(tx, endings)
            tx.notify(queues)
            tx.drop_shares(sorted({row.owner for row in rows if row.owner and
                                   (owner_parts(row.owner) or ("",))[0] == host}))
            tx.forget_host(host)
            return rescued.get(host, 0)

        return self.database.write("forget a host", body)

    def rescue_dead_hosts(self, *, now: float, exclude: Sequence[str] = ()) -> dict[str, int]:
        # The rescuer reads the store's clock afresh, and finds no host dead just after that
        # clock stepped: a host that has not measured the step yet beats in the time before it.
        self.database.refresh_clock()

        def body(tx: Tx) -> dict[str, int]:
            if not self.database.clock_steady():
                return {}
            if not tx.lead("rescue"):  # one rescuer at a time: the others would only skip its rows
                return {}
            dead = {name for name, last_beat, interval, _, _ in tx.host_rows()
                    if name not in exclude and not is_alive(last_beat, interval, now)}
            if not dead:
                return {}
            # Rows a worker is settling or renewing right now are skipped: it is alive after all.
            rows = tx.expired_leases(now)
            endings, rescued, queues = _rescue(rows, dead, now, self._rng)
            _apply(tx, endings)
            tx.notify(queues)
            tx.drop_shares(sorted({row.owner for row in rows if row.owner and
                                   (owner_parts(row.owner) or ("",))[0] in dead}))
            return rescued

        return self.database.write("rescue the jobs of dead hosts", body)

    # -- the tasks' declarations (see flexiqd.queue.declarations) ----------------------------

    def declare_tasks(self, declared: Sequence[declarations.TaskDeclaration], *, by: str, now: float) -> int:
        wanted = sorted(declared, key=lambda d: d.task)  # in key order: workers starting at once never deadlock
        if not wanted:
            return 0
        return self.database.write("declare tasks", lambda tx: tx.declare_tasks(wanted, by, now))

    def task_declarations(self, tasks: Sequence[str] | None = None) -> dict[str, declarations.TaskDeclaration]:
        names = None if tasks is None else sorted(set(tasks))
        return self.database.read("read the tasks' declarations", lambda tx: tx.task_declarations(names))

    # -- schedules (see flexiqd.queue.schedules) ----------------------------------------------

    def ensure_schedules(self, names: Sequence[str], *, now: float) -> None:
        wanted = sorted(set(names))
        if wanted:
            self.database.write("register schedules", lambda tx: tx.ensure_schedules(wanted, now))

    def fire_slot(self, decision: SlotDecision, *, host: str, now: float) -> SlotOutcome | None:
        row = new_row(decision.job, now)  # checked and encoded first: fail whole
        name, at = decision.schedule, decision.at

        def body(tx: Tx) -> SlotOutcome | None:
            # The ledger row first: it holds the slot's key for this transaction, so what is
            # read below is what the slots before it left (a concurrent decider of this slot
            # waits here, and then finds the row).
            if not tx.insert_slot(name, SLOT, at, host, now):
                return None
            skip = decision.skip
            if skip is None and tx.schedule_paused(name):
                skip = PAUSED
            if skip is None and decision.overlap_skip and tx.previous_job_live(name, at):
                skip = OVERLAP
            job_id = None
            if skip is None:
                job_id = self._insert_scheduled(tx, row, now)
            tx.decide_slot(name, SLOT, at, SKIPPED if skip else FIRED, skip, decision.slots, job_id)
            tx.count_slots(name, 0 if skip else 1, decision.slots if skip else 0)
            return SlotOutcome(schedule=name, at=at, outcome=SKIPPED if skip else FIRED, reason=skip,
                               job_id=job_id, slots=decision.slots, late=decision.late)

        return self.database.write(f"decide slot {at:.0f} of schedule {name}", body)

    @staticmethod
    def _insert_scheduled(tx: Tx, row: Mapping[str, Any], now: float) -> int:
        (job_id, new), = tx.insert_jobs([row])
        if new and not row["delayed"]:
            _add_arrivals(tx, {(row["queue"], row["tenant"]): 1}, int(now))
        return job_id

    def run_schedule(self, name: str, job: NewJob, *, host: str, now: float) -> int:
        row = new_row(job, now)

        def body(tx: Tx) -> int:
            tx.ensure_schedules([name], now)
            at = now
            while not tx.insert_slot(name, RUN, at, host, now):  # two runs in one instant
                at = math.nextafter(at, math.inf)
            job_id = self._insert_scheduled(tx, row, now)
            tx.decide_slot(name, RUN, at, FIRED, None, 1, job_id)
            return job_id

        return self.database.write(f"run schedule {name}", body)

    def pause_schedule(self, name: str, paused: bool, *, now: float) -> bool:
        return self.database.write(f"{'pause' if paused else 'resume'} schedule {name}",
                                   lambda tx: tx.set_paused(name, paused, now))

    def schedule_records(self, names: Sequence[str]) -> dict[str, ScheduleRecord]:
        wanted = sorted(set(names))

        def body(tx: Tx) -> dict[str, ScheduleRecord]:
            records = {}
            for name, since, paused, fired, skipped in tx.schedule_rows(wanted):
                last, run = tx.newest_slot(name, SLOT), tx.newest_slot(name, RUN)
                records[name] = ScheduleRecord(
                    name=name, since=float(since), paused=bool(paused), fired=int(fired), skipped=int(skipped),
                    last=ledger_row(last) if last else None, last_run=ledger_row(run) if run else None)
            return records

        return self.database.read("read schedules", body)

    def schedule_ledger(self, name: str, *, limit: int = 20) -> list[LedgerRow]:
        return [ledger_row(row) for row in self.database.read("read a schedule's ledger",
                                                              lambda tx: tx.slot_rows(name, limit))]

    def prune_ledger(self, *, now: float) -> int:
        return self.database.write("prune the schedules' ledger", lambda tx: tx.prune_slots(now - LEDGER_KEEP))


def _apply(tx: Tx, endings: Endings, *, measure_holds: bool = False, free_holds: bool = True) -> None:
    """Write the endings; free the jobs' dependency slots (their hold times measured when
    ``measure_holds``: the job ran to an end it chose, not one a recovery found)."""
    tx.write_endings(endings)
    if free_holds:
        tx.free_holds(endings.ids, endings.now, measure=measure_holds)
    tx.bump_rates(endings.rates())


def _no_subscription() -> None:
    """What stops a subscription of a dialect that cannot push: nothing to stop."""


def _due(last: float, now: float, every: float) -> bool:
    return now - last >= every or now < last


def _add_arrivals(tx: Tx, arrivals: Mapping[tuple[str, str], int], second: int) -> None:
    """Count jobs that became runnable now (per queue and tenant), and wake their queues."""
    if arrivals:
        tx.bump_rates([(queue, tenant, second, n, 0, 0) for (queue, tenant), n in sorted(arrivals.items())])
        tx.notify({queue for queue, _ in arrivals})


def _rescue(rows: Iterable[LeasedRow], dead: set[str], now: float,
            rng: random.Random) -> tuple[Endings, dict[str, int], set[str]]:
    """The endings of the running jobs whose owner's host is in ``dead``: released with no
    attempt used (the host stopped, not the job), unless the owner's ``abandon`` marked it
    failed; how many per host; their queues."""
    endings = Endings(now)
    rescued: dict[str, int] = {}
    queues: set[str] = set()
    for row in rows:
        parts = owner_parts(row.owner or "")
        if parts is None or parts[0] not in dead:
            continue
        host = parts[0]
        if row.mark == OutcomeKind.FAIL.value:
            endings.fail(row.id, row.attempts, row.max_attempts, row.error, row.queue, row.tenant, rng)
            endings.record(row.id, row.attempts, row.owner, row.started_at, row.mark, row.error)
        else:
            endings.release(row.id)
            endings.record(row.id, row.attempts, row.owner, row.started_at, OutcomeKind.RELEASE.value,
                           f"host {host} stopped beating (worker {row.owner})")
        rescued[host] = rescued.get(host, 0) + 1
        queues.add(row.queue)
    return endings, rescued, queues
