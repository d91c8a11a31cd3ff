"""The PostgreSQL dialect of the job store: one database shared by processes on many machines.

One connection per store, in autocommit mode, every call one explicit transaction.
Claims walk the claim index with ``FOR UPDATE SKIP LOCKED``, so workers claiming
at once take different jobs without waiting on each other; recovery and
promotion skip locked rows too, so maintenance may run from several processes at
once.  Counts and rates are appended, never updated in place, and folded into
their totals (schema.py): no row that every transaction locks.

A connection that dropped (server restart, ``pg_terminate_backend``, a network
cut) is opened again and the transaction run again -- when the failure came
before the COMMIT was sent.  During the COMMIT, nobody knows whether it happened:
the store raises ``CommitUnknown`` and a claim finds out from the jobs it stamped
(``core.Store._exchange``), so a worker's claims and results are never lost or
doubled.  A deadlock or serialization failure is retried like a dropped connection.

``subscribe`` wakes idle workers with LISTEN/NOTIFY: every transaction that makes
jobs due notifies the channel of their queue (see listen.py).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import random
import threading
from typing import Any, Callable, Iterable, Sequence, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict

from ...errors import QueueError, StoreUnavailable, StoreUnreachable
from ..store.clock import SERVER_STEP_SETTLE, ServerClock
from ..store.lifecycle import CommitUnknown, Store
from ..store.dialect import Database, Tx
from ..hosts import decode_report, is_alive
from .listen import Listener, channel_of
from .schema import SCHEMA, SCHEMA_LEVEL, SCHEMA_VERSION, STEPS, STEPS_TABLE, VERSION_TABLE
from ..store.schema_steps import Plan, Step, describe_schema, host_is_older, opening_plan, too_new
from .sql import PostgresTx

__all__ = ["CommitUnknown", "ConnectOptions", "PostgresBackend", "channel_of", "probe"]

log = logging.getLogger(__name__)
T = TypeVar("T")

DIALECT = "postgresql"  # the key of this dialect's schema in a host's report

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
# The server's time, epoch seconds, as it answers (clock_timestamp(), not the transaction's now()).
_SERVER_TIME = "SELECT extract(epoch FROM clock_timestamp())::float8"


class _Committing:
    """Marks that the transaction body finished: an error from here on is the COMMIT's."""

    def __init__(self) -> None:
        self.reached = False


class PostgresDatabase(Database):
    """One connection to the store's database; calls are serialised on it by a lock."""

    appends_changes = True
    shared_by_hosts = True
    schema_versions = {DIALECT: SCHEMA_VERSION}

    def __init__(self, options: ConnectOptions, *, url: str) -> None:
        self.url = url  # as shown in messages: never with a password
        self.options = options
        self._lock = threading.RLock()
        self._closed = False
        self.connection: psycopg.Connection | None = None
        # Leases, beats and run-ats are in the server's time: hosts whose clocks disagree (or
        # step) still agree on it.  Measured with every new connection and now and then.
        self._clock = ServerClock()
        self._clock_checked = False
        with self._lock:
            conn = _connect(options, url)
            try:
                self._migrate(conn)
                self._measure_clock(conn)
            except psycopg.Error as exc:
                conn.close()
                raise self._translate(exc, "open") from None
            except StoreUnavailable:
                conn.close()
                raise
            self.connection = conn

    # -- connection and schema -------------------------------------------------------------

    def _connection(self) -> psycopg.Connection:
        if self._closed:
            raise QueueError(f"the queue database {self.url} is closed")
        if self.connection is None or self.connection.closed or self.connection.broken:
            lost = self.connection is not None
            if lost:
                self.connection.close()
                self.connection = None
            # Said once connected again: a failed attempt is the error the caller shows, in one line.
            self.connection = _connect(self.options, self.url)
            self._clock_checked = False  # another server, perhaps (a failover): measure again
            if lost:
                log.warning("The connection to the queue database %s was lost; connected again.", self.url)
        return self.connection

    def clock(self) -> float:
        return self._clock()

    def clock_error(self) -> float:
        return self._clock.error()

    def refresh_clock(self) -> None:
        with self._lock:
            self._clock_checked = False

    def clock_steady(self) -> bool:
        return self._clock.steady()

    def _measure_clock(self, conn: psycopg.Connection) -> None:
        step = self._clock.last_step
        self._clock.measure(lambda: float(conn.execute(_SERVER_TIME).fetchone()[0]))
        self._clock_checked = True
        if self._clock.last_step is not step:
            log.warning("The clock of the queue database server %s stepped by %+.1fs: no host is found dead "
                        "for %.0fs, until every process has measured it.", self.url, self._clock.last_step,
                        SERVER_STEP_SETTLE)

    def _migrate(self, conn: psycopg.Connection) -> None:
        """Create the schema, or apply the steps this code knows and the store lacks, in one
        transaction (store/schema_steps.py: expand steps at once, contract steps once no older
        host is alive).

        The state is read again under an advisory lock (one per schema): processes
        opening a store at once must not both run the DDL.
        """
        if not self._schema_work(conn).record:
            return
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('flexiq schema of ' || current_schema()))")
            level = read_version(conn)
            if level == 0:
                conn.execute(f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version integer NOT NULL)")
                for statement in SCHEMA:
                    conn.execute(statement)
                _record_steps(conn, STEPS, SCHEMA_LEVEL)
                log.info("The queue database %s was created at schema version %d.", self.url, SCHEMA_VERSION)
                return
            work = self._schema_work(conn)
            if not work.record:
                return
            for step in work.run:
                for statement in step.statements:
                    conn.execute(statement)
            _record_steps(conn, [*work.earlier, *work.run], work.level)
        if work.run:
            log.info("The queue database %s took schema steps %s (level %d, was %d).", self.url,
                     ", ".join(f"{step.number} ({step.kind.value})" for step in work.run), work.level, level)
        for step in work.waiting:
            log.info("Schema step %d (contract) of the queue database %s waits until no host of an "
                     "older flexiqd is alive.", step.number, self.url)

    def _schema_work(self, conn: psycopg.Connection) -> Plan:
        """What opening the store has to do; StoreUnavailable when the store took a contract
        step this code does not know."""
        return opening_plan(STEPS, read_version(conn), lambda: read_applied(conn),
                            lambda step: older_hosts_alive(conn, step), store=str(self.url))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self.connection is not None:
                self.connection.close()
                self.connection = None

    # -- transactions ----------------------------------------------------------------------

    def write(self, operation: str, body: Callable[[Tx], T]) -> T:
        return self._run(operation, body, snapshot=False)

    def read(self, operation: str, body: Callable[[Tx], T]) -> T:
        return self._run(operation, body, snapshot=True)

    def read_one(self, operation: str, body: Callable[[Tx], T]) -> T:
        # No BEGIN and COMMIT: one statement in autocommit mode sees one snapshot of its own.
        return self._run(operation, body, snapshot=True, alone=True)

    def _run(self, operation: str, body: Callable[[Tx], T], *, snapshot: bool, alone: bool = False) -> T:
        """Run ``body`` in one transaction and return what it returns.

        ``snapshot``: a read-only REPEATABLE READ transaction, so several SELECTs see
        one state; ``alone``: ``body`` runs one statement, outside any transaction block.
        ``body`` may run more than once (a dropped connection, a deadlock).
        """
        with self._lock:
            for attempt in range(1, _ATTEMPTS + 1):
                conn = self._connection()
                committing = _Committing()
                try:
                    if not self._clock_checked or self._clock.due():
                        self._measure_clock(conn)
                    if alone:
                        return body(PostgresTx(conn))
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
    def _once(conn: psycopg.Connection, body: Callable[[Tx], T], snapshot: bool, committing: _Committing) -> T:
        # Said in the BEGIN itself (no round trip of its own), and only for this transaction.
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ if snapshot else None
        conn.read_only = True if snapshot else None
        with conn.transaction():
            result = body(PostgresTx(conn))
            committing.reached = True
        return result

    def _translate(self, exc: psycopg.Error, operation: str) -> QueueError:
        text = _first_line(exc)
        if isinstance(exc, psycopg.OperationalError):
            kind = StoreUnreachable if _passes(exc) else StoreUnavailable
            return kind(f"{operation} on the queue database {self.url} failed: {text}")
        if isinstance(exc, (pg_errors.InsufficientPrivilege, pg_errors.ReadOnlySqlTransaction)):
            return StoreUnavailable(f"{operation} on the queue database {self.url} was refused: {text}")
        return QueueError(f"{operation} on the queue database {self.url} failed: {text}")

    # -- waking idle workers ---------------------------------------------------------------

    def subscribe(self, queues: Sequence[str], wake: Callable[[], None]) -> Callable[[], None] | None:
        """A thread of its own LISTENs on its own connection and calls ``wake`` once listening
        (notices sent before that reached nobody); a lost connection is opened again, with
        the same call.  With ``listen=off`` in the URL (for a pooler in transaction mode,
        where LISTEN cannot work) nothing listens: the workers' polling alone finds new jobs.
        """
        if not self.options.listen or not queues:
            return None
        listener = Listener(lambda: _connect(self.options, self.url), [channel_of(queue) for queue in queues], wake)
        listener.start()
        return listener.stop


class PostgresBackend(Store):
    """A job store in a PostgreSQL database, shared by processes on many machines.

    Thread-safe: calls are serialised on one connection by a lock.
    """

    def __init__(self, options: ConnectOptions, *, url: str, rng: random.Random | None = None) -> None:
        super().__init__(PostgresDatabase(options, url=url), rng=rng)
        self.options = options

    @functools.cached_property
    def schema(self) -> str:
        """The schema the store's tables live in (the first on its search path that exists)."""
        return self.database.read_one("read the store's schema",
                                      lambda tx: tx.conn.execute("SELECT current_schema()").fetchone()[0])


def read_version(conn: psycopg.Connection) -> int:
    """The store's schema level, as older code reads it (0: not created yet)."""
    if not _table_exists(conn, VERSION_TABLE):
        return 0
    row = conn.execute(f"SELECT max(version) FROM {VERSION_TABLE}").fetchone()
    return row[0] or 0


def _table_exists(conn: psycopg.Connection, table: str) -> bool:
    # Read from pg_class, not with to_regclass(): the backend's name cache may still say
    # "no such table" after another process created it while we waited for the lock;
    # opening the catalog in this transaction makes the backend catch up first.
    return conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
        "ON n.oid = c.relnamespace WHERE c.relname = %s AND n.nspname = current_schema())",
        (table,)).fetchone()[0]


def read_applied(conn: psycopg.Connection) -> frozenset[int] | None:
    """The schema steps applied to the store (None: a store from before they were recorded)."""
    if not _table_exists(conn, STEPS_TABLE):
        return None
    return frozenset(row[0] for row in conn.execute(f"SELECT step FROM {STEPS_TABLE}"))


def older_hosts_alive(conn: psycopg.Connection, step: int) -> bool:
    """Whether a live host may run code that does not know schema step ``step`` (its last beat
    reports no newer schema), by the database's clock."""
    if not _table_exists(conn, "flexiq_hosts"):
        return False
    rows = conn.execute("SELECT last_beat, interval, report, extract(epoch FROM clock_timestamp())::float8 "
                        "FROM flexiq_hosts").fetchall()
    return any(is_alive(last_beat, interval, now) and host_is_older(decode_report(report), step, DIALECT)
               for last_beat, interval, report, now in rows)


def _record_steps(conn: psycopg.Connection, steps: Iterable[Step], level: int) -> None:
    """Record ``steps`` as applied and ``level`` as what older code reads."""
    conn.execute(f"CREATE TABLE IF NOT EXISTS {STEPS_TABLE} (step integer PRIMARY KEY, kind text NOT NULL, "
                 "applied_at timestamptz NOT NULL DEFAULT clock_timestamp())")
    for step in steps:
        conn.execute(f"INSERT INTO {STEPS_TABLE} (step, kind) VALUES (%s, %s) ON CONFLICT (step) DO NOTHING",
                     (step.number, step.kind.value))
    conn.execute(f"DELETE FROM {VERSION_TABLE}")
    conn.execute(f"INSERT INTO {VERSION_TABLE} (version) VALUES (%s)", (level,))


def probe(options: ConnectOptions, url: str) -> str:
    """Connect, read the server's version and the store's schema version, change nothing;
    return a short description.  StoreUnavailable, in one line, when that cannot be done."""
    connection = _connect(options, url)
    try:
        server = connection.info.parameter_status("server_version") or "?"
        level = read_version(connection)
        applied = read_applied(connection) if level else None
    except psycopg.Error as exc:
        raise StoreUnavailable(f"cannot read the queue database {url}: {_first_line(exc)}") from None
    finally:
        connection.close()
    if too_new(STEPS, level):
        raise StoreUnavailable(f"the queue database {url} has schema version {level}, newer than "
                               f"this flexiqd understands ({SCHEMA_VERSION}): upgrade flexiqd")
    return f"PostgreSQL {server.split()[0]}, {describe_schema(level, applied)}"


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
        kind = StoreUnreachable if _passes(exc) else StoreUnavailable
        raise kind(f"cannot connect to the queue database {url}: {_first_line(exc)}") from None
    if not options.prepare:
        conn.prepare_threshold = None
    return conn


# A server that is down, restarting or full of connections: these pass by themselves; a wrong
# password, a missing database or a refused login do not.  Errors raised while connecting
# carry no SQLSTATE (libpq gives only a message), so for those the message decides.
_PASSING_STATES = ("08", "57P01", "57P02", "57P03", "53300")
_PASSING_WORDS = ("connection refused", "timeout expired", "timed out", "starting up", "shutting down",
                  "not yet accepting connections", "in recovery", "too many clients", "no such file or directory",
                  "server closed the connection", "connection reset", "terminating connection", "could not receive data", "could not send data",
                  "no route to host", "network is unreachable", "consuming input failed")


def _passes(exc: psycopg.Error) -> bool:
    """Whether ``exc`` says the server cannot be reached now, rather than that something is wrong."""
    state = exc.sqlstate
    if state is not None:
        return state.startswith(_PASSING_STATES)
    text = str(exc).lower()
    return any(words in text for words in _PASSING_WORDS)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
