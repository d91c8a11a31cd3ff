"""The SQLite dialect of the job store: one file shared by the processes of one machine.

Durable by default: WAL with ``synchronous=FULL``, so an enqueue that returned
survives a power loss (``?synchronous=normal`` trades that for speed).  The
connection is in autocommit mode and every change runs inside one
``BEGIN IMMEDIATE`` transaction, so writers queue on the busy timeout instead of
failing half-way or deadlocking on a lock upgrade.  Only one writer runs at a
time, so nothing here needs row locks: the lifecycle is store/lifecycle.py's, the
statements sql.py's.
"""

from __future__ import annotations

import os
import random
import sqlite3
import stat
import threading
import time
from typing import Callable, Iterable, Sequence, TypeVar

from ...errors import QueueError, StoreDamaged, StoreUnavailable, StoreUnreachable
from ..store import clock as store_clock
from ..store.lifecycle import Store
from ..store.dialect import Database, Tx
from ..hosts import decode_report, is_alive
from ..moved import marked_target, moved_message, moved_to
from ..store.schema_steps import Plan, Step, host_is_older, opening_plan
from .check import RESTORE_ADVICE, check_files, is_damage
from .schema import SCHEMA, SCHEMA_VERSION, STEPS, STEPS_TABLE
from .sql import SQLiteTx

T = TypeVar("T")

DIALECT = "sqlite"  # the key of this dialect's schema in a host's report

_SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL", "off": "OFF", "extra": "EXTRA"}


def read_applied(conn: sqlite3.Connection) -> frozenset[int] | None:
    """The schema steps applied to the store (None: a store from before they were recorded)."""
    if not _table_exists(conn, STEPS_TABLE):
        return None
    return frozenset(row[0] for row in conn.execute(f"SELECT step FROM {STEPS_TABLE}"))


def older_hosts_alive(conn: sqlite3.Connection, step: int) -> bool:
    """Whether a live host may run code that does not know schema step ``step`` (its last beat
    reports no newer schema)."""
    if not _table_exists(conn, "hosts"):
        return False
    now = _store_time(conn)
    return any(is_alive(last_beat, interval, now) and host_is_older(decode_report(report), step, DIALECT)
               for last_beat, interval, report in conn.execute("SELECT last_beat, interval, report FROM hosts"))


def _store_time(conn: sqlite3.Connection) -> float:
    """The store's time (``flexiqd.queue.store.clock``: its beats are in it) before the store is open:
    from the anchor it keeps, else -- a store from before the anchor -- the wall clock."""
    row = conn.execute("SELECT boot, at, since FROM clock").fetchone() if _table_exists(conn, "clock") else None
    stored = store_clock.Anchor(*row) if row else None
    anchor = store_clock.anchor_for_boot(stored, store_clock.boot_id(), time.time(), store_clock.elapsed())
    return store_clock.AnchoredClock(anchor)()


def _record_steps(conn: sqlite3.Connection, steps: Iterable[Step], level: int) -> None:
    """Record ``steps`` as applied and ``level`` as what older code reads."""
    conn.execute(f"CREATE TABLE IF NOT EXISTS {STEPS_TABLE} (step INTEGER PRIMARY KEY, kind TEXT NOT NULL, "
                 "applied_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0))")
    conn.executemany(f"INSERT OR IGNORE INTO {STEPS_TABLE} (step, kind) VALUES (?, ?)",
                     [(step.number, step.kind.value) for step in steps])
    conn.execute(f"PRAGMA user_version = {int(level)}")


def _disk_problem(path: str, *, write_probe: bool = False) -> str | None:
    """``disk.disk_problem``, loaded only when a file cannot be written: a worker's start
    does without it."""
    from .disk import disk_problem

    return disk_problem(path, write_probe=write_probe)


def _table_exists(conn: sqlite3.Connection, table: str) -> bool:
    found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
    return found is not None


class SQLiteDatabase(Database):
    """One SQLite file; calls are serialised on one connection by a lock."""

    schema_versions = {DIALECT: SCHEMA_VERSION}

    def __init__(self, path: str, *, synchronous: str = "full", busy_timeout: float = 5.0,
                 url: str | None = None) -> None:
        self.path = path
        self.url = url or f"sqlite:///{path}"
        self.busy_timeout = busy_timeout
        self._lock = threading.RLock()
        if synchronous.lower() not in _SYNCHRONOUS:
            raise StoreUnavailable(
                f"{self.url}: synchronous={synchronous!r} is not one of {', '.join(_SYNCHRONOUS)}")
        self.connection: sqlite3.Connection | None = self._open(_SYNCHRONOUS[synchronous.lower()])
        self._clock = store_clock.AnchoredClock(self._anchor(self.connection))

    def clock(self) -> float:
        return self._clock()

    @staticmethod
    def _anchor(conn: sqlite3.Connection) -> store_clock.Anchor:
        """This boot's anchor of the store's clock (``flexiqd.queue.store.clock``): the stored one, or
        a new one stored by the first process of the boot (read again under the write lock,
        so processes opening at once agree).  A store this process cannot write to yet (a
        full or read-only disk) gets one of its own for now: it can change nothing meanwhile;
        one it cannot read (a damaged page) too: the calls that read it will say so."""
        boot = store_clock.boot_id()

        def stored() -> store_clock.Anchor | None:
            row = conn.execute("SELECT boot, at, since FROM clock").fetchone()
            return store_clock.Anchor(*row) if row else None

        try:
            found = stored()
        except sqlite3.Error:
            return store_clock.anchor_for_boot(None, "", time.time(), store_clock.elapsed())
        anchor = store_clock.anchor_for_boot(found, boot, time.time(), store_clock.elapsed())
        if not store_clock.worth_storing(anchor, found):
            return anchor
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                found = stored()
                anchor = store_clock.anchor_for_boot(found, boot, time.time(), store_clock.elapsed())
                if store_clock.worth_storing(anchor, found):
                    conn.execute("DELETE FROM clock")
                    conn.execute("INSERT INTO clock (boot, at, since) VALUES (?, ?, ?)",
                                 (anchor.boot, anchor.at, anchor.since))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.Error:
            pass
        return anchor

    def _open(self, synchronous: str) -> sqlite3.Connection:
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise StoreUnavailable(
                f"cannot open the queue database {self.path}: directory {directory} does not exist")
        if os.path.exists(self.path) and not os.access(self.path, os.W_OK):
            target = moved_to(self.path)
            if target is not None:
                raise StoreUnavailable(moved_message(self.path, target))
            problem = _disk_problem(self.path)
            if problem is not None:  # a read-only mount: it may be remounted, so wait
                raise StoreUnreachable(f"cannot open the queue database {self.path}: {problem}")
            raise StoreUnavailable(
                f"cannot open the queue database {self.path}: the file is read-only for this user")
        if not os.path.exists(self.path) and not os.access(directory, os.W_OK):
            raise StoreUnavailable(
                f"cannot create the queue database {self.path}: directory {directory} is not writable")
        # Before SQLite opens it: its first connection would rebuild a -shm index whose log is
        # gone, and erase the only sign that committed transactions were lost with it.  (Not
        # while this process holds the file open: check_files says why.)
        try:
            damage = check_files(self.path, durable=synchronous in ("FULL", "EXTRA"))
        except OSError as exc:
            raise StoreUnavailable(f"cannot open the queue database {self.path}: {exc.strerror}") from None
        if damage:
            raise StoreDamaged(f"the queue database {self.path} is damaged: "
                               f"{'; '.join(f.message for f in damage)}. {RESTORE_ADVICE}")
        if not os.path.lexists(self.path):
            try:
                # Created here, not by SQLite (which uses 0644): 0666 less the umask lets the
                # daemon and the workers share the file through their group (UMask=0007);
                # the -wal and -shm files take the database file's mode.
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
                try:
                    if os.stat(directory).st_mode & stat.S_ISGID:
                        # A shared folder (/var/lib/flexiq is set-group-ID): the file joined its
                        # group and must be writable by it, whatever this process's umask (a
                        # producer's is often 0022).
                        os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) | 0o060)
                finally:
                    os.close(fd)
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
            target = marked_target(conn)  # before anything writes: root may write a read-only file
            if target is not None:
                raise StoreUnavailable(moved_message(self.path, target))
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise StoreUnavailable(
                    f"cannot use the queue database {self.path}: WAL mode refused (got {mode})")
            conn.execute(f"PRAGMA synchronous = {synchronous}")
            if self._schema_work(conn).record:
                self._migrate(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise self._translate(exc, "open") from None
        except StoreUnavailable:
            conn.close()
            raise
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Create the schema, or apply the steps this code knows and the store lacks, in one
        transaction (store/schema_steps.py: expand steps at once, contract steps once no older
        host is alive).

        The state is read again under the write lock: two processes opening a store at
        once must not both run the migrations.
        """
        conn.execute("BEGIN IMMEDIATE")
        try:
            work = self._schema_work(conn)
            if conn.execute("PRAGMA user_version").fetchone()[0] == 0:
                for statement in SCHEMA:
                    conn.execute(statement)
            else:
                for step in work.run:
                    for statement in step.statements:
                        conn.execute(statement)
            if work.record:
                _record_steps(conn, [*work.earlier, *work.run], work.level)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _schema_work(self, conn: sqlite3.Connection) -> Plan:
        """What opening the store has to do; StoreUnavailable when the store took a contract
        step this code does not know."""
        level = conn.execute("PRAGMA user_version").fetchone()[0]
        return opening_plan(STEPS, level, lambda: read_applied(conn), lambda step: older_hosts_alive(conn, step),
                            store=str(self.path))

    def close(self) -> None:
        with self._lock:
            if self.connection is not None:
                self.connection.close()
                self.connection = None

    def _translate(self, exc: sqlite3.Error, operation: str) -> QueueError:
        text = str(exc)
        if "locked" in text or "busy" in text:
            return StoreUnavailable(
                f"{operation} on the queue database {self.path} failed: it stayed locked by "
                f"another process for longer than the busy timeout ({self.busy_timeout:g}s)")
        if is_damage(exc):
            return StoreDamaged(f"{operation} on the queue database {self.path} met damage: the file is "
                                f"corrupt or not a SQLite database ({text}). {RESTORE_ADVICE}")
        if "disk is full" in text or "readonly" in text or "read-only" in text or "disk I/O error" in text:
            problem = _disk_problem(self.path, write_probe=True)
            if problem is not None:  # the disk, not the store: it passes once there is room again
                return StoreUnreachable(f"{operation} was not done: {problem}")
        if "readonly" in text or "read-only" in text:
            return StoreUnavailable(f"the queue database {self.path} is read-only ({text})")
        if "unable to open" in text:
            return StoreUnavailable(f"cannot open the queue database {self.path} ({text})")
        return QueueError(f"{operation} on the queue database {self.path} failed: {text}")

    def write(self, operation: str, body: Callable[[Tx], T]) -> T:
        # BEGIN IMMEDIATE: the write lock is taken at once, never upgraded from a read lock.
        return self._run(operation, body, "BEGIN IMMEDIATE")

    def read(self, operation: str, body: Callable[[Tx], T]) -> T:
        # One read transaction, so the several SELECTs of stats() see one snapshot.
        return self._run(operation, body, "BEGIN")

    def subscribe(self, queues: Sequence[str], wake: Callable[[], None]) -> Callable[[], None] | None:
        """Look at each commit (``watch``), none while nothing commits; without inotify
        nothing watches, and polling alone finds new jobs."""
        if not queues:
            return None
        from .watch import watch_due  # only the processes that wait for jobs load it

        return watch_due(self.path, queues, wake, busy_timeout=self.busy_timeout)

    def _run(self, operation: str, body: Callable[[Tx], T], begin: str) -> T:
        with self._lock:
            conn = self.connection
            if conn is None:
                raise QueueError(f"the queue database {self.path} is closed")
            try:
                conn.execute(begin)
                try:
                    result = body(SQLiteTx(conn))
                    conn.execute("COMMIT")
                except BaseException:
                    _roll_back(conn)
                    raise
                return result
            except sqlite3.Error as exc:
                raise self._translate(exc, operation) from None


def _roll_back(conn: sqlite3.Connection) -> None:
    """End a failed transaction, whatever failed.  A full disk may have rolled it back already
    (then ROLLBACK itself fails), and a COMMIT that failed leaves it open: either way the
    connection must come out of it, or every later BEGIN fails ("within a transaction")."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # rolled back by SQLite meanwhile: the error that ended it is the one to report


class SQLiteBackend(Store):
    """A job store in one SQLite file, shared by processes on one machine.

    Thread-safe: calls are serialised on one connection by a lock.
    """

    def __init__(self, path: str, *, synchronous: str = "full", busy_timeout: float = 5.0,
                 rng: random.Random | None = None, url: str | None = None) -> None:
        super().__init__(SQLiteDatabase(path, synchronous=synchronous, busy_timeout=busy_timeout, url=url), rng=rng)
        self.path = path
        self.busy_timeout = busy_timeout
