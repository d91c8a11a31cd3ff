"""The embedded SQLite job store.

Durable by default: WAL with ``synchronous=FULL``, so an enqueue that returned
survives a power loss (``?synchronous=normal`` trades that for speed).  The
connection is in autocommit mode and every change runs inside one
``BEGIN IMMEDIATE`` transaction, so writers queue on the busy timeout instead of
failing half-way or deadlocking on a lock upgrade.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import sqlite3
import threading
from typing import Any, Iterable, Iterator, Mapping, Sequence

from ..errors import JobNotFound, PayloadError, QueueError, StoreUnavailable
from .backend import Backend, EndedAttempt
from .backoff import retry_delay
from .hosts import HostInfo, encode_report, host_info, is_alive
from .limits import (DependencyLimit, TenantCaps, deferral_delay, gcra, nearest_rank, room_left, slot_wait,
                     within_caps)
from .owners import owner_alive_here, owner_parts, this_host
from .sqlite_schema import MIGRATIONS, SCHEMA, SCHEMA_VERSION
from .types import (FINISHED_STATES, RECENT_WINDOW, ClaimRequest, Deferral, DependencyStats, Job, JobState,
                    NewJob, Outcome, OutcomeKind, Stats)

_JOB_COLUMNS = ("id, queue, task, payload, priority, state, run_at, attempts, max_attempts, "
                "timeout, idempotency_key, tenant, lease_owner, lease_expires, enqueued_at, "
                "started_at, finished_at, result, error")

_NEW_JOB_COLUMNS = ("queue", "task", "payload", "priority", "state", "delayed", "run_at",
                    "max_attempts", "timeout", "idempotency_key", "tenant", "enqueued_at")
_INSERT_JOB = (f"INSERT INTO jobs ({', '.join(_NEW_JOB_COLUMNS)}) "
               f"VALUES ({', '.join(':' + name for name in _NEW_JOB_COLUMNS)})")

# Durations for percentiles come from at most this many recent completions.
_DURATION_SAMPLE = 1000
_DURATION_HORIZON = 300.0
# Rate buckets older than this are dropped during lease recovery.
_RATE_RETENTION = 3600
# What recovering a running job needs to know of it (both stores, _recover and _rescue).
_RECOVER_COLUMNS = "id, attempts, max_attempts, lease_owner, started_at, queue, tenant, lease_outcome, error"
# Delayed jobs made due per transaction, earliest first: a million jobs due at the same
# instant are promoted in steps of a fraction of a second, between which other writers
# get the lock, not in one transaction that outlasts their busy timeout.
_PROMOTION_BATCH = 10_000
# Delayed jobs coming due are counted up to this many: an index range of at most this
# length (a few milliseconds), however many are scheduled.
COMING_DUE_LIMIT = 100_000
# Hold times behind a dependency's typical hold (the wait a refused job is told) and kept
# for dependency_stats; older ones are dropped during lease recovery.
_TYPICAL_HOLD_SAMPLE = 100
_HOLD_SAMPLE = 1000
_HOLD_TIMES_RETENTION = 600.0
# The holds that count: of a job still running leased to the owner that took the hold.
_LIVE_HOLDS = ("SELECT h.since FROM dependency_holds h JOIN jobs j ON j.id = h.job_id "
               "WHERE h.dependency = ? AND j.state = 'running' AND j.lease_owner = h.owner")

# What every attempt that ends clears; a job back in the queue loses its start time too.
_UNLEASED = "lease_owner = NULL, lease_expires = NULL, lease_outcome = NULL"
_REQUEUED = f"state = 'queued', started_at = NULL, {_UNLEASED}"
_ACK = f"UPDATE jobs SET state = 'done', finished_at = ?, result = ?, error = NULL, {_UNLEASED} WHERE id = ?"
# Released: no attempt used, and the job keeps its place (run_at untouched).
_RELEASE = f"UPDATE jobs SET {_REQUEUED}, delayed = 0, attempts = attempts - 1 WHERE id = ?"
# Lost with its worker: the attempt counts (a job that kills its worker must not loop
# forever), but the job keeps its place (run_at untouched), so it runs before later work.
_LOSE = f"UPDATE jobs SET {_REQUEUED}, delayed = 0, error = ? WHERE id = ?"
# Failed: back after a backoff, delayed until then.
_RETRY = f"UPDATE jobs SET {_REQUEUED}, delayed = ?, run_at = ?, error = ? WHERE id = ?"
# Deferred (never started: a dependency was full): no attempt used, waiting until run_at.
_DEFER = (f"UPDATE jobs SET {_REQUEUED}, attempts = attempts - 1, delayed = 2, run_at = ?, "
          f"waiting_for = ? WHERE id = ?")
_DEAD_LETTER = f"UPDATE jobs SET state = 'dead', finished_at = ?, error = ?, {_UNLEASED} WHERE id = ?"
_RECORD = ("INSERT INTO executions (job_id, attempt, worker, started_at, finished_at, outcome, error) "
           "VALUES (?,?,?,?,?,?,?)")
# Jobs an idempotency key belongs to.
_LIVE = "state IN ('queued', 'running')"
# Queued jobs that may run / that wait for their run_at: the terms of the partial indexes'
# WHERE (jobs_claim and jobs_age / jobs_due), which a query must repeat to use them.
_DUE = "state = 'queued' AND delayed = 0"
_DELAYED = "state = 'queued' AND delayed = 1"
# Queued jobs deferred by ``admit``, until their run_at (jobs_waiting).
_WAITING = "state = 'queued' AND delayed = 2"
# A capped claim with tenants at their cap reads the head of each other tenant's due jobs
# (jobs_tenant_claim) while there are at most this many such tenants, instead of walking
# the claim order past the capped tenants' jobs.
_HEADS_MAX = 64
# The counts buckets stats reads (finished jobs are counted too, but never read there).
_WAITING_OR_HELD = "('queued', 'delayed', 'waiting', 'running', 'dead')"

_SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL", "off": "OFF", "extra": "EXTRA"}


def encode_json(value: Any, what: str) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"{what} is not JSON-serialisable: {exc}") from None


def _decode_json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        # A row written by something else: surface it rather than crash the reader.
        return {"undecodable": text}


def _row_to_job(row: sqlite3.Row | tuple) -> Job:
    (id_, queue, task, payload, priority, state, run_at, attempts, max_attempts, timeout,
     key, tenant, owner, expires, enqueued, started, finished, result, error) = row
    return Job(id=id_, queue=queue, task=task, payload=_decode_json(payload), priority=priority,
               state=JobState(state), run_at=run_at, attempts=attempts, max_attempts=max_attempts,
               timeout=timeout, idempotency_key=key, tenant=tenant or None, lease_owner=owner,
               lease_expires=expires, enqueued_at=enqueued, started_at=started,
               finished_at=finished, result=_decode_json(result), error=error)


def percentile(sorted_values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile of already sorted values (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


class SQLiteBackend(Backend):
    """A job store in one SQLite file, shared by processes on one machine.

    Thread-safe: calls are serialised on one connection by a lock.
    """

    def __init__(self, path: str, *, synchronous: str = "full", busy_timeout: float = 5.0,
                 rng: random.Random | None = None, url: str | None = None) -> None:
        self.path = path
        self.url = url or f"sqlite:///{path}"
        self.busy_timeout = busy_timeout
        self._rng = rng or random.Random()
        self._lock = threading.RLock()
        self._caps_recorded: TenantCaps | None = None  # the tenant caps this process last stored
        if synchronous.lower() not in _SYNCHRONOUS:
            raise StoreUnavailable(
                f"{self.url}: synchronous={synchronous!r} is not one of {', '.join(_SYNCHRONOUS)}")
        self._conn = self._open(_SYNCHRONOUS[synchronous.lower()])

    # -- opening ---------------------------------------------------------------------------

    def _open(self, synchronous: str) -> sqlite3.Connection:
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise StoreUnavailable(
                f"cannot open the queue database {self.path}: directory {directory} does not exist")
        if os.path.exists(self.path) and not os.access(self.path, os.W_OK):
            raise StoreUnavailable(
                f"cannot open the queue database {self.path}: the file is read-only for this user")
        if not os.path.exists(self.path) and not os.access(directory, os.W_OK):
            raise StoreUnavailable(
                f"cannot create the queue database {self.path}: directory {directory} is not writable")
        if not os.path.lexists(self.path):
            try:
                # Created here, not by SQLite (which uses 0644): 0666 less the umask lets the
                # daemon and the workers share the file through their group (UMask=0007);
                # the -wal and -shm files take the database file's mode.
                os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            except FileExistsError:
                pass  # another process created it first
            except OSError as exc:
                raise StoreUnavailable(
                    f"cannot create the queue database {self.path}: {exc.strerror}") from None
        try:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None,
                                   check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open the queue database {self.path}: {exc}") from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise StoreUnavailable(
                    f"cannot use the queue database {self.path}: WAL mode refused (got {mode})")
            conn.execute(f"PRAGMA synchronous = {synchronous}")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreUnavailable(
                    f"the queue database {self.path} has schema version {version}, newer than "
                    f"this flexiqd understands ({SCHEMA_VERSION}): upgrade flexiqd")
            if version < SCHEMA_VERSION:
                self._migrate(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise self._translate(exc, "open") from None
        except StoreUnavailable:
            conn.close()
            raise
        return conn

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        """Create the schema, or bring an older one up to date, in one transaction.

        The version is read again under the write lock: two processes opening a
        new store at once must not both run the migrations.
        """
        with _transaction(conn):
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                statements: Sequence[str] = SCHEMA
            else:
                statements = [s for v in sorted(MIGRATIONS) if v > version for s in MIGRATIONS[v]]
            for statement in statements:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None  # type: ignore[assignment]

    # -- plumbing --------------------------------------------------------------------------

    def _translate(self, exc: sqlite3.Error, operation: str) -> QueueError:
        text = str(exc)
        if "locked" in text or "busy" in text:
            return StoreUnavailable(
                f"{operation} on the queue database {self.path} failed: it stayed locked by "
                f"another process for longer than the busy timeout ({self.busy_timeout:g}s)")
        if "not a database" in text or "malformed" in text or "corrupt" in text:
            return StoreUnavailable(
                f"the queue database {self.path} is corrupt or not a SQLite database ({text})")
        if "readonly" in text or "read-only" in text:
            return StoreUnavailable(f"the queue database {self.path} is read-only ({text})")
        if "unable to open" in text:
            return StoreUnavailable(f"cannot open the queue database {self.path} ({text})")
        return QueueError(f"{operation} on the queue database {self.path} failed: {text}")

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise QueueError(f"the queue database {self.path} is closed")
        return self._conn

    @contextlib.contextmanager
    def _write(self, operation: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._connection()
            try:
                with _transaction(conn):
                    yield conn
            except sqlite3.Error as exc:
                raise self._translate(exc, operation) from None

    @contextlib.contextmanager
    def _read(self, operation: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._connection()
            try:
                # One read transaction, so the several SELECTs of stats() see one snapshot:
                # without it a concurrent enqueue between reading `counts` and the rates
                # makes the figures disagree with each other.
                conn.execute("BEGIN")
                try:
                    yield conn
                finally:
                    conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise self._translate(exc, operation) from None

    # -- enqueue ---------------------------------------------------------------------------

    def enqueue(self, jobs: Sequence[NewJob], *, now: float) -> list[int]:
        rows = [self._new_row(job, now) for job in jobs]  # encode before locking: fail whole
        ids: list[int] = []
        arrivals: dict[tuple[str, str], int] = {}
        with self._write("enqueue") as conn:
            for job, row in zip(jobs, rows):
                if job.idempotency_key is not None:
                    existing = conn.execute(
                        f"SELECT id FROM jobs WHERE idempotency_key = ? AND {_LIVE}",
                        (job.idempotency_key,)).fetchone()
                    if existing:
                        ids.append(existing[0])
                        continue
                cursor = conn.execute(_INSERT_JOB, row)
                ids.append(cursor.lastrowid)
                if not row["delayed"]:  # a delayed job arrives when it comes due (_promote)
                    key = (job.queue, job.tenant or "")
                    arrivals[key] = arrivals.get(key, 0) + 1
            for (queue, tenant), n in arrivals.items():
                _bump_rate(conn, queue, tenant, int(now), arrivals=n)
        return ids

    @staticmethod
    def _new_row(job: NewJob, now: float) -> dict[str, Any]:
        if not job.task:
            raise QueueError("a job needs a task name")
        if job.max_attempts < 1:
            raise QueueError(f"max_attempts must be at least 1, got {job.max_attempts}")
        run_at = job.run_at if job.run_at is not None else now + max(0.0, job.delay)
        return {"queue": job.queue, "task": job.task,
                "payload": encode_json(job.payload, f"the payload of {job.task}"),
                "priority": job.priority, "state": JobState.QUEUED.value, "delayed": run_at > now,
                "run_at": run_at, "max_attempts": job.max_attempts, "timeout": job.timeout,
                "idempotency_key": job.idempotency_key, "tenant": job.tenant or "", "enqueued_at": now}

    # -- promotion -------------------------------------------------------------------------

    @staticmethod
    def _promote(conn: sqlite3.Connection, now: float) -> int:
        """Make up to ``_PROMOTION_BATCH`` delayed jobs whose run_at has come due, earliest
        first; return how many.  O(jobs promoted).

        A job that never ran *arrives* now, counted in the second of its run_at
        (when it became runnable, however late this runs).  A retry coming due
        is not an arrival: see ``Stats``.
        """
        promoted = conn.execute(
            f"UPDATE jobs SET delayed = 0 WHERE id IN (SELECT id FROM jobs WHERE {_DELAYED} "
            f"AND run_at <= ? ORDER BY run_at LIMIT {_PROMOTION_BATCH}) "
            f"RETURNING queue, tenant, run_at, attempts", (now,)).fetchall()
        # Deferred jobs whose wait is over: claimable again (still waiting for their dependency
        # until a worker takes one), and no arrival: they arrived long ago.
        waited = conn.execute(
            f"UPDATE jobs SET delayed = 0 WHERE id IN (SELECT id FROM jobs "
            f"WHERE {_WAITING} AND run_at <= ? ORDER BY run_at LIMIT {_PROMOTION_BATCH})",
            (now,)).rowcount
        arrivals: dict[tuple[str, str, int], int] = {}
        for queue, tenant, run_at, attempts in promoted:
            if attempts == 0:
                key = (queue, tenant, int(run_at))
                arrivals[key] = arrivals.get(key, 0) + 1
        for (queue, tenant, second), n in arrivals.items():
            _bump_rate(conn, queue, tenant, second, arrivals=n)
        return max(len(promoted), waited)

    @staticmethod
    def _anything_due(conn: sqlite3.Connection, now: float) -> bool:
        return any(conn.execute(f"SELECT 1 FROM jobs WHERE {which} AND run_at <= ? LIMIT 1",
                                (now,)).fetchone() is not None for which in (_DELAYED, _WAITING))

    # -- claim / settle --------------------------------------------------------------------

    def claim(self, request: ClaimRequest, *, now: float) -> list[Job]:
        with self._write("claim") as conn:
            claimed = self._claim(conn, request, now)
        if request.tenant_caps is not None:
            self._caps_recorded = request.tenant_caps
        return claimed

    def settle(self, owner: str, outcomes: Iterable[Outcome], *, now: float) -> list[int]:
        outcomes = list(outcomes)
        if not outcomes:
            return []
        with self._write("settle") as conn:
            return self._settle(conn, owner, outcomes, now)

    def settle_and_claim(self, owner: str, outcomes: Iterable[Outcome],
                         request: ClaimRequest | None, *, now: float) -> tuple[list[int], list[Job]]:
        # One transaction, one fsync: a busy worker pays one commit per exchange, not two per job.
        outcomes = list(outcomes)
        with self._write("settle and claim") as conn:
            settled = self._settle(conn, owner, outcomes, now) if outcomes else []
            claimed = self._claim(conn, request, now) if request and request.limit > 0 else []
        if request is not None and request.limit > 0 and request.tenant_caps is not None:
            self._caps_recorded = request.tenant_caps
        return settled, claimed

    def _claim(self, conn: sqlite3.Connection, request: ClaimRequest, now: float) -> list[Job]:
        self._recover(conn, now, owner=None, reason="lease expired")
        self._promote(conn, now)
        caps = request.tenant_caps
        if caps is not None and caps != self._caps_recorded:
            _record_caps(conn, caps)
        if caps:
            return self._claim_within_caps(conn, request, caps, now)
        claimed: list[Job] = []
        for queue in request.queues:
            want = request.limit - len(claimed)
            if want <= 0:
                break
            # run_at <= now still guards the walk: another process's clock may run ahead.
            rows = conn.execute(
                f"UPDATE jobs SET state = 'running', lease_owner = ?, lease_expires = ?, "
                f"attempts = attempts + 1, started_at = ?, waiting_for = NULL WHERE id IN ("
                f"  SELECT id FROM jobs WHERE {_DUE} AND queue = ? AND run_at <= ?"
                f"  ORDER BY priority DESC, run_at, id LIMIT ?) RETURNING {_JOB_COLUMNS}",
                (request.owner, now + request.lease_seconds, now, queue, now, want)).fetchall()
            jobs = [_row_to_job(row) for row in rows]
            jobs.sort(key=lambda j: (-j.priority, j.run_at, j.id))
            claimed.extend(jobs)
        return claimed

    def _claim_within_caps(self, conn: sqlite3.Connection, request: ClaimRequest, caps: TenantCaps,
                           now: float) -> list[Job]:
        """The claim walk, skipping the jobs of tenants at their cap (their running jobs in every
        queue counted, the ones this claim takes included).  Each walk that finds a tenant out
        of room walks again without it, so there is one walk more per tenant that fills up."""
        running = dict(conn.execute("SELECT tenant, SUM(n) FROM counts WHERE state = 'running' "
                                    "AND tenant <> '' GROUP BY tenant"))
        room: dict[str, int] = {}
        full = {tenant for tenant, n in room_left(caps, running, list(running)).items() if n <= 0}
        claimed: list[Job] = []
        for queue in request.queues:
            while (want := request.limit - len(claimed)) > 0:
                rows = _capped_candidates(conn, queue, full, want, now)
                room.update(room_left(caps, running, [tenant for _, tenant in rows if tenant not in room]))
                taken, out_of_room = within_caps(rows, room, caps)
                full |= out_of_room
                claimed.extend(_lease(conn, request, taken, now))
                if len(rows) < want:
                    break  # the queue has no more jobs of tenants with room
        return claimed

    def _settle(self, conn: sqlite3.Connection, owner: str, outcomes: list[Outcome],
                now: float) -> list[int]:
        # One SELECT for the whole batch and one executemany per kind of ending: a busy
        # worker settles dozens of jobs per transaction.
        held = self._held(conn, owner, [outcome.job_id for outcome in outcomes])
        endings = _Endings(now)
        for outcome in outcomes:
            row = held.pop(outcome.job_id, None)  # popped: a repeated outcome is ignored
            if row is None:
                continue  # not ours any more: expired and re-claimed, or cancelled
            queue, tenant, attempts, max_attempts, started_at = row
            kind, job_id = outcome.kind, outcome.job_id
            if kind is OutcomeKind.ACK:
                endings.ack(job_id, encode_json(outcome.result, f"the result of job {job_id}"),
                            queue, tenant)
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
        endings.apply(conn, measure_holds=True)
        return endings.ids

    @staticmethod
    def _held(conn: sqlite3.Connection, owner: str, job_ids: list[int]) -> dict[int, tuple]:
        """(queue, tenant, attempts, max_attempts, started_at) of the jobs ``owner`` holds."""
        held: dict[int, tuple] = {}
        unique = list(dict.fromkeys(job_ids))
        for at in range(0, len(unique), 500):  # well under SQLite's host-parameter limit
            chunk = unique[at:at + 500]
            for row in conn.execute(
                    f"SELECT id, queue, tenant, attempts, max_attempts, started_at FROM jobs "
                    f"WHERE id IN ({','.join('?' * len(chunk))}) AND state = 'running' "
                    f"AND lease_owner = ?", (*chunk, owner)):
                held[row[0]] = row[1:]
        return held

    def renew(self, owner: str, job_ids: Iterable[int], lease_seconds: float, *, now: float) -> list[int]:
        ids = list(job_ids)
        if not ids:
            return []
        held = []
        with self._write("renew leases") as conn:
            for job_id in ids:
                cursor = conn.execute(
                    # An expired lease that nobody recovered is still the owner's: while its
                    # process lives, expiry alone never hands the job to another worker.
                    "UPDATE jobs SET lease_expires = ? WHERE id = ? AND state = 'running' "
                    "AND lease_owner = ?",
                    (now + lease_seconds, job_id, owner))
                if cursor.rowcount:
                    held.append(job_id)
        return held

    def abandon(self, owner: str, outcomes: Iterable[Outcome], *, now: float) -> list[int]:
        marks = []
        for outcome in outcomes:
            if outcome.kind not in (OutcomeKind.RELEASE, OutcomeKind.FAIL):
                raise QueueError(f"job {outcome.job_id}: only release or fail can wait for the "
                                 f"worker's exit, not {outcome.kind.value}")
            marks.append((outcome.kind.value, outcome.error, outcome.job_id, owner))
        if not marks:
            return []
        marked = []
        with self._write("abandon jobs") as conn:
            for mark in marks:
                if conn.execute(
                        "UPDATE jobs SET lease_outcome = ?, error = COALESCE(?, error) WHERE id = ? "
                        "AND state = 'running' AND lease_owner = ?", mark).rowcount:
                    marked.append(mark[2])
        return marked

    # -- recovery --------------------------------------------------------------------------

    def recover_expired(self, *, now: float) -> int:
        with self._write("recover expired leases") as conn:
            recovered = self._recover(conn, now, owner=None, reason="lease expired")
            conn.execute("DELETE FROM rates WHERE second < ?", (int(now) - _RATE_RETENTION,))
            conn.execute("DELETE FROM dependency_events WHERE second < ?", (int(now) - _RATE_RETENTION,))
            conn.execute("DELETE FROM dependency_hold_times WHERE ended_at < ?",
                         (now - _HOLD_TIMES_RETENTION,))
            return recovered

    def recover_owner(self, owner: str, *, now: float, reason: str) -> int:
        with self._write("recover a worker's jobs") as conn:
            return self._recover(conn, now, owner=owner, reason=reason)

    def _recover(self, conn: sqlite3.Connection, now: float, *, owner: str | None, reason: str) -> int:
        """Settle the jobs of a gone owner: its ``abandon`` mark if it left one, else "lost".

        Expired leases of an owner that is still a live process of this host are
        left alone: it may still be running them (a thread stuck in C), and a
        job runs again only when nothing can still be running it.
        """
        columns = _RECOVER_COLUMNS
        if owner is None:
            rows = [row for row in conn.execute(
                f"SELECT {columns} FROM jobs WHERE state = 'running' AND lease_expires < ?", (now,))
                if owner_alive_here(row[3]) is not True]
            rows = _left_to_rescue(conn, rows, "hosts")
        else:
            rows = conn.execute(
                f"SELECT {columns} FROM jobs WHERE state = 'running' AND lease_expires IS NOT NULL "
                f"AND lease_owner = ?", (owner,)).fetchall()
        endings = _Endings(now)
        for job_id, attempts, max_attempts, gone, started_at, queue, tenant, mark, error in rows:
            if mark == OutcomeKind.RELEASE.value:
                endings.release(job_id)  # given up at the end of a drain
                endings.record(job_id, attempts, gone, started_at, mark, None)
            elif mark == OutcomeKind.FAIL.value:
                endings.fail(job_id, attempts, max_attempts, error, queue, tenant, self._rng)
                endings.record(job_id, attempts, gone, started_at, mark, error)
            else:
                error = f"{reason} (worker {gone})"
                endings.lose(job_id, attempts, max_attempts, error, queue, tenant)
                endings.record(job_id, attempts, gone, started_at, "lost", error)
        endings.apply(conn)
        return len(rows)

    def lease_owners(self) -> dict[str, int]:
        with self._read("list lease owners") as conn:
            return dict(conn.execute(
                "SELECT lease_owner, COUNT(*) FROM jobs WHERE state = 'running' "
                "AND lease_expires IS NOT NULL GROUP BY lease_owner").fetchall())

    # -- management ------------------------------------------------------------------------

    def cancel(self, job_id: int, *, now: float) -> bool:
        with self._write("cancel") as conn:
            self._promote(conn, now)  # a job that came due arrived, cancelled or not
            cursor = conn.execute(
                f"UPDATE jobs SET state = 'cancelled', finished_at = ?, {_UNLEASED} "
                f"WHERE id = ? AND state IN ('queued', 'running', 'dead')", (now, job_id))
            if cursor.rowcount:
                _free_holds(conn, [job_id], now, measure=False)
                return True
            if conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None:
                raise JobNotFound(f"no job with id {job_id}")
            return False

    def get(self, job_id: int) -> Job:
        with self._read("read a job") as conn:
            row = conn.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise JobNotFound(f"no job with id {job_id}")
        return _row_to_job(row)

    def list_jobs(self, *, queue: str | None = None, state: JobState | None = None,
                  limit: int = 50) -> list[Job]:
        where, args = [], []
        if queue is not None:
            where.append("queue = ?")
            args.append(queue)
        if state is not None:
            where.append("state = ?")
            args.append(JobState(state).value)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        with self._read("list jobs") as conn:
            rows = conn.execute(f"SELECT {_JOB_COLUMNS} FROM jobs {clause} ORDER BY id DESC LIMIT ?",
                                (*args, limit)).fetchall()
        return [_row_to_job(row) for row in rows]

    def retry_dead(self, *, queue: str | None = None, job_ids: Iterable[int] | None = None,
                   now: float) -> int:
        where, args = ["state = 'dead'"], []
        if queue is not None:
            where.append("queue = ?")
            args.append(queue)
        ids = list(job_ids) if job_ids is not None else None
        if ids is not None:
            if not ids:
                return 0
            where.append(f"id IN ({','.join('?' * len(ids))})")
            args.extend(ids)
        # A revived job arrives again: it had left the queue for good.
        revive = ("UPDATE jobs SET state = 'queued', delayed = 0, attempts = 0, run_at = ?, "
                  "finished_at = NULL WHERE ")
        with self._write("retry dead jobs") as conn:
            revived = conn.execute(revive + " AND ".join(where + ["idempotency_key IS NULL"])
                                   + " RETURNING queue, tenant", (now, *args)).fetchall()
            # A key may be live again (re-enqueued after this job died) or shared by several
            # dead jobs: reviving them all would run the same work twice (and break the unique
            # index), so only the newest dead job of a free key comes back.
            keyed = conn.execute(
                f"SELECT id, idempotency_key FROM jobs WHERE {' AND '.join(where)} "
                f"AND idempotency_key IS NOT NULL ORDER BY id DESC", args).fetchall()
            for job_id, key in keyed:
                revived += conn.execute(
                    revive + f"id = ? AND NOT EXISTS (SELECT 1 FROM jobs WHERE idempotency_key = ? "
                    f"AND {_LIVE}) RETURNING queue, tenant", (now, job_id, key)).fetchall()
            arrivals: dict[tuple[str, str], int] = {}
            for queue_tenant in revived:
                arrivals[queue_tenant] = arrivals.get(queue_tenant, 0) + 1
            for (name, tenant), n in arrivals.items():
                _bump_rate(conn, name, tenant, int(now), arrivals=n)
            return len(revived)

    def purge(self, *, states: Sequence[JobState], finished_before: float,
              queue: str | None = None, sweep: bool = False) -> int:
        queues = [queue] if queue is not None else self.queues()
        removed = 0
        with self._write("purge finished jobs") as conn:
            for name in queues:
                for state in states:
                    state = JobState(state)
                    if state not in FINISHED_STATES:
                        raise QueueError(f"only finished jobs can be purged, not {state.value} ones")
                    gone = conn.execute(
                        "DELETE FROM jobs WHERE queue = ? AND state = ? AND finished_at < ? RETURNING id",
                        (name, state.value, finished_before)).fetchall()
                    conn.executemany("DELETE FROM executions WHERE job_id = ?", gone)
                    removed += len(gone)
        return removed

    def queues(self) -> list[str]:
        with self._read("list queues") as conn:
            return [row[0] for row in conn.execute("SELECT DISTINCT queue FROM counts ORDER BY queue")]

    def executions(self, *, job_id: int | None = None, limit: int | None = None) -> list[dict]:
        clause, args = ("WHERE job_id = ?", [job_id]) if job_id is not None else ("", [])
        tail = " LIMIT ?" if limit is not None else ""
        if limit is not None:
            args.append(limit)
        with self._read("list executions") as conn:
            rows = conn.execute(
                f"SELECT job_id, attempt, worker, started_at, finished_at, outcome, error "
                f"FROM executions {clause} ORDER BY id{tail}", args).fetchall()
        keys = ("job_id", "attempt", "worker", "started_at", "finished_at", "outcome", "error")
        return [dict(zip(keys, row)) for row in rows]

    def ended_attempts(self, after: int | None, *, limit: int = 10_000) -> tuple[int, list[EndedAttempt]]:
        with self._read("read ended attempts") as conn:
            if after is None:
                return conn.execute("SELECT COALESCE(MAX(id), 0) FROM executions").fetchone()[0], []
            # A range of the primary key, each job found by its own: no scan, however many rows.
            rows = conn.execute(
                "SELECT e.id, j.queue, j.task, e.outcome, e.finished_at - e.started_at, "
                "e.outcome = 'dead' OR (e.outcome IN ('fail', 'lost') AND e.attempt >= j.max_attempts) "
                "FROM executions e LEFT JOIN jobs j ON j.id = e.job_id WHERE e.id > ? ORDER BY e.id LIMIT ?",
                (after, limit)).fetchall()
        cursor = rows[-1][0] if rows else after
        return cursor, [EndedAttempt(queue=queue, task=task, outcome=outcome, seconds=seconds,
                                     dead_lettered=bool(dead))
                        for _, queue, task, outcome, seconds, dead in rows if queue is not None]

    def arrivals_since(self, queue: str, second: int) -> dict[int, int]:
        with self._read("read arrivals") as conn:
            return dict(conn.execute(
                "SELECT second, SUM(arrivals) FROM rates WHERE queue = ? AND second >= ? "
                "GROUP BY second HAVING SUM(arrivals) > 0", (queue, second)).fetchall())

    # -- dependency limits -------------------------------------------------------------------

    def admit(self, owner: str, job_id: int, dependencies: Sequence[DependencyLimit], *,
              now: float) -> Deferral | None:
        limits = _distinct(dependencies)
        if not limits:
            return None
        with self._write("admit a job to its dependencies") as conn:
            return _admit(conn, owner, job_id, limits, now)

    def admit_many(self, owner: str, requests: Sequence[tuple[int, Sequence[DependencyLimit]]], *,
                   now: float) -> dict[int, Deferral | None]:
        with self._write("admit jobs to their dependencies") as conn:
            return {job_id: _admit(conn, owner, job_id, _distinct(limits), now) if limits else None
                    for job_id, limits in requests}

    def dependency_stats(self, dependency: str, *, now: float, window: float = 60.0) -> DependencyStats:
        if not window > 0:
            raise QueueError(f"a stats window must be more than 0s, got {window!r}")
        with self._read("read dependency stats") as conn:
            return _dependency_stats(conn, dependency, now, window)

    # -- stats -----------------------------------------------------------------------------

    def first_claims(self, owners: Iterable[str]) -> dict[str, float]:
        found: dict[str, float] = {}
        with self._read("read first claims") as conn:
            for owner in owners:
                running = conn.execute("SELECT MIN(started_at) FROM jobs WHERE state = 'running' "
                                       "AND lease_owner = ?", (owner,)).fetchone()[0]
                ended = conn.execute("SELECT MIN(started_at) FROM executions WHERE worker = ?",
                                     (owner,)).fetchone()[0]
                times = [t for t in (running, ended) if t is not None]
                if times:
                    found[owner] = min(times)
        return found

    def stats(self, queue: str, *, now: float, window: float = 60.0, horizon: float = 0.0) -> Stats:
        """The queue's signals, read from ``counts`` and ``rates`` and a bounded sample.

        Its cost grows with the tenants that hold jobs or had events in the window
        and with the delayed jobs that came due since the last promotion, never
        with the backlog, the delayed jobs or the tenants of the past.
        """
        if not window > 0:
            raise QueueError(f"a stats window must be more than 0s, got {window!r}")
        if not horizon >= 0 or math.isinf(horizon):
            raise QueueError(f"a coming-due horizon must be 0s or more, got {horizon!r}")
        while True:
            with self._read("read stats") as conn:
                if not self._anything_due(conn, now):
                    return _read_stats(conn, queue, now, window, horizon)
            # Delayed jobs came due: promote them, and read in the transaction that
            # promoted the last of them, so the figures count them (as runnable and as
            # arrivals) exactly.
            with self._write("read stats") as conn:
                if self._promote(conn, now) < _PROMOTION_BATCH:
                    return _read_stats(conn, queue, now, window, horizon)


    # -- hosts of a fleet (one host here, kept by the same code as on PostgreSQL) ----------

    def heartbeat(self, host: str, *, now: float, interval: float,
                  report: Mapping[str, Any] | None = None) -> None:
        text = encode_report(report or {})
        with self._write("record a heartbeat") as conn:
            conn.execute(
                "INSERT INTO hosts (name, last_beat, interval, report, registered_at) VALUES (?,?,?,?,?) "
                "ON CONFLICT (name) DO UPDATE SET last_beat = excluded.last_beat, "
                "interval = excluded.interval, report = excluded.report",
                (host, now, interval, text, now))

    def hosts(self, *, now: float) -> list[HostInfo]:
        with self._read("list hosts") as conn:
            return [host_info(*row, now=now) for row in conn.execute(
                "SELECT name, last_beat, interval, report, registered_at FROM hosts ORDER BY name")]

    def forget_host(self, host: str) -> bool:
        with self._write("forget a host") as conn:
            return conn.execute("DELETE FROM hosts WHERE name = ?", (host,)).rowcount > 0

    def rescue_dead_hosts(self, *, now: float, exclude: Sequence[str] = ()) -> dict[str, int]:
        with self._write("rescue the jobs of dead hosts") as conn:
            dead = _dead_hosts(conn.execute("SELECT name, last_beat, interval FROM hosts"), now, exclude)
            if not dead:
                return {}
            rows = conn.execute(f"SELECT {_RECOVER_COLUMNS} FROM jobs WHERE state = 'running' "
                                f"AND lease_expires < ?", (now,)).fetchall()
            endings, rescued = _rescue(rows, dead, now, self._rng)
            endings.apply(conn)
            return rescued


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction, taken at once (BEGIN IMMEDIATE): never a lock upgrade."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    else:
        conn.execute("COMMIT")


def _bump_rate(conn: sqlite3.Connection, queue: str, tenant: str, second: int, *,
               arrivals: int = 0, completions: int = 0, failures: int = 0) -> None:
    conn.execute(
        "INSERT INTO rates (queue, second, tenant, arrivals, completions, failures) "
        "VALUES (?,?,?,?,?,?) ON CONFLICT (queue, second, tenant) DO UPDATE SET "
        "arrivals = arrivals + excluded.arrivals, completions = completions + excluded.completions, "
        "failures = failures + excluded.failures",
        (queue, second, tenant, arrivals, completions, failures))


class _Endings:
    """The row changes of attempts that ended, applied together (one executemany per kind).

    Settling and recovering both end attempts; this is the one place that says what
    each ending does to a job, to its executions and to the rates.
    """

    def __init__(self, now: float) -> None:
        self.now = now
        self.ids: list[int] = []
        self._acks: list[tuple] = []
        self._releases: list[tuple] = []
        self._losses: list[tuple] = []
        self._retries: list[tuple] = []
        self._deaths: list[tuple] = []
        self._deferrals: list[tuple] = []
        self._executions: list[tuple] = []
        self._tallies: dict[tuple[str, str], list[int]] = {}  # (completions, failures)

    def ack(self, job_id: int, result: str, queue: str, tenant: str) -> None:
        self._acks.append((self.now, result, job_id))
        self._tally(queue, tenant, 0)

    def release(self, job_id: int) -> None:
        self._releases.append((job_id,))

    def defer(self, job_id: int, run_at: float, dependency: str) -> None:
        self._deferrals.append((run_at, dependency, job_id))
        self.ids.append(job_id)

    def bury(self, job_id: int, error: str | None, queue: str, tenant: str) -> None:
        self._deaths.append((self.now, error, job_id))
        self._tally(queue, tenant, 1)

    def fail(self, job_id: int, attempts: int, max_attempts: int, error: str | None, queue: str,
             tenant: str, rng: random.Random) -> None:
        if attempts >= max_attempts:
            self.bury(job_id, error, queue, tenant)
            return
        run_at = self.now + retry_delay(attempts, rng=rng)
        self._retries.append((run_at > self.now, run_at, error, job_id))
        self._tally(queue, tenant, 1)

    def lose(self, job_id: int, attempts: int, max_attempts: int, error: str, queue: str,
             tenant: str) -> None:
        if attempts >= max_attempts:
            self.bury(job_id, error, queue, tenant)
            return
        self._losses.append((error, job_id))
        self._tally(queue, tenant, 1)  # a lost attempt is a failed one

    def record(self, job_id: int, attempt: int, worker: str, started_at: float | None,
               outcome: str, error: str | None) -> None:
        self._executions.append((job_id, attempt, worker, started_at, self.now, outcome, error))
        self.ids.append(job_id)

    def _tally(self, queue: str, tenant: str, which: int) -> None:
        self._tallies.setdefault((queue, tenant), [0, 0])[which] += 1

    def apply(self, conn: sqlite3.Connection, *, measure_holds: bool = False) -> None:
        """Write the endings; free the jobs' dependency slots (their hold times measured when
        ``measure_holds``: the job ran to an end it chose, not one a recovery found)."""
        for sql, rows in ((_ACK, self._acks), (_RELEASE, self._releases), (_LOSE, self._losses),
                          (_RETRY, self._retries), (_DEAD_LETTER, self._deaths),
                          (_DEFER, self._deferrals), (_RECORD, self._executions)):
            if rows:
                conn.executemany(sql, rows)
        _free_holds(conn, self.ids, self.now, measure=measure_holds)
        for (queue, tenant), (completions, failures) in self._tallies.items():
            _bump_rate(conn, queue, tenant, int(self.now), completions=completions, failures=failures)


def _left_to_rescue(conn: Any, rows: list, table: str) -> list:
    """The expired leases (``_RECOVER_COLUMNS`` rows) not held by a worker of another registered
    host: a live one recovers its own workers' jobs (it can tell whether they still run), a dead
    one's are handed back by ``rescue_dead_hosts`` with no attempt used."""
    others = {parts[0] for parts in (owner_parts(row[3] or "") for row in rows)
              if parts is not None and parts[0] != this_host()}
    if not others:
        return rows
    registered = {name for (name,) in conn.execute(f"SELECT name FROM {table}")}
    return [row for row in rows if (owner_parts(row[3] or "") or ("",))[0] not in registered - {this_host()}]


def _dead_hosts(rows: Iterable[tuple], now: float, exclude: Sequence[str]) -> set[str]:
    """Names of the hosts in ``rows`` (name, last_beat, interval) that are dead at ``now``."""
    return {name for name, last_beat, interval in rows
            if name not in exclude and not is_alive(last_beat, interval, now)}


def _rescue(rows: Iterable[tuple], dead: set[str], now: float,
            rng: random.Random) -> tuple[_Endings, dict[str, int]]:
    """The endings of the running jobs (``_RECOVER_COLUMNS``) whose owner's host is in ``dead``:
    released with no attempt used (the host stopped, not the job), unless the owner's
    ``abandon`` marked it failed; and how many per host."""
    endings = _Endings(now)
    rescued: dict[str, int] = {}
    for job_id, attempts, max_attempts, owner, started_at, queue, tenant, mark, error in rows:
        parts = owner_parts(owner or "")
        if parts is None or parts[0] not in dead:
            continue
        host = parts[0]
        if mark == OutcomeKind.FAIL.value:
            endings.fail(job_id, attempts, max_attempts, error, queue, tenant, rng)
            endings.record(job_id, attempts, owner, started_at, mark, error)
        else:
            endings.release(job_id)
            endings.record(job_id, attempts, owner, started_at, OutcomeKind.RELEASE.value,
                           f"host {host} stopped beating (worker {owner})")
        rescued[host] = rescued.get(host, 0) + 1
    return endings, rescued


def _read_stats(conn: sqlite3.Connection, queue: str, now: float, window: float,
                due_within: float = 0.0) -> Stats:
    """Queue-wide and per-tenant stats, each tenant's from its counts rows, rates and share
    of the queue's duration sample (the untenanted share has key '')."""
    counts: dict[str, dict[str, int]] = {}
    for state, tenant, n in conn.execute(
            f"SELECT state, tenant, n FROM counts WHERE queue = ? AND state IN {_WAITING_OR_HELD}",
            (queue,)):
        counts.setdefault(tenant, {})[state] = n
    events: dict[str, list[int]] = {}
    for tenant, arrivals, completions, failures in conn.execute(
            "SELECT tenant, arrivals, completions, failures FROM rates WHERE queue = ? AND second > ?",
            (queue, now - window)):
        tally = events.setdefault(tenant, [0, 0, 0])
        tally[0] += arrivals
        tally[1] += completions
        tally[2] += failures
    sample = ("SELECT {} FROM jobs WHERE queue = ? AND state = 'done' AND finished_at >= ? "
              f"AND started_at IS NOT NULL ORDER BY finished_at DESC LIMIT {_DURATION_SAMPLE}")
    horizon = now - max(window, _DURATION_HORIZON)
    shares: dict[str, list[float]] = {}  # of named tenants: the untenanted share is never shown
    recent_since = now - RECENT_WINDOW
    durations, recent = [], []
    if any(counts) or any(events):
        for tenant, finished_at, duration in conn.execute(
                sample.format("tenant, finished_at, finished_at - started_at"), (queue, horizon)):
            durations.append(duration)
            if finished_at >= recent_since:
                recent.append(duration)
            if tenant:
                shares.setdefault(tenant, []).append(duration)
    else:  # no tenant to share it among: a narrower row, cheaper to read
        for finished_at, duration in conn.execute(sample.format("finished_at, finished_at - started_at"),
                                                  (queue, horizon)):
            durations.append(duration)
            if finished_at >= recent_since:
                recent.append(duration)
    per_tenant = {}
    for tenant in sorted(counts.keys() | events.keys()):
        by_state = counts.get(tenant, {})
        oldest = 0.0
        if by_state.get("queued"):
            first = conn.execute(f"SELECT MIN(run_at) FROM jobs WHERE {_DUE} AND waiting_for IS NULL AND queue = ? "
                                 f"AND tenant = ?", (queue, tenant)).fetchone()[0]
            if first is not None and first <= now:
                oldest = now - first
        arrivals, completions, failures = events.get(tenant, (0, 0, 0))
        per_tenant[tenant] = _stats(
            queue, window, runnable=by_state.get("queued", 0), delayed=by_state.get("delayed", 0),
            waiting=by_state.get("waiting", 0),
            running=by_state.get("running", 0), dead=by_state.get("dead", 0), oldest=oldest,
            arrivals=arrivals, completions=completions, failures=failures,
            durations=sorted(shares.get(tenant, ())))
    caps = TenantCaps(dict(conn.execute("SELECT tenant, max_running FROM tenant_caps")))
    if caps and any(p.runnable for p in per_tenant.values()):
        running = dict(conn.execute("SELECT tenant, SUM(n) FROM counts WHERE state = 'running' "
                                    "AND tenant <> '' GROUP BY tenant"))
        per_tenant = hold_capped(per_tenant, caps, running)
    parts = per_tenant.values()
    coming = 0
    if due_within > 0 and any(p.delayed for p in parts):
        coming = conn.execute(
            f"SELECT COUNT(*) FROM (SELECT 1 FROM jobs WHERE {_DELAYED} AND queue = ? AND run_at <= ? "
            f"LIMIT {COMING_DUE_LIMIT})", (queue, now + due_within)).fetchone()[0]
    running_age = None
    if any(p.running for p in parts):
        count, total = conn.execute(
            "SELECT COUNT(*), TOTAL(? - started_at) FROM jobs WHERE state = 'running' AND queue = ? "
            "AND started_at IS NOT NULL", (now, queue)).fetchone()
        running_age = max(0.0, total / count) if count else None
    overall = _stats(
        queue, window, runnable=sum(p.runnable for p in parts), delayed=sum(p.delayed for p in parts),
        waiting=sum(p.waiting_for_dependency for p in parts),
        running=sum(p.running for p in parts), dead=sum(p.dead for p in parts),
        oldest=max((p.oldest_runnable_age for p in parts), default=0.0),
        held=sum(p.held_by_tenant_cap for p in parts),
        arrivals=sum(events_of[0] for events_of in events.values()),
        completions=sum(events_of[1] for events_of in events.values()),
        failures=sum(events_of[2] for events_of in events.values()),
        durations=sorted(durations),
        tenants={name: stats for name, stats in per_tenant.items() if name})
    return dataclasses.replace(overall, coming_due=coming, coming_due_within=float(due_within),
                               running_age_mean=running_age,
                               recent_duration_p50=percentile(sorted(recent), 0.50),
                               recent_completions=len(recent))


def _stats(queue: str, window: float, *, runnable: int, delayed: int, running: int, dead: int,
           oldest: float, arrivals: int, completions: int, failures: int,
           durations: Sequence[float], tenants: dict[str, Stats] | None = None, waiting: int = 0,
           held: int = 0) -> Stats:
    return Stats(queue=queue, runnable=runnable, delayed=delayed, running=running, dead=dead,
                 waiting_for_dependency=waiting, held_by_tenant_cap=held,
                 oldest_runnable_age=oldest, arrival_rate=arrivals / window,
                 completion_rate=completions / window, failure_rate=failures / window,
                 duration_p50=percentile(durations, 0.50), duration_p95=percentile(durations, 0.95),
                 duration_p99=percentile(durations, 0.99), window=window, tenants=tenants or {})


# -- tenant caps ---------------------------------------------------------------------------

def hold_capped(per_tenant: dict[str, Stats], caps: TenantCaps, running: dict[str, int]) -> dict[str, Stats]:
    """Each tenant's stats with the due jobs its cap holds back moved from runnable to
    ``held_by_tenant_cap`` (see ``Stats``); ``running``: its running jobs in every queue."""
    held_back = {}
    for tenant, stats in per_tenant.items():
        cap = caps.cap_of(tenant)
        if cap is None or not stats.runnable:
            held_back[tenant] = stats
            continue
        room = max(0, cap - int(running.get(tenant, 0)))
        held = max(0, stats.runnable - room)
        held_back[tenant] = dataclasses.replace(
            stats, runnable=stats.runnable - held, held_by_tenant_cap=held,
            oldest_runnable_age=stats.oldest_runnable_age if stats.runnable > held else 0.0)
    return held_back


def _capped_candidates(conn: sqlite3.Connection, queue: str, full: set[str], want: int,
                       now: float) -> list[tuple[int, str]]:
    """The first ``want`` due jobs of ``queue`` in claim order, of tenants not in ``full``.

    With tenants at their cap, and few others with jobs here: the head of each
    other tenant's jobs (one index range each), merged -- not a walk of the
    claim order past every job of the capped tenants, however long their backlog.
    """
    if full:
        tenants = [tenant for (tenant,) in conn.execute(
            "SELECT DISTINCT tenant FROM counts WHERE queue = ? AND state IN ('queued', 'waiting')", (queue,))
            if tenant not in full]
        if len(tenants) <= _HEADS_MAX:
            heads = [row for tenant in tenants for row in conn.execute(
                f"SELECT id, tenant, priority, run_at FROM jobs WHERE {_DUE} AND queue = ? AND tenant = ? "
                f"AND run_at <= ? ORDER BY priority DESC, run_at, id LIMIT ?", (queue, tenant, now, want))]
            heads.sort(key=lambda row: (-row[2], row[3], row[0]))
            return [(job_id, tenant) for job_id, tenant, _, _ in heads[:want]]
    skip = sorted(full)
    return conn.execute(
        f"SELECT id, tenant FROM jobs WHERE {_DUE} AND queue = ? AND run_at <= ? "
        f"AND tenant NOT IN ({','.join('?' * len(skip))}) "
        f"ORDER BY priority DESC, run_at, id LIMIT ?", (queue, now, *skip, want)).fetchall()


def _record_caps(conn: sqlite3.Connection, caps: TenantCaps) -> None:
    """Store the caps the workers claim with (for stats), in place of the ones stored."""
    conn.execute("DELETE FROM tenant_caps")
    conn.executemany("INSERT INTO tenant_caps (tenant, max_running) VALUES (?, ?)",
                     sorted(caps.max_running.items()))


def _lease(conn: sqlite3.Connection, request: ClaimRequest, job_ids: Sequence[int], now: float) -> list[Job]:
    """Lease the due jobs ``job_ids`` to ``request.owner``; return them in claim order."""
    if not job_ids:
        return []
    rows = conn.execute(
        f"UPDATE jobs SET state = 'running', lease_owner = ?, lease_expires = ?, attempts = attempts + 1, "
        f"started_at = ?, waiting_for = NULL WHERE id IN ({','.join('?' * len(job_ids))}) "
        f"RETURNING {_JOB_COLUMNS}", (request.owner, now + request.lease_seconds, now, *job_ids)).fetchall()
    jobs = [_row_to_job(row) for row in rows]
    jobs.sort(key=lambda j: (-j.priority, j.run_at, j.id))
    return jobs


# -- dependency limits ---------------------------------------------------------------------

def _free_holds(conn: sqlite3.Connection, job_ids: Sequence[int], now: float, *, measure: bool) -> None:
    """Delete the dependency holds of jobs whose attempt ended; record how long each was held."""
    if not job_ids or conn.execute("SELECT 1 FROM dependency_holds LIMIT 1").fetchone() is None:
        return  # nothing is held anywhere: no lookup per job
    for job_id in job_ids:
        freed = conn.execute("DELETE FROM dependency_holds WHERE job_id = ? RETURNING dependency, since",
                             (job_id,)).fetchall()
        if measure and freed:
            conn.executemany("INSERT INTO dependency_hold_times (dependency, ended_at, seconds) "
                             "VALUES (?, ?, ?)", [(name, now, max(0.0, now - since)) for name, since in freed])


def _bump_dependency(conn: sqlite3.Connection, dependency: str, second: int, *,
                     admitted: int = 0, deferred: int = 0) -> None:
    conn.execute(
        "INSERT INTO dependency_events (dependency, second, admitted, deferred) VALUES (?,?,?,?) "
        "ON CONFLICT (dependency, second) DO UPDATE SET admitted = admitted + excluded.admitted, "
        "deferred = deferred + excluded.deferred", (dependency, second, admitted, deferred))


def _typical_hold(conn: sqlite3.Connection, dependency: str, now: float) -> float | None:
    recent = sorted(row[0] for row in conn.execute(
        "SELECT seconds FROM dependency_hold_times WHERE dependency = ? AND ended_at >= ? "
        f"ORDER BY ended_at DESC LIMIT {_TYPICAL_HOLD_SAMPLE}", (dependency, now - _DURATION_HORIZON)))
    return nearest_rank(recent, 0.5)


def _distinct(dependencies: Sequence[DependencyLimit]) -> list[DependencyLimit]:
    """One limit per dependency name (the last given), in the order first named."""
    return list({limit.name: limit for limit in dependencies}.values())


def _admit(conn: sqlite3.Connection, owner: str, job_id: int, limits: Sequence[DependencyLimit],
           now: float) -> Deferral | None:
    """``Backend.admit`` inside the caller's write transaction."""
    if conn.execute("SELECT 1 FROM jobs WHERE id = ? AND state = 'running' AND lease_owner = ?",
                    (job_id, owner)).fetchone() is None:
        return Deferral(limits[0].name, 0.0)
    if conn.execute("SELECT 1 FROM dependency_holds WHERE job_id = ? AND owner = ? LIMIT 1",
                    (job_id, owner)).fetchone() is not None:
        return None  # admitted before: idempotent
    refusals: list[Deferral] = []
    new_tats: dict[str, float] = {}
    for limit in limits:
        waits = []
        if limit.concurrency is not None:
            ages = [now - since for (since,) in conn.execute(_LIVE_HOLDS, (limit.name,))]
            if len(ages) >= limit.concurrency:
                waits.append(slot_wait(ages, _typical_hold(conn, limit.name, now)))
        if limit.rate is not None:
            row = conn.execute("SELECT tat FROM dependency_tat WHERE dependency = ?", (limit.name,)).fetchone()
            tat, wait = gcra(row[0] if row else None, now, limit.rate, limit.effective_burst)
            if tat is None:
                waits.append(wait)
            else:
                new_tats[limit.name] = tat
        if waits:
            refusals.append(Deferral(limit.name, max(waits)))
    second = int(now)
    if refusals:
        refusal = max(refusals, key=lambda r: r.wait)
        _bump_dependency(conn, refusal.dependency, second, deferred=1)
        return refusal
    conn.executemany("INSERT OR REPLACE INTO dependency_holds (dependency, job_id, owner, since) "
                     "VALUES (?, ?, ?, ?)",
                     [(limit.name, job_id, owner, now) for limit in limits if limit.concurrency is not None])
    conn.executemany("INSERT INTO dependency_tat (dependency, tat) VALUES (?, ?) "
                     "ON CONFLICT (dependency) DO UPDATE SET tat = excluded.tat", list(new_tats.items()))
    for limit in limits:
        _bump_dependency(conn, limit.name, second, admitted=1)
    return None


def _dependency_stats(conn: sqlite3.Connection, dependency: str, now: float, window: float) -> DependencyStats:
    in_use = len(conn.execute(_LIVE_HOLDS, (dependency,)).fetchall())
    waiting = conn.execute(
        f"SELECT COUNT(*) FROM (SELECT 1 FROM jobs WHERE state = 'queued' AND waiting_for = ? "
        f"LIMIT {COMING_DUE_LIMIT})", (dependency,)).fetchone()[0]
    holds = sorted(row[0] for row in conn.execute(
        "SELECT seconds FROM dependency_hold_times WHERE dependency = ? AND ended_at > ? "
        f"ORDER BY ended_at DESC LIMIT {_HOLD_SAMPLE}", (dependency, now - window)))
    admitted, deferred = conn.execute(
        "SELECT TOTAL(admitted), TOTAL(deferred) FROM dependency_events WHERE dependency = ? AND second > ?",
        (dependency, now - window)).fetchone()
    return DependencyStats(dependency=dependency, in_use=in_use, waiting=waiting,
                           hold_p50=nearest_rank(holds, 0.5), hold_p95=nearest_rank(holds, 0.95),
                           holds_ended=len(holds), admitted_rate=admitted / window,
                           deferred_rate=deferred / window, window=window)
