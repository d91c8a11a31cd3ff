"""The PostgreSQL job store: the SQLite store's model, shared by many machines.

One connection per backend, in autocommit mode, every method one explicit
transaction.  Claims walk the claim index with ``FOR UPDATE SKIP LOCKED``, so
workers claiming at once take different jobs without waiting on each other;
recovery and promotion skip locked rows too, so maintenance may run from several
processes at once.

A connection that dropped (server restart, ``pg_terminate_backend``, a network
cut) is opened again and the transaction run again -- when the failure came
before the COMMIT was sent.  During the COMMIT, nobody knows whether it happened:
claims find out from the jobs they stamp (``_exchange``); other calls raise
``CommitUnknown``, so a worker's claims and results are never lost or doubled.  A deadlock or
serialization failure is retried like a dropped connection.

``subscribe`` wakes idle workers with LISTEN/NOTIFY: every transaction that makes
jobs due notifies the channel of their queue (see postgres_listen.py).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import random
import threading
from typing import Any, Callable, Iterable, Mapping, Sequence

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict

from ..errors import JobNotFound, QueueError, StoreUnavailable
from .backend import Backend, EndedAttempt
from .hosts import HostInfo, encode_report, host_info
from .limits import (DependencyLimit, TenantCaps, deferral_delay, nearest_rank, plan_admissions, room_left,
                     slot_wait, within_caps)
from .owners import owner_alive_here
from .postgres_listen import Listener, channel_of
from .postgres_schema import MIGRATIONS, SCHEMA, SCHEMA_VERSION, VERSION_TABLE
from .sqlite import (_RECOVER_COLUMNS, COMING_DUE_LIMIT, _dead_hosts, _distinct, _Endings, _left_to_rescue,
                     _rescue, _row_to_job, _stats, encode_json, hold_capped, percentile)
from .types import (FINISHED_STATES, RECENT_WINDOW, ClaimRequest, Deferral, DependencyStats, Job, JobState, NewJob,
                    Outcome, OutcomeKind, Stats)

log = logging.getLogger(__name__)

_JOB_COLUMNS = ("id, queue, task, payload, priority, state, run_at, attempts, max_attempts, "
                "timeout, idempotency_key, tenant, lease_owner, lease_expires, enqueued_at, "
                "started_at, finished_at, result, error")
# A batch is one INSERT of arrays (one trigger run, one round trip), with ids taken from
# the sequence first so they follow the batch's order.  A live idempotency key makes a
# row's insert a no-op (the unique partial index decides, so two producers racing with
# one key cannot both insert); the job that holds the key is looked up after.
_NEW_JOB_TYPES = (("id", "bigint"), ("queue", "text"), ("task", "text"), ("payload", "text"),
                  ("priority", "integer"), ("state", "text"), ("delayed", "boolean"),
                  ("run_at", "double precision"), ("max_attempts", "integer"),
                  ("timeout", "double precision"), ("idempotency_key", "text"), ("tenant", "text"),
                  ("enqueued_at", "double precision"))
_INSERT_JOBS = (f"INSERT INTO flexiq_jobs ({', '.join(name for name, _ in _NEW_JOB_TYPES)}) "
                f"SELECT * FROM unnest({', '.join(f'%s::{kind}[]' for _, kind in _NEW_JOB_TYPES)}) "
                f"ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL "
                f"AND state IN ('queued', 'running') DO NOTHING RETURNING id")
_NEW_IDS = "SELECT nextval(pg_get_serial_sequence('flexiq_jobs', 'id')) FROM generate_series(1, %s)"

# The same bounds as the SQLite store's, for the same reasons (see sqlite.py).
_DURATION_SAMPLE = 1000
_DURATION_HORIZON = 300.0
_RATE_RETENTION = 3600
_PROMOTION_BATCH = 10_000
# A worker folds the appended count and rate changes into their totals every this many
# claims (a stats read folds them too): a few hundred rows, a millisecond.
_FOLD_EVERY = 200
# A gap in the attempts' ids this old (seconds, server clock) will not be filled: no
# transaction of the store stays open that long after recording an attempt.
_GAP_SETTLE = 10.0

_UNLEASED = "lease_owner = NULL, lease_expires = NULL, lease_outcome = NULL"
_REQUEUED = f"state = 'queued', started_at = NULL, {_UNLEASED}"
_ACK = f"UPDATE flexiq_jobs SET state = 'done', finished_at = %s, result = %s, error = NULL, {_UNLEASED} WHERE id = %s"
_RELEASE = f"UPDATE flexiq_jobs SET {_REQUEUED}, delayed = false, attempts = attempts - 1 WHERE id = %s"
_LOSE = f"UPDATE flexiq_jobs SET {_REQUEUED}, delayed = false, error = %s WHERE id = %s"
_RETRY = f"UPDATE flexiq_jobs SET {_REQUEUED}, delayed = %s, run_at = %s, error = %s WHERE id = %s"
_DEAD_LETTER = f"UPDATE flexiq_jobs SET state = 'dead', finished_at = %s, error = %s, {_UNLEASED} WHERE id = %s"
# Deferred (never started: a dependency was full): no attempt used, waiting until run_at.
_DEFER = (f"UPDATE flexiq_jobs SET {_REQUEUED}, attempts = attempts - 1, delayed = true, run_at = %s, "
          f"waiting_for = %s WHERE id = %s")
_RECORD = ("INSERT INTO flexiq_executions (job_id, attempt, worker, started_at, finished_at, outcome, error) "
           "VALUES (%s, %s, %s, %s, %s, %s, %s)")
# The same two for a whole batch in one statement each: psycopg 3.1's executemany sends a
# statement per row, and a worker's settle batch is mostly acks and their executions.
_ACK_BATCH = (f"UPDATE flexiq_jobs SET state = 'done', finished_at = v.finished_at, result = v.result, "
              f"error = NULL, {_UNLEASED} "
              f"FROM unnest(%s::float8[], %s::text[], %s::bigint[]) AS v(finished_at, result, id) "
              f"WHERE flexiq_jobs.id = v.id")
_RECORD_BATCH = ("INSERT INTO flexiq_executions (job_id, attempt, worker, started_at, finished_at, outcome, error) "
                 "SELECT * FROM unnest(%s::bigint[], %s::integer[], %s::text[], %s::float8[], %s::float8[], "
                 "%s::text[], %s::text[])")
_LIVE = "state IN ('queued', 'running')"
_DUE = "state = 'queued' AND NOT delayed"
_DELAYED = "state = 'queued' AND delayed"
_WAITING_OR_HELD = "('queued', 'delayed', 'waiting', 'running', 'dead')"
# Hold times behind a dependency's typical hold and kept for dependency_stats (see sqlite.py).
_TYPICAL_HOLD_SAMPLE = 100
_HOLD_SAMPLE = 1000
_HOLD_TIMES_RETENTION = 600.0
# The holds that count: of a job still running leased to the owner that took the hold.
_LIVE_HOLDS = ("SELECT h.since FROM flexiq_dependency_holds h JOIN flexiq_jobs j ON j.id = h.job_id "
               "WHERE h.dependency = %s AND j.state = 'running' AND j.lease_owner = h.owner")
_LIVE_HOLDS_OF = ("SELECT h.dependency, h.since FROM flexiq_dependency_holds h JOIN flexiq_jobs j ON j.id = h.job_id "
                  "WHERE h.dependency = ANY(%s) AND j.state = 'running' AND j.lease_owner = h.owner")

# Tenants at most whose heads a capped claim reads (see sqlite._HEADS_MAX).
_HEADS_MAX = 64

# Transactions run again after a dropped connection, a deadlock or a serialization failure.
_ATTEMPTS = 3


@dataclasses.dataclass(frozen=True)
class ConnectOptions:
    """How to reach the database: libpq's conninfo (a URL without flexiqd's own options),
    a password read from a file or credential (None: libpq finds one, e.g. in ~/.pgpass),
    whether idle workers LISTEN for new jobs, and whether statements run often are
    prepared on the server (psycopg's default; off behind a pooler in transaction mode,
    where the next transaction may run on another server connection)."""

    conninfo: str
    password: str | None = None
    listen: bool = True
    prepare: bool = True
    connect_timeout: float = 10.0


class CommitUnknown(StoreUnavailable):
    """The connection was lost while a COMMIT was under way: it may or may not have happened."""


class _Committing:
    """Marks that the transaction body finished: an error from here on is the COMMIT's."""

    def __init__(self) -> None:
        self.reached = False


class PostgresBackend(Backend):
    """A job store in a PostgreSQL database, shared by processes on many machines.

    Thread-safe: calls are serialised on one connection by a lock.
    """

    def __init__(self, options: ConnectOptions, *, url: str, rng: random.Random | None = None) -> None:
        self.url = url  # as shown in messages: never with a password
        self.options = options
        self._rng = rng or random.Random()
        self._lock = threading.RLock()
        self._closed = False
        self._claims = 0
        self._caps_recorded: TenantCaps | None = None  # the tenant caps this process last stored
        self._conn: psycopg.Connection | None = None
        with self._lock:
            conn = self._connect()
            try:
                self._migrate(conn)
            except psycopg.Error as exc:
                conn.close()
                raise self._translate(exc, "open") from None
            except StoreUnavailable:
                conn.close()
                raise
            self._conn = conn

    # -- connections -----------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection:
        return _connect(self.options, self.url)

    def _connection(self) -> psycopg.Connection:
        if self._closed:
            raise QueueError(f"the queue database {self.url} is closed")
        if self._conn is None or self._conn.closed or self._conn.broken:
            if self._conn is not None:
                log.warning("The connection to the queue database %s was lost; connecting again.",
                            self.url)
                self._conn.close()
                self._conn = None
            self._conn = self._connect()
        return self._conn

    @staticmethod
    def _read_version(conn: psycopg.Connection) -> int:
        # Read from pg_class, not with to_regclass(): the backend's name cache may still say
        # "no such table" after another process created it while we waited for the lock;
        # opening the catalog in this transaction makes the backend catch up first.
        if not conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
                "ON n.oid = c.relnamespace WHERE c.relname = %s AND n.nspname = current_schema())",
                (VERSION_TABLE,)).fetchone()[0]:
            return 0
        row = conn.execute(f"SELECT max(version) FROM {VERSION_TABLE}").fetchone()
        return row[0] or 0

    def _migrate(self, conn: psycopg.Connection) -> None:
        """Create the schema, or bring an older one up to date, in one transaction.

        The version is read again under an advisory lock (one per schema): processes
        opening a new store at once must not both run the DDL.
        """
        version = self._read_version(conn)
        if version > SCHEMA_VERSION:
            raise StoreUnavailable(
                f"the queue database {self.url} has schema version {version}, newer than "
                f"this flexiqd understands ({SCHEMA_VERSION}): upgrade flexiqd")
        if version == SCHEMA_VERSION:
            return
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('flexiq schema of ' || current_schema()))")
            version = self._read_version(conn)
            if version >= SCHEMA_VERSION:
                return
            if version == 0:
                statements: Sequence[str] = SCHEMA
                conn.execute(f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version integer NOT NULL)")
            else:
                statements = [s for v in sorted(MIGRATIONS) if v > version for s in MIGRATIONS[v]]
            for statement in statements:
                conn.execute(statement)
            conn.execute(f"DELETE FROM {VERSION_TABLE}")
            conn.execute(f"INSERT INTO {VERSION_TABLE} (version) VALUES (%s)", (SCHEMA_VERSION,))
        log.info("The queue database %s is at schema version %d (was %d).", self.url,
                 SCHEMA_VERSION, version)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- transactions ----------------------------------------------------------------------

    def _run(self, operation: str, body: Callable[[psycopg.Connection], Any], *,
             snapshot: bool = False) -> Any:
        """Run ``body(conn)`` in one transaction and return what it returns.

        ``snapshot``: a read-only REPEATABLE READ transaction, so several SELECTs
        see one state.  ``body`` may run more than once (a dropped connection, a
        deadlock): it must keep nothing from a run that was rolled back.
        """
        with self._lock:
            for attempt in range(1, _ATTEMPTS + 1):
                conn = self._connection()
                committing = _Committing()
                try:
                    return self._once(conn, body, snapshot, committing)
                except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure) as exc:
                    if attempt == _ATTEMPTS:
                        raise self._translate(exc, operation) from None
                except psycopg.OperationalError as exc:
                    if not (conn.closed or conn.broken):
                        raise self._translate(exc, operation) from None
                    if committing.reached:
                        raise CommitUnknown(
                            f"{operation} on the queue database {self.url}: the connection was lost "
                            f"while committing, so it may or may not have happened "
                            f"({_first_line(exc)})") from None
                    if attempt == _ATTEMPTS:
                        raise self._translate(exc, operation) from None
                except psycopg.Error as exc:
                    raise self._translate(exc, operation) from None
        raise AssertionError("unreachable")

    @staticmethod
    def _once(conn: psycopg.Connection, body: Callable[[psycopg.Connection], Any], snapshot: bool,
              committing: _Committing) -> Any:
        # Said in the BEGIN itself (no round trip of its own), and only for this transaction.
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ if snapshot else None
        conn.read_only = True if snapshot else None
        with conn.transaction():
            result = body(conn)
            committing.reached = True
        return result

    def _translate(self, exc: psycopg.Error, operation: str) -> QueueError:
        text = _first_line(exc)
        if isinstance(exc, psycopg.OperationalError):
            return StoreUnavailable(f"{operation} on the queue database {self.url} failed: {text}")
        if isinstance(exc, (pg_errors.InsufficientPrivilege, pg_errors.ReadOnlySqlTransaction)):
            return StoreUnavailable(f"{operation} on the queue database {self.url} was refused: {text}")
        return QueueError(f"{operation} on the queue database {self.url} failed: {text}")

    # -- enqueue ---------------------------------------------------------------------------

    def enqueue(self, jobs: Sequence[NewJob], *, now: float) -> list[int]:
        rows = [_new_row(job, now) for job in jobs]  # encode before the transaction: fail whole
        if not rows:
            return []

        def body(conn: psycopg.Connection) -> list[int]:
            new_ids = sorted(row[0] for row in conn.execute(_NEW_IDS, (len(rows),)))
            columns = [new_ids] + [[row[name] for row in rows] for name, _ in _NEW_JOB_TYPES[1:]]
            inserted = {row[0] for row in conn.execute(_INSERT_JOBS, columns)}
            # Rows left out hold a key that is live: the job holding it stands for them.
            keys = [row["idempotency_key"] for row, job_id in zip(rows, new_ids) if job_id not in inserted]
            holders = dict(conn.execute(
                f"SELECT idempotency_key, id FROM flexiq_jobs WHERE idempotency_key = ANY(%s) "
                f"AND {_LIVE}", (keys,)).fetchall()) if keys else {}
            ids: list[int] = []
            arrivals: dict[tuple[str, str], int] = {}
            for row, job_id in zip(rows, new_ids):
                if job_id not in inserted:
                    ids.append(holders[row["idempotency_key"]])
                    continue
                ids.append(job_id)
                if not row["delayed"]:  # a delayed job arrives when it comes due (_promote)
                    key = (row["queue"], row["tenant"])
                    arrivals[key] = arrivals.get(key, 0) + 1
            for (queue, tenant), n in sorted(arrivals.items()):
                _bump_rate(conn, queue, tenant, int(now), arrivals=n)
            _notify(conn, {queue for queue, _ in arrivals})
            return ids

        return self._run("enqueue", body)

    # -- promotion -------------------------------------------------------------------------

    @staticmethod
    def _promote(conn: psycopg.Connection, now: float) -> int:
        """Make up to ``_PROMOTION_BATCH`` delayed jobs whose run_at has come due; return how many.

        As in the SQLite store, a job that never ran arrives in the second of its run_at.
        Rows another transaction holds are skipped: it is promoting or cancelling them.
        """
        promoted = conn.execute(
            f"UPDATE flexiq_jobs SET delayed = false WHERE id IN (SELECT id FROM flexiq_jobs "
            f"WHERE {_DELAYED} AND run_at <= %s ORDER BY run_at LIMIT {_PROMOTION_BATCH} "
            f"FOR UPDATE SKIP LOCKED) RETURNING queue, tenant, run_at, attempts, waiting_for",
            (now,)).fetchall()
        arrivals: dict[tuple[str, str, int], int] = {}
        for queue, tenant, run_at, attempts, waiting_for in promoted:
            # A deferred job whose wait is over is claimable again (still waiting for its
            # dependency until a worker takes it), and no arrival: it arrived long ago.
            if attempts == 0 and waiting_for is None:
                key = (queue, tenant, int(run_at))
                arrivals[key] = arrivals.get(key, 0) + 1
        for (queue, tenant, second), n in sorted(arrivals.items()):
            _bump_rate(conn, queue, tenant, second, arrivals=n)
        _notify(conn, {row[0] for row in promoted})
        return len(promoted)

    # -- claim / settle --------------------------------------------------------------------

    def claim(self, request: ClaimRequest, *, now: float) -> list[Job]:
        return self._exchange("claim", request.owner, [], request, now)[1]

    def _fold_now_and_then(self) -> None:
        """Fold the changes every ``_FOLD_EVERY`` claims, so a store that nobody reads the
        stats of (workers without a daemon) does not pile them up."""
        self._claims += 1
        if self._claims % _FOLD_EVERY == 0:
            self._run("fold counts", _fold)

    def settle(self, owner: str, outcomes: Iterable[Outcome], *, now: float) -> list[int]:
        outcomes = list(outcomes)
        if not outcomes:
            return []
        return self._exchange("settle", owner, outcomes, None, now)[0]

    def settle_and_claim(self, owner: str, outcomes: Iterable[Outcome],
                         request: ClaimRequest | None, *, now: float) -> tuple[list[int], list[Job]]:
        # One transaction, one round of commits: a busy worker pays one per exchange.
        return self._exchange("settle and claim", owner, list(outcomes), request, now)

    def _exchange(self, operation: str, owner: str, outcomes: list[Outcome],
                  request: ClaimRequest | None, now: float) -> tuple[list[int], list[Job]]:
        """Settle ``outcomes``, then claim for ``request``, in one transaction.

        When the connection is lost during the COMMIT, the next transaction finds out
        whether it happened: a claim stamps its jobs with the owner and ``now``, so jobs
        running under that stamp were claimed by it, and are returned (rather than left
        leased to a worker that does not know it holds them).  Finding none, it runs
        the exchange again -- safe either way: outcomes already applied are ignored
        the second time.  (After a lost COMMIT the ids it settled are not reported.)
        """
        claiming = request is not None and request.limit > 0

        def body(conn: psycopg.Connection) -> tuple[list[int], list[Job]]:
            settled = self._settle(conn, owner, outcomes, now) if outcomes else []
            claimed = self._claim(conn, request, now) if claiming else []
            return settled, claimed

        def after_lost_commit(conn: psycopg.Connection) -> tuple[list[int], list[Job]]:
            if claiming:
                stamped = [_row_to_job(row) for row in conn.execute(
                    f"SELECT {_JOB_COLUMNS} FROM flexiq_jobs WHERE state = 'running' "
                    f"AND lease_owner = %s AND started_at = %s", (owner, now))]
                if stamped:
                    stamped.sort(key=lambda j: (request.queues.index(j.queue), -j.priority, j.run_at, j.id))
                    return [], stamped
            return body(conn)

        try:
            result = self._run(operation, body)
        except CommitUnknown as exc:
            log.warning("%s; finding out whether it did.", exc)
            result = self._run(operation, after_lost_commit)
        if claiming:
            if request.tenant_caps is not None:
                self._caps_recorded = request.tenant_caps
            self._fold_now_and_then()
        return result

    def _claim(self, conn: psycopg.Connection, request: ClaimRequest, now: float) -> list[Job]:
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
            # run_at <= now still guards the walk: another machine's clock may run ahead.
            rows = conn.execute(
                f"UPDATE flexiq_jobs SET state = 'running', lease_owner = %s, lease_expires = %s, "
                f"attempts = attempts + 1, started_at = %s, waiting_for = NULL WHERE id IN ("
                f"  SELECT id FROM flexiq_jobs WHERE {_DUE} AND queue = %s AND run_at <= %s"
                f"  ORDER BY priority DESC, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED) "
                f"RETURNING {_JOB_COLUMNS}",
                (request.owner, now + request.lease_seconds, now, queue, now, want)).fetchall()
            jobs = [_row_to_job(row) for row in rows]
            jobs.sort(key=lambda j: (-j.priority, j.run_at, j.id))
            claimed.extend(jobs)
        return claimed

    def _claim_within_caps(self, conn: psycopg.Connection, request: ClaimRequest, caps: TenantCaps,
                           now: float) -> list[Job]:
        """The claim walk, skipping the jobs of tenants at their cap (see the SQLite store's).

        Before it leases a capped tenant's jobs, a claim takes that tenant's advisory
        lock (without waiting: a tenant another claim is leasing right now is skipped
        this time) and counts its running jobs after it: in READ COMMITTED that count
        sees every claim that held the lock before, so claims on many hosts never
        lease past a cap.
        """
        running = _running_per_tenant(conn)  # a hint: tenants full already are not walked
        room: dict[str, int] = {}
        full = {tenant for tenant, n in room_left(caps, running, list(running)).items() if n <= 0}
        claimed: list[Job] = []
        for queue in request.queues:
            while (want := request.limit - len(claimed)) > 0:
                rows, complete = _capped_candidates(conn, queue, full, want, now)
                new = sorted({tenant for _, tenant in rows if tenant not in room and caps.cap_of(tenant) is not None})
                locked = [tenant for tenant in new if conn.execute(
                    "SELECT pg_try_advisory_xact_lock(hashtext('flexiq tenant cap'), "
                    "hashtext(current_schema() || '/' || %s))", (tenant,)).fetchone()[0]]
                if locked:
                    room.update(room_left(caps, _running_per_tenant(conn, locked), locked))
                room.update({tenant: 0 for tenant in new if tenant not in locked})
                taken, out_of_room = within_caps(rows, room, caps)
                full |= out_of_room
                claimed.extend(_lease(conn, request, taken, now))
                if len(rows) < want or not complete:
                    break  # no more jobs of tenants with room (or other claims hold them now)
        return claimed

    def _settle(self, conn: psycopg.Connection, owner: str, outcomes: list[Outcome],
                now: float) -> list[int]:
        held = {row[0]: row[1:] for row in conn.execute(
            "SELECT id, queue, tenant, attempts, max_attempts, started_at FROM flexiq_jobs "
            "WHERE id = ANY(%s) AND state = 'running' AND lease_owner = %s ORDER BY id FOR UPDATE",
            (sorted({outcome.job_id for outcome in outcomes}), owner))}
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
        _apply(conn, endings, measure_holds=True)
        return endings.ids

    def renew(self, owner: str, job_ids: Iterable[int], lease_seconds: float, *, now: float) -> list[int]:
        ids = list(job_ids)
        if not ids:
            return []

        def body(conn: psycopg.Connection) -> list[int]:
            # An expired lease that nobody recovered is still the owner's: while its
            # process lives, expiry alone never hands the job to another worker.
            held = {row[0] for row in conn.execute(
                "UPDATE flexiq_jobs SET lease_expires = %s WHERE id = ANY(%s) AND state = 'running' "
                "AND lease_owner = %s RETURNING id", (now + lease_seconds, sorted(set(ids)), owner))}
            return [job_id for job_id in dict.fromkeys(ids) if job_id in held]

        return self._run("renew leases", body)

    def abandon(self, owner: str, outcomes: Iterable[Outcome], *, now: float) -> list[int]:
        marks = []
        for outcome in outcomes:
            if outcome.kind not in (OutcomeKind.RELEASE, OutcomeKind.FAIL):
                raise QueueError(f"job {outcome.job_id}: only release or fail can wait for the "
                                 f"worker's exit, not {outcome.kind.value}")
            marks.append((outcome.kind.value, outcome.error, outcome.job_id, owner))
        if not marks:
            return []

        def body(conn: psycopg.Connection) -> list[int]:
            marked = []
            for mark in marks:
                if conn.execute(
                        "UPDATE flexiq_jobs SET lease_outcome = %s, error = COALESCE(%s, error) "
                        "WHERE id = %s AND state = 'running' AND lease_owner = %s", mark).rowcount:
                    marked.append(mark[2])
            return marked

        return self._run("abandon jobs", body)

    # -- recovery --------------------------------------------------------------------------

    def recover_expired(self, *, now: float) -> int:
        def body(conn: psycopg.Connection) -> int:
            # Once per fleet: every daemon sharing the store runs this each minute; one that
            # finds another at it leaves the work to it (its transaction sees the same rows).
            if not _lead_maintenance(conn):
                return 0
            recovered = self._recover(conn, now, owner=None, reason="lease expired")
            _fold(conn)
            conn.execute("DELETE FROM flexiq_rates WHERE second < %s", (int(now) - _RATE_RETENTION,))
            conn.execute("DELETE FROM flexiq_dependency_events WHERE second < %s",
                         (int(now) - _RATE_RETENTION,))
            conn.execute("DELETE FROM flexiq_dependency_hold_times WHERE ended_at < %s",
                         (now - _HOLD_TIMES_RETENTION,))
            return recovered

        return self._run("recover expired leases", body)

    def recover_owner(self, owner: str, *, now: float, reason: str) -> int:
        return self._run("recover a worker's jobs",
                         lambda conn: self._recover(conn, now, owner=owner, reason=reason))

    def _recover(self, conn: psycopg.Connection, now: float, *, owner: str | None, reason: str) -> int:
        """Settle the jobs of a gone owner: its ``abandon`` mark if it left one, else "lost".

        Rows another transaction holds are skipped (their owner is settling or renewing
        them, or another process is recovering them), so recovery runs safely from
        several processes at once.  Expired leases of a live process of this host are
        left alone: a job runs again only when nothing can still be running it.
        """
        columns = ("id, attempts, max_attempts, lease_owner, started_at, queue, tenant, "
                   "lease_outcome, error")
        if owner is None:
            rows = [row for row in conn.execute(
                f"SELECT {columns} FROM flexiq_jobs WHERE state = 'running' AND lease_expires < %s "
                f"ORDER BY id FOR UPDATE SKIP LOCKED", (now,))
                if owner_alive_here(row[3]) is not True]
            rows = _left_to_rescue(conn, rows, "flexiq_hosts")
        else:
            rows = conn.execute(
                f"SELECT {columns} FROM flexiq_jobs WHERE state = 'running' "
                f"AND lease_expires IS NOT NULL AND lease_owner = %s ORDER BY id FOR UPDATE",
                (owner,)).fetchall()
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
        _apply(conn, endings)
        if rows:
            _notify(conn, {row[5] for row in rows})
        return len(rows)

    def lease_owners(self) -> dict[str, int]:
        return self._run("list lease owners", lambda conn: dict(conn.execute(
            "SELECT lease_owner, count(*) FROM flexiq_jobs WHERE state = 'running' "
            "AND lease_expires IS NOT NULL GROUP BY lease_owner").fetchall()))

    # -- management ------------------------------------------------------------------------

    def cancel(self, job_id: int, *, now: float) -> bool:
        def body(conn: psycopg.Connection) -> bool:
            self._promote(conn, now)  # a job that came due arrived, cancelled or not
            if conn.execute(
                    f"UPDATE flexiq_jobs SET state = 'cancelled', finished_at = %s, {_UNLEASED} "
                    f"WHERE id = %s AND state IN ('queued', 'running', 'dead')", (now, job_id)).rowcount:
                _free_holds(conn, [job_id], now, measure=False)
                return True
            if conn.execute("SELECT 1 FROM flexiq_jobs WHERE id = %s", (job_id,)).fetchone() is None:
                raise JobNotFound(f"no job with id {job_id}")
            return False

        return self._run("cancel", body)

    def get(self, job_id: int) -> Job:
        row = self._run("read a job", lambda conn: conn.execute(
            f"SELECT {_JOB_COLUMNS} FROM flexiq_jobs WHERE id = %s", (job_id,)).fetchone())
        if row is None:
            raise JobNotFound(f"no job with id {job_id}")
        return _row_to_job(row)

    def list_jobs(self, *, queue: str | None = None, state: JobState | None = None,
                  limit: int = 50) -> list[Job]:
        where, args = [], []
        if queue is not None:
            where.append("queue = %s")
            args.append(queue)
        if state is not None:
            where.append("state = %s")
            args.append(JobState(state).value)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._run("list jobs", lambda conn: conn.execute(
            f"SELECT {_JOB_COLUMNS} FROM flexiq_jobs {clause} ORDER BY id DESC LIMIT %s",
            (*args, limit)).fetchall())
        return [_row_to_job(row) for row in rows]

    def retry_dead(self, *, queue: str | None = None, job_ids: Iterable[int] | None = None,
                   now: float) -> int:
        where, args = ["state = 'dead'"], []
        if queue is not None:
            where.append("queue = %s")
            args.append(queue)
        ids = list(job_ids) if job_ids is not None else None
        if ids is not None:
            if not ids:
                return 0
            where.append("id = ANY(%s)")
            args.append(ids)
        # A revived job arrives again: it had left the queue for good.
        revive = ("UPDATE flexiq_jobs SET state = 'queued', delayed = false, attempts = 0, "
                  "run_at = %s, finished_at = NULL WHERE ")

        def body(conn: psycopg.Connection) -> int:
            revived = conn.execute(revive + " AND ".join(where + ["idempotency_key IS NULL"])
                                   + " RETURNING queue, tenant", (now, *args)).fetchall()
            # As in the SQLite store: only the newest dead job of a key that is free comes back.
            keyed = conn.execute(
                f"SELECT id, idempotency_key FROM flexiq_jobs WHERE {' AND '.join(where)} "
                f"AND idempotency_key IS NOT NULL ORDER BY id DESC", args).fetchall()
            for job_id, key in keyed:
                revived += conn.execute(
                    revive + f"id = %s AND NOT EXISTS (SELECT 1 FROM flexiq_jobs WHERE "
                    f"idempotency_key = %s AND {_LIVE}) RETURNING queue, tenant",
                    (now, job_id, key)).fetchall()
            arrivals: dict[tuple[str, str], int] = {}
            for queue_tenant in revived:
                arrivals[queue_tenant] = arrivals.get(queue_tenant, 0) + 1
            for (name, tenant), n in sorted(arrivals.items()):
                _bump_rate(conn, name, tenant, int(now), arrivals=n)
            _notify(conn, {name for name, _ in arrivals})
            return len(revived)

        return self._run("retry dead jobs", body)

    def purge(self, *, states: Sequence[JobState], finished_before: float,
              queue: str | None = None, sweep: bool = False) -> int:
        wanted = []
        for state in states:
            state = JobState(state)
            if state not in FINISHED_STATES:
                raise QueueError(f"only finished jobs can be purged, not {state.value} ones")
            wanted.append(state.value)

        def body(conn: psycopg.Connection) -> int:
            if sweep and not _lead_maintenance(conn):
                return 0
            names = [queue] if queue is not None else _queues(conn)
            removed = 0
            for name in names:  # one index range (queue, state, finished_at) per queue and state
                for state in wanted:
                    gone = [row[0] for row in conn.execute(
                        "DELETE FROM flexiq_jobs WHERE queue = %s AND state = %s AND finished_at < %s "
                        "RETURNING id", (name, state, finished_before))]
                    if gone:
                        conn.execute("DELETE FROM flexiq_executions WHERE job_id = ANY(%s)", (gone,))
                    removed += len(gone)
            return removed

        return self._run("purge finished jobs", body)

    def queues(self) -> list[str]:
        return self._run("list queues", _queues)

    def executions(self, *, job_id: int | None = None, limit: int | None = None) -> list[dict]:
        clause, args = ("WHERE job_id = %s", [job_id]) if job_id is not None else ("", [])
        tail = " LIMIT %s" if limit is not None else ""
        if limit is not None:
            args.append(limit)
        rows = self._run("list executions", lambda conn: conn.execute(
            f"SELECT job_id, attempt, worker, started_at, finished_at, outcome, error "
            f"FROM flexiq_executions {clause} ORDER BY id{tail}", args).fetchall())
        keys = ("job_id", "attempt", "worker", "started_at", "finished_at", "outcome", "error")
        return [dict(zip(keys, row)) for row in rows]

    def ended_attempts(self, after: int | None, *, limit: int = 10_000) -> tuple[int, list[EndedAttempt]]:
        """See ``Backend``.  Ids are handed out before commit, so a transaction still open may
        yet fill a gap below ids already committed: the cursor stops at a gap until the row
        after it is ``_GAP_SETTLE`` seconds old (by the server's clock); a gap as old as that
        is for good (a rolled-back transaction, a purge)."""
        def body(conn: psycopg.Connection) -> tuple[int, list[EndedAttempt]]:
            if after is None:
                return conn.execute("SELECT COALESCE(max(id), 0) FROM flexiq_executions").fetchone()[0], []
            rows = conn.execute(
                "SELECT e.id, j.queue, j.task, e.outcome, e.finished_at - e.started_at, "
                "e.outcome = 'dead' OR (e.outcome IN ('fail', 'lost') AND e.attempt >= j.max_attempts), "
                "e.recorded_at < clock_timestamp() - make_interval(secs => %s) "
                "FROM flexiq_executions e LEFT JOIN flexiq_jobs j ON j.id = e.job_id "
                "WHERE e.id > %s ORDER BY e.id LIMIT %s", (_GAP_SETTLE, after, limit)).fetchall()
            cursor, ended = after, []
            for attempt_id, queue, task, outcome, seconds, dead, settled in rows:
                if attempt_id != cursor + 1 and not settled:
                    break  # an open transaction may still write the ids in between
                cursor = attempt_id
                if queue is not None:  # its job was purged since: left out, as the contract says
                    ended.append(EndedAttempt(queue=queue, task=task, outcome=outcome, seconds=seconds,
                                              dead_lettered=bool(dead)))
            return cursor, ended

        return self._run("read ended attempts", body)

    def arrivals_since(self, queue: str, second: int) -> dict[int, int]:
        return self._run("read arrivals", lambda conn: {int(at): int(n) for at, n in conn.execute(
            "SELECT second, sum(arrivals) FROM (SELECT second, arrivals FROM flexiq_rates "
            "WHERE queue = %(queue)s AND second >= %(second)s UNION ALL SELECT second, arrivals "
            "FROM flexiq_rate_changes WHERE queue = %(queue)s AND second >= %(second)s) AS parts "
            "GROUP BY second HAVING sum(arrivals) > 0", {"queue": queue, "second": second})}, snapshot=True)

    # -- dependency limits -------------------------------------------------------------------

    def admit(self, owner: str, job_id: int, dependencies: Sequence[DependencyLimit], *,
              now: float) -> Deferral | None:
        """See ``Backend``: ``admit_many`` of one job."""
        return self.admit_many(owner, [(job_id, dependencies)], now=now)[job_id]

    def admit_many(self, owner: str, requests: Sequence[tuple[int, Sequence[DependencyLimit]]], *,
                   now: float) -> dict[int, Deferral | None]:
        """See ``Backend``: one transaction, set-based (``_admit_many``).  The dependencies'
        rows are locked (FOR UPDATE, in name order, so two admissions never wait on each
        other crosswise): admissions to one dependency from every host take turns, each
        counting the holds the ones before it committed."""
        if not any(dependencies for _, dependencies in requests):
            return {job_id: None for job_id, _ in requests}
        return self._run("admit jobs to their dependencies", lambda conn: _admit_many(conn, owner, requests, now))

    def dependency_stats(self, dependency: str, *, now: float, window: float = 60.0) -> DependencyStats:
        if not window > 0:
            raise QueueError(f"a stats window must be more than 0s, got {window!r}")
        return self._run("read dependency stats",
                         lambda conn: _dependency_stats(conn, dependency, now, window), snapshot=True)

    # -- stats -----------------------------------------------------------------------------

    def first_claims(self, owners: Iterable[str]) -> dict[str, float]:
        names = list(owners)
        if not names:
            return {}

        def body(conn: psycopg.Connection) -> dict[str, float]:
            found: dict[str, float] = {}
            for owner, started in conn.execute(
                    "SELECT lease_owner, min(started_at) FROM flexiq_jobs WHERE state = 'running' "
                    "AND lease_owner = ANY(%s) GROUP BY lease_owner "
                    "UNION ALL SELECT worker, min(started_at) FROM flexiq_executions "
                    "WHERE worker = ANY(%s) GROUP BY worker", (names, names)):
                if started is not None:
                    found[owner] = min(started, found.get(owner, started))
            return found

        return self._run("read first claims", body, snapshot=True)

    def stats(self, queue: str, *, now: float, window: float = 60.0, horizon: float = 0.0) -> Stats:
        """The queue's signals, read from counts and rates and a bounded sample (see SQLite's)."""
        if not window > 0:
            raise QueueError(f"a stats window must be more than 0s, got {window!r}")
        if not horizon >= 0 or math.isinf(horizon):
            raise QueueError(f"a coming-due horizon must be 0s or more, got {horizon!r}")
        # Delayed jobs that came due are promoted first (in batches), so the figures count
        # them as runnable and as arrivals; then one snapshot is read.
        # Delayed jobs that came due are promoted (in batches), and the appended changes
        # folded, so the read that follows sums a few totals.
        def promote_and_fold(conn: psycopg.Connection) -> int:
            promoted = self._promote(conn, now)
            _fold(conn)
            return promoted

        while self._run("read stats", promote_and_fold) >= _PROMOTION_BATCH:
            pass
        return self._run("read stats", lambda conn: _read_stats(conn, queue, now, window, horizon),
                         snapshot=True)

    # -- waking idle workers ---------------------------------------------------------------

    def subscribe(self, queues: Sequence[str], wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake()`` (from another thread) when jobs become due on ``queues``.

        A thread of its own LISTENs on its own connection and calls ``wake`` once
        listening (notices sent before that reached nobody); a lost connection is
        opened again, with the same call.  Returns a closer
        that stops the thread within moments.  With ``listen=off`` in the URL (for a
        pooler in transaction mode, where LISTEN cannot work) nothing listens: the
        workers' polling alone finds new jobs.
        """
        if not self.options.listen or not queues:
            return lambda: None
        listener = Listener(self._connect, [channel_of(queue) for queue in queues], wake)
        listener.start()
        return listener.stop


    # -- hosts of a fleet (see flexiqd.queue.hosts) -----------------------------------------

    shared_by_hosts = True

    def heartbeat(self, host: str, *, now: float, interval: float,
                  report: Mapping[str, Any] | None = None) -> None:
        text = encode_report(report or {})
        self._run("record a heartbeat", lambda conn: conn.execute(
            "INSERT INTO flexiq_hosts AS h (name, last_beat, interval, report, registered_at) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (name) DO UPDATE SET "
            "last_beat = excluded.last_beat, interval = excluded.interval, report = excluded.report",
            (host, now, interval, text, now)))

    def hosts(self, *, now: float) -> list[HostInfo]:
        return self._run("list hosts", lambda conn: [host_info(*row, now=now) for row in conn.execute(
            "SELECT name, last_beat, interval, report, registered_at FROM flexiq_hosts ORDER BY name")])

    def forget_host(self, host: str) -> bool:
        return self._run("forget a host", lambda conn: conn.execute(
            "DELETE FROM flexiq_hosts WHERE name = %s", (host,)).rowcount > 0)

    def rescue_dead_hosts(self, *, now: float, exclude: Sequence[str] = ()) -> dict[str, int]:
        def body(conn: psycopg.Connection) -> dict[str, int]:
            # One rescuer at a time: the others would only skip the rows it holds.
            if not conn.execute("SELECT pg_try_advisory_xact_lock("
                                "hashtext('flexiq rescue of ' || current_schema()))").fetchone()[0]:
                return {}
            dead = _dead_hosts(conn.execute("SELECT name, last_beat, interval FROM flexiq_hosts"),
                               now, exclude)
            if not dead:
                return {}
            # Rows a worker is settling or renewing right now are skipped: it is alive after all.
            rows = conn.execute(f"SELECT {_RECOVER_COLUMNS} FROM flexiq_jobs WHERE state = 'running' "
                                f"AND lease_expires < %s ORDER BY id FOR UPDATE SKIP LOCKED", (now,)).fetchall()
            endings, rescued = _rescue(rows, dead, now, self._rng)
            _apply(conn, endings)
            if rescued:
                ended = set(endings.ids)
                _notify(conn, {row[5] for row in rows if row[0] in ended})
            return rescued

        return self._run("rescue the jobs of dead hosts", body)


def probe(options: ConnectOptions, url: str) -> str:
    """Connect, read the server's version and the store's schema version, change nothing;
    return a short description.  StoreUnavailable, in one line, when that cannot be done."""
    connection = _connect(options, url)
    try:
        server = connection.info.parameter_status("server_version") or "?"
        version = PostgresBackend._read_version(connection)
    except psycopg.Error as exc:
        raise StoreUnavailable(f"cannot read the queue database {url}: {_first_line(exc)}") from None
    finally:
        connection.close()
    if version > SCHEMA_VERSION:
        raise StoreUnavailable(f"the queue database {url} has schema version {version}, newer than "
                               f"this flexiqd understands ({SCHEMA_VERSION}): upgrade flexiqd")
    schema = f"schema version {version}" if version else "schema not created yet (the first process creates it)"
    return f"PostgreSQL {server.split()[0]}, {schema}"


# -- helpers shared by the methods -----------------------------------------------------------

def _connect(options: ConnectOptions, url: str) -> psycopg.Connection:
    """A new autocommit connection; StoreUnavailable in one line (``url`` has no password)."""
    given = conninfo_to_dict(options.conninfo)
    kwargs: dict[str, Any] = {"autocommit": True}
    # Defaults only: what the URL says wins (keyword arguments would override it).
    if "connect_timeout" not in given:
        kwargs["connect_timeout"] = max(1, math.ceil(options.connect_timeout))
    if "application_name" not in given:
        kwargs["application_name"] = "flexiqd"
    if options.password is not None:
        kwargs["password"] = options.password
    try:
        conn = psycopg.connect(options.conninfo, **kwargs)
    except psycopg.Error as exc:
        raise StoreUnavailable(f"cannot connect to the queue database {url}: {_first_line(exc)}") from None
    if not options.prepare:
        conn.prepare_threshold = None
    return conn


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _new_row(job: NewJob, now: float) -> dict[str, Any]:
    if not job.task:
        raise QueueError("a job needs a task name")
    if job.max_attempts < 1:
        raise QueueError(f"max_attempts must be at least 1, got {job.max_attempts}")
    run_at = float(job.run_at) if job.run_at is not None else now + max(0.0, job.delay)
    return {"queue": job.queue, "task": job.task,
            "payload": encode_json(job.payload, f"the payload of {job.task}"),
            "priority": job.priority, "state": JobState.QUEUED.value, "delayed": run_at > now,
            "run_at": run_at, "max_attempts": job.max_attempts,
            "timeout": float(job.timeout) if job.timeout is not None else None,
            "idempotency_key": job.idempotency_key, "tenant": job.tenant or "",
            "enqueued_at": float(now)}


def _lead_maintenance(conn: psycopg.Connection) -> bool:
    """Whether this transaction may run the fleet's periodic sweeps; False while another does.

    Every daemon sharing the store sweeps each minute; one that finds another at it
    leaves the work to it (a transaction-scoped advisory lock, so a crash frees it).
    """
    return conn.execute("SELECT pg_try_advisory_xact_lock("
                        "hashtext('flexiq maintenance of ' || current_schema()))").fetchone()[0]


def _notify(conn: psycopg.Connection, queues: Iterable[str]) -> None:
    """Tell listeners that jobs became due on ``queues`` (delivered at commit, once per channel)."""
    for queue in sorted(set(queues)):
        conn.execute("SELECT pg_notify(%s, '')", (channel_of(queue),))


def _bump_rate(conn: psycopg.Connection, queue: str, tenant: str, second: int, *,
               arrivals: int = 0, completions: int = 0, failures: int = 0) -> None:
    # Appended, never updated in place: no lock for concurrent transactions to wait on.
    conn.execute(
        "INSERT INTO flexiq_rate_changes (queue, second, tenant, arrivals, completions, failures) "
        "VALUES (%s, %s, %s, %s, %s, %s)", (queue, second, tenant, arrivals, completions, failures))


def _fold(conn: psycopg.Connection) -> None:
    """Move the appended count and rate changes into their totals (see postgres_schema.py).

    Safe from several processes at once: a change row is deleted -- and so added --
    by one fold only, and the totals are upserted in key order.  Readers add the
    changes not folded yet, so the figures are the same before and after.
    """
    conn.execute(
        "WITH moved AS (DELETE FROM flexiq_count_changes RETURNING queue, state, tenant, n) "
        "INSERT INTO flexiq_counts AS c (queue, state, tenant, n) "
        "SELECT queue, state, tenant, sum(n) FROM moved GROUP BY 1, 2, 3 HAVING sum(n) <> 0 "
        "ORDER BY 1, 2, 3 ON CONFLICT (queue, state, tenant) DO UPDATE SET n = c.n + excluded.n")
    conn.execute("DELETE FROM flexiq_counts WHERE n = 0")
    conn.execute(
        "WITH moved AS (DELETE FROM flexiq_rate_changes "
        "RETURNING queue, second, tenant, arrivals, completions, failures) "
        "INSERT INTO flexiq_rates AS r (queue, second, tenant, arrivals, completions, failures) "
        "SELECT queue, second, tenant, sum(arrivals), sum(completions), sum(failures) FROM moved "
        "GROUP BY 1, 2, 3 ORDER BY 1, 2, 3 ON CONFLICT (queue, second, tenant) DO UPDATE SET "
        "arrivals = r.arrivals + excluded.arrivals, completions = r.completions + excluded.completions, "
        "failures = r.failures + excluded.failures")


def _apply(conn: psycopg.Connection, endings: _Endings, *, measure_holds: bool = False) -> None:
    """The row changes ``endings`` collected, in PostgreSQL's dialect (see sqlite._Endings);
    the jobs' dependency slots freed in the same transaction."""
    cursor = conn.cursor()
    for statement, batch, rows in ((_ACK, _ACK_BATCH, endings._acks), (_RELEASE, None, endings._releases),
                                   (_LOSE, None, endings._losses), (_RETRY, None, endings._retries),
                                   (_DEAD_LETTER, None, endings._deaths), (_DEFER, None, endings._deferrals),
                                   (_RECORD, _RECORD_BATCH, endings._executions)):
        if batch is not None and len(rows) > 1:
            cursor.execute(batch, [list(column) for column in zip(*rows)])
        elif rows:
            cursor.executemany(statement, rows)
    _free_holds(conn, endings.ids, endings.now, measure=measure_holds)
    for (queue, tenant), (completions, failures) in sorted(endings._tallies.items()):
        _bump_rate(conn, queue, tenant, int(endings.now), completions=completions, failures=failures)


# Depth per (state, tenant): the totals plus the changes not folded yet.
_COUNTS = ("SELECT queue, state, tenant, sum(n) AS n FROM ("
           "SELECT queue, state, tenant, n FROM flexiq_counts {where} UNION ALL "
           "SELECT queue, state, tenant, n FROM flexiq_count_changes {where}) AS parts "
           "GROUP BY queue, state, tenant HAVING sum(n) > 0")


def _queues(conn: psycopg.Connection) -> list[str]:
    return [row[0] for row in conn.execute(
        f"SELECT DISTINCT queue FROM ({_COUNTS.format(where='')}) AS counts ORDER BY queue")]


def _read_stats(conn: psycopg.Connection, queue: str, now: float, window: float,
                due_within: float) -> Stats:
    """Queue-wide and per-tenant stats, as the SQLite store reads them."""
    counts: dict[str, dict[str, int]] = {}
    where = f"WHERE queue = %(queue)s AND state IN {_WAITING_OR_HELD}"
    for _, state, tenant, n in conn.execute(_COUNTS.format(where=where), {"queue": queue}):
        counts.setdefault(tenant, {})[state] = int(n)
    events: dict[str, list[int]] = {}
    for tenant, arrivals, completions, failures in conn.execute(
            "SELECT tenant, sum(arrivals), sum(completions), sum(failures) FROM ("
            "SELECT tenant, arrivals, completions, failures FROM flexiq_rates "
            "WHERE queue = %(queue)s AND second > %(since)s UNION ALL "
            "SELECT tenant, arrivals, completions, failures FROM flexiq_rate_changes "
            "WHERE queue = %(queue)s AND second > %(since)s) AS parts GROUP BY tenant",
            {"queue": queue, "since": now - window}):
        events[tenant] = [int(arrivals), int(completions), int(failures)]
    horizon = now - max(window, _DURATION_HORIZON)
    durations: list[float] = []
    recent: list[float] = []  # of the jobs that finished in the last RECENT_WINDOW seconds
    recent_since = now - RECENT_WINDOW
    shares: dict[str, list[float]] = {}
    for tenant, finished_at, duration in conn.execute(
            "SELECT tenant, finished_at, finished_at - started_at FROM flexiq_jobs WHERE queue = %s "
            "AND state = 'done' AND finished_at >= %s AND started_at IS NOT NULL "
            f"ORDER BY finished_at DESC LIMIT {_DURATION_SAMPLE}", (queue, horizon)):
        durations.append(duration)
        if finished_at >= recent_since:
            recent.append(duration)
        if tenant:
            shares.setdefault(tenant, []).append(duration)
    # Each tenant's oldest runnable job: one index probe (jobs_age) per tenant, in one round trip.
    waiting = sorted(tenant for tenant, by_state in counts.items() if by_state.get("queued"))
    firsts = dict(conn.execute(
        f"SELECT t.tenant, (SELECT min(run_at) FROM flexiq_jobs WHERE {_DUE} AND waiting_for IS NULL "
        f"AND queue = %s "
        f"AND tenant = t.tenant) FROM unnest(%s::text[]) AS t(tenant)", (queue, waiting))) if waiting else {}
    per_tenant = {}
    for tenant in sorted(counts.keys() | events.keys()):
        by_state = counts.get(tenant, {})
        oldest = 0.0
        first = firsts.get(tenant)
        if first is not None and first <= now:
            oldest = now - first
        arrivals, completions, failures = events.get(tenant, (0, 0, 0))
        per_tenant[tenant] = _stats(
            queue, window, runnable=by_state.get("queued", 0), delayed=by_state.get("delayed", 0),
            waiting=by_state.get("waiting", 0),
            running=by_state.get("running", 0), dead=by_state.get("dead", 0), oldest=oldest,
            arrivals=arrivals, completions=completions, failures=failures,
            durations=sorted(shares.get(tenant, ())))
    caps = TenantCaps(dict(conn.execute("SELECT tenant, max_running FROM flexiq_tenant_caps")))
    if caps and any(p.runnable for p in per_tenant.values()):
        per_tenant = hold_capped(per_tenant, caps, _running_per_tenant(conn))
    parts = per_tenant.values()
    coming = 0
    if due_within > 0 and any(p.delayed for p in parts):
        coming = conn.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM flexiq_jobs WHERE {_DELAYED} AND waiting_for IS NULL "
            f"AND queue = %s "
            f"AND run_at <= %s LIMIT {COMING_DUE_LIMIT}) AS coming",
            (queue, now + due_within)).fetchone()[0]
    running_age = None
    if any(p.running for p in parts):
        count, total = conn.execute(
            "SELECT count(*), COALESCE(sum(%s - started_at), 0) FROM flexiq_jobs "
            "WHERE state = 'running' AND queue = %s AND started_at IS NOT NULL",
            (float(now), queue)).fetchone()
        running_age = max(0.0, total / count) if count else None
    overall = _stats(
        queue, window, runnable=sum(p.runnable for p in parts), delayed=sum(p.delayed for p in parts),
        waiting=sum(p.waiting_for_dependency for p in parts),
        running=sum(p.running for p in parts), dead=sum(p.dead for p in parts),
        oldest=max((p.oldest_runnable_age for p in parts), default=0.0),
        held=sum(p.held_by_tenant_cap for p in parts),
        arrivals=sum(tally[0] for tally in events.values()),
        completions=sum(tally[1] for tally in events.values()),
        failures=sum(tally[2] for tally in events.values()),
        durations=sorted(durations),
        tenants={name: stats for name, stats in per_tenant.items() if name})
    return dataclasses.replace(overall, coming_due=coming, coming_due_within=float(due_within),
                               running_age_mean=running_age,
                               recent_duration_p50=percentile(sorted(recent), 0.50),
                               recent_completions=len(recent))


# -- dependency limits -----------------------------------------------------------------------

def _free_holds(conn: psycopg.Connection, job_ids: Sequence[int], now: float, *, measure: bool) -> None:
    """Delete the dependency holds of jobs whose attempt ended; record how long each was held."""
    if not job_ids:
        return
    freed = conn.execute("DELETE FROM flexiq_dependency_holds WHERE job_id = ANY(%s) RETURNING dependency, since",
                         (sorted(set(job_ids)),)).fetchall()
    if measure and freed:
        conn.cursor().executemany(
            "INSERT INTO flexiq_dependency_hold_times (dependency, ended_at, seconds) VALUES (%s, %s, %s)",
            [(name, now, max(0.0, now - since)) for name, since in freed])


def _bump_dependency(conn: psycopg.Connection, dependency: str, second: int, *,
                     admitted: int = 0, deferred: int = 0) -> None:
    # Only ever under the dependency's row lock (_admit): no contention of its own.
    conn.execute(
        "INSERT INTO flexiq_dependency_events AS e (dependency, second, admitted, deferred) "
        "VALUES (%s, %s, %s, %s) ON CONFLICT (dependency, second) DO UPDATE SET "
        "admitted = e.admitted + excluded.admitted, deferred = e.deferred + excluded.deferred",
        (dependency, second, admitted, deferred))


def _typical_hold(conn: psycopg.Connection, dependency: str, now: float) -> float | None:
    recent = sorted(row[0] for row in conn.execute(
        "SELECT seconds FROM flexiq_dependency_hold_times WHERE dependency = %s AND ended_at >= %s "
        f"ORDER BY ended_at DESC LIMIT {_TYPICAL_HOLD_SAMPLE}", (dependency, now - _DURATION_HORIZON)))
    return nearest_rank(recent, 0.5)


def _admit_many(conn: psycopg.Connection, owner: str, requests: Sequence[tuple[int, Sequence[DependencyLimit]]],
                now: float) -> dict[int, Deferral | None]:
    """``Backend.admit_many`` inside one transaction, set-based: the state is read once for
    the batch (the jobs, their holds, each dependency's row, its live holds), the batch is
    planned (``limits.plan_admissions``) and the outcome written in a few statements, so the
    dependencies' rows stay locked for a few round trips, not for a round trip per job."""
    answers: dict[int, Deferral | None] = {}
    ids = [job_id for job_id, _ in requests]
    # FOR SHARE: a job cannot end (settle, recovery, cancel) until this admission commits,
    # so a hold is never taken for an attempt that already ended.
    live = {row[0] for row in conn.execute(
        "SELECT id FROM flexiq_jobs WHERE id = ANY(%s) AND state = 'running' AND lease_owner = %s "
        "ORDER BY id FOR SHARE", (ids, owner))}
    held = {row[0] for row in conn.execute(
        "SELECT DISTINCT job_id FROM flexiq_dependency_holds WHERE job_id = ANY(%s) AND owner = %s", (ids, owner))}
    todo: list[tuple[int, list[DependencyLimit]]] = []
    for job_id, dependencies in requests:
        limits = _distinct(dependencies)
        if not limits or job_id in held:
            answers[job_id] = None  # nothing to enter, or admitted before: idempotent
        elif job_id not in live:
            answers[job_id] = Deferral(limits[0].name, 0.0)
        else:
            todo.append((job_id, limits))
    if not todo:
        return answers
    names = sorted({limit.name for _, limits in todo for limit in limits})
    conn.execute("INSERT INTO flexiq_dependencies (dependency) SELECT unnest(%s::text[]) ORDER BY 1 "
                 "ON CONFLICT (dependency) DO NOTHING", (names,))
    # The lock that makes admissions from every host take turns (in name order: never
    # crosswise).  In READ COMMITTED each statement after it sees what the previous holder
    # of the lock committed.
    tats = dict(conn.execute("SELECT dependency, tat FROM flexiq_dependencies WHERE dependency = ANY(%s) "
                             "ORDER BY dependency FOR UPDATE", (names,)).fetchall())
    ages: dict[str, list[float]] = {name: [] for name in names}
    for name, since in conn.execute(_LIVE_HOLDS_OF, (names,)):
        ages[name].append(now - since)
    plan, new_tats = plan_admissions(todo, {name: len(held_for) for name, held_for in ages.items()}, tats, now)
    typical: dict[str, float | None] = {}
    holds: list[tuple[str, int, str, float]] = []
    admitted: collections.Counter = collections.Counter()
    deferred: collections.Counter = collections.Counter()
    for job_id, limits in todo:
        refused = plan[job_id]
        if refused is None:
            answers[job_id] = None
            holds += [(limit.name, job_id, owner, now) for limit in limits if limit.concurrency is not None]
            admitted.update(limit.name for limit in limits)
            continue
        waits = []
        for name, wait in refused:
            if wait is None:  # a full concurrency: when a slot is likely to free up
                if name not in typical:
                    typical[name] = _typical_hold(conn, name, now)
                wait = slot_wait(ages[name], typical[name])
            waits.append(Deferral(name, wait))
        answers[job_id] = refusal = max(waits, key=lambda r: r.wait)
        deferred[refusal.dependency] += 1
    if holds:
        conn.execute(
            "INSERT INTO flexiq_dependency_holds (dependency, job_id, owner, since) "
            "SELECT * FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::float8[]) "
            "ON CONFLICT (dependency, job_id) DO UPDATE SET owner = excluded.owner, since = excluded.since",
            [list(column) for column in zip(*holds)])
    for name in names:
        if new_tats.get(name) != tats.get(name):
            conn.execute("UPDATE flexiq_dependencies SET tat = %s WHERE dependency = %s", (new_tats[name], name))
        if admitted[name] or deferred[name]:
            _bump_dependency(conn, name, int(now), admitted=admitted[name], deferred=deferred[name])
    return answers


def _dependency_stats(conn: psycopg.Connection, dependency: str, now: float, window: float) -> DependencyStats:
    in_use = len(conn.execute(_LIVE_HOLDS, (dependency,)).fetchall())
    waiting = conn.execute(
        "SELECT count(*) FROM (SELECT 1 FROM flexiq_jobs WHERE state = 'queued' AND waiting_for = %s "
        f"LIMIT {COMING_DUE_LIMIT}) AS waiting", (dependency,)).fetchone()[0]
    holds = sorted(row[0] for row in conn.execute(
        "SELECT seconds FROM flexiq_dependency_hold_times WHERE dependency = %s AND ended_at > %s "
        f"ORDER BY ended_at DESC LIMIT {_HOLD_SAMPLE}", (dependency, now - window)))
    admitted, deferred = conn.execute(
        "SELECT COALESCE(sum(admitted), 0), COALESCE(sum(deferred), 0) FROM flexiq_dependency_events "
        "WHERE dependency = %s AND second > %s", (dependency, now - window)).fetchone()
    return DependencyStats(dependency=dependency, in_use=in_use, waiting=int(waiting),
                           hold_p50=nearest_rank(holds, 0.5), hold_p95=nearest_rank(holds, 0.95),
                           holds_ended=len(holds), admitted_rate=int(admitted) / window,
                           deferred_rate=int(deferred) / window, window=window)


# -- tenant caps -----------------------------------------------------------------------------

def _running_per_tenant(conn: psycopg.Connection, tenants: Sequence[str] | None = None) -> dict[str, int]:
    """Running jobs per named tenant in every queue (of ``tenants`` only, when given), from the
    counts and the changes not folded yet."""
    where = "WHERE state = 'running' AND tenant <> ''" + (" AND tenant = ANY(%(tenants)s)" if tenants else "")
    running: dict[str, int] = {}
    for _, _, tenant, n in conn.execute(_COUNTS.format(where=where), {"tenants": list(tenants or ())}):
        running[tenant] = running.get(tenant, 0) + int(n)
    return running


def _capped_candidates(conn: psycopg.Connection, queue: str, full: set[str], want: int,
                       now: float) -> tuple[list[tuple[int, str]], bool]:
    """The first ``want`` due jobs of ``queue`` in claim order, of tenants not in ``full``,
    locked (``FOR UPDATE SKIP LOCKED``); and False when jobs other claims had locked were
    left out of them (so fewer than ``want`` does not mean there are no more).

    With tenants at their cap, and few others with jobs here: the head of each other
    tenant's jobs (flexiq_jobs_tenant_claim), merged, then locked -- not a walk of the
    claim order past every job of the capped tenants, however long their backlog.
    """
    if full:
        tenants = sorted({tenant for _, _, tenant, _ in conn.execute(
            _COUNTS.format(where="WHERE queue = %(queue)s AND state IN ('queued', 'waiting')"),
            {"queue": queue})} - full)
        if len(tenants) <= _HEADS_MAX:
            heads = [row[0] for row in conn.execute(
                f"SELECT j.id FROM unnest(%s::text[]) AS t(tenant) CROSS JOIN LATERAL ("
                f"  SELECT id, priority, run_at FROM flexiq_jobs WHERE {_DUE} AND queue = %s "
                f"  AND tenant = t.tenant AND run_at <= %s ORDER BY priority DESC, run_at, id LIMIT %s) AS j "
                f"ORDER BY j.priority DESC, j.run_at, j.id LIMIT %s", (tenants, queue, now, want, want))]
            if not heads:
                return [], True
            # By primary key alone, then checked here and put back in claim order: with the terms
            # of the claim index in the query, the planner may walk that index instead.
            locked = {job_id: tenant for job_id, tenant, state, delayed in conn.execute(
                "SELECT id, tenant, state, delayed FROM flexiq_jobs WHERE id = ANY(%s) FOR UPDATE SKIP LOCKED",
                (heads,)) if state == JobState.QUEUED.value and not delayed}
            return [(job_id, locked[job_id]) for job_id in heads if job_id in locked], len(locked) == len(heads)
    rows = conn.execute(
        f"SELECT id, tenant FROM flexiq_jobs WHERE {_DUE} AND queue = %s AND run_at <= %s "
        f"AND tenant <> ALL(%s::text[]) ORDER BY priority DESC, run_at, id LIMIT %s "
        f"FOR UPDATE SKIP LOCKED", (queue, now, sorted(full), want)).fetchall()
    return rows, True


def _record_caps(conn: psycopg.Connection, caps: TenantCaps) -> None:
    """Store the caps the workers claim with (for stats), in place of the ones stored: upserted
    in key order, so workers storing them at once neither conflict nor deadlock."""
    items = sorted(caps.max_running.items())
    conn.execute("DELETE FROM flexiq_tenant_caps WHERE tenant <> ALL(%s::text[])", ([name for name, _ in items],))
    if items:
        conn.cursor().executemany(
            "INSERT INTO flexiq_tenant_caps AS c (tenant, max_running) VALUES (%s, %s) "
            "ON CONFLICT (tenant) DO UPDATE SET max_running = excluded.max_running", items)


def _lease(conn: psycopg.Connection, request: ClaimRequest, job_ids: Sequence[int], now: float) -> list[Job]:
    """Lease the due jobs ``job_ids`` (locked by this transaction) to ``request.owner``; return
    them in claim order."""
    if not job_ids:
        return []
    rows = conn.execute(
        f"UPDATE flexiq_jobs SET state = 'running', lease_owner = %s, lease_expires = %s, "
        f"attempts = attempts + 1, started_at = %s, waiting_for = NULL WHERE id = ANY(%s) "
        f"RETURNING {_JOB_COLUMNS}", (request.owner, now + request.lease_seconds, now, list(job_ids))).fetchall()
    jobs = [_row_to_job(row) for row in rows]
    jobs.sort(key=lambda j: (-j.priority, j.run_at, j.id))
    return jobs
