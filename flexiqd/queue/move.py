"""Moving a store from its SQLite file to PostgreSQL: ``flexiq move-store``.

A move is made with the fleet quiet: no daemon beating on the file (its host alive,
``hosts.is_alive``) and no job running.  Both are checked under the file's write lock,
which is held from the first read to the last write, so nothing changes the file in
between (a producer that enqueues meanwhile waits on the lock, then is refused).

What is carried, in ONE transaction of the target (all of it, or nothing):
- the jobs, under their own ids: queued (due, delayed, waiting for a dependency), dead,
  and -- unless ``history=False`` -- done and cancelled ones with their results; with
  their arguments, queue, priority, attempts used, run_at, timeout, idempotency key,
  tenant and last error.  Counts follow from the target's own triggers;
- the attempts' history (``executions``) of the jobs carried;
- the schedules: each one's pause state, first-seen time and totals, and the ledger of
  decided slots, so no slot fires twice across the move;
- each rate-limited dependency's budget (its GCRA time) and the tenant caps the
  workers last claimed with.
Not carried: the per-second rates (stats' rates start again from the move), the recent
dependency hold times and admissions (measurements that refill within a minute), and
the hosts (each daemon registers its own at its first beat).

The target must hold no job: ids are kept, and a move never merges two queues.  The
old file is then marked (flexiqd.queue.moved) and made read-only.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import stat
from typing import Any, Iterable, Mapping, Sequence

from ..errors import FlexiqdError, StoreUnavailable
from .hosts import DEAD_AFTER_BEATS, HostInfo, host_info
from .moved import mark_moved, moved_message, moved_to
from .url import POSTGRES_SCHEMES, check_url, open_backend, safe_url, sqlite_path

# The jobs' columns, the same in both stores (``delayed`` is 0/1 in SQLite, a boolean in PostgreSQL).
JOB_COLUMNS = ("id", "queue", "task", "payload", "priority", "state", "delayed", "run_at", "attempts",
               "max_attempts", "timeout", "idempotency_key", "tenant", "lease_owner", "lease_expires",
               "lease_outcome", "enqueued_at", "started_at", "finished_at", "result", "error", "waiting_for")
EXECUTION_COLUMNS = ("job_id", "attempt", "worker", "started_at", "finished_at", "outcome", "error")
SLOT_COLUMNS = ("schedule", "kind", "slot", "outcome", "reason", "slots", "job_id", "host", "decided_at")
HISTORY_STATES = ("done", "cancelled")


class MoveRefused(FlexiqdError):
    """A move that was not made; nothing changed in either store."""


@dataclasses.dataclass(frozen=True)
class MoveReport:
    """What a move carried, per kind of row, and what it did to the old file."""

    source: str
    target: str
    jobs_by_state: Mapping[str, int]
    executions: int
    schedules: int
    ledger_rows: int
    left_behind: int          # finished jobs not carried (history=False)
    recovered: int            # expired leases handed back before the move
    read_only: bool           # the old file's write permissions were removed

    @property
    def jobs(self) -> int:
        return sum(self.jobs_by_state.values())


@dataclasses.dataclass(frozen=True)
class _Rows:
    """Everything read from the old file, under its write lock."""

    jobs: list[tuple]
    executions: list[tuple]
    schedules: list[tuple]
    slots: list[tuple]
    tats: list[tuple]
    caps: list[tuple]
    left_behind: int


# -- the decision (pure) ---------------------------------------------------------------------

def quiet_refusal(hosts: Sequence[HostInfo], running_by_owner: Mapping[str, int], now: float) -> str | None:
    """Why the store is not quiet enough to move (None: it is): a daemon still beating, or
    jobs still running."""
    alive = [host for host in hosts if host.alive]
    if alive:
        host = alive[0]
        return (f"the daemon on host {host.name} is running (it beat {max(0.0, now - host.last_beat):.0f}s ago): stop it and its "
                f"workers first (systemctl stop flexiqd); a stopped daemon counts as gone "
                f"{DEAD_AFTER_BEATS * host.interval:g}s after its last beat")
    if running_by_owner:
        total = sum(running_by_owner.values())
        owners = ", ".join(sorted(running_by_owner)[:3]) + (", ..." if len(running_by_owner) > 3 else "")
        return (f"{total} job{'s are' if total != 1 else ' is'} running (workers {owners}): let the pools "
                f"drain (flexiqctl drain POOL) or stop flexiqd and wait for its workers to finish, then "
                f"move again")
    return None


# -- the move (I/O) --------------------------------------------------------------------------

def move_store(source_url: str, target_url: str, *, history: bool = True,
               now: float | None = None) -> MoveReport:
    """Move the SQLite store of ``source_url`` into the empty PostgreSQL store of ``target_url``.

    Blocking.  All or nothing in the target; the old file is marked and made read-only
    only after the target committed.  ``MoveRefused`` when the fleet is not quiet, the
    target holds jobs, or the file was moved before.
    """
    path, shown_target = _check_urls(source_url, target_url)
    _check_file(path)
    recovered, now = _quiet_down(source_url, now)
    target = open_backend(target_url)  # creates or migrates the target's schema
    try:
        source = sqlite3.connect(path, isolation_level=None, timeout=30.0)
        try:
            source.execute("BEGIN IMMEDIATE")  # held to the end: the file cannot change meanwhile
            try:
                rows = _read(source, now, history)
                counted = _write_target(target, rows)
            except BaseException:
                source.execute("ROLLBACK")
                raise
            try:
                mark_moved(source, path, shown_target, now)
                source.execute("COMMIT")
            except sqlite3.Error as exc:
                if source.in_transaction:
                    source.execute("ROLLBACK")
                raise FlexiqdError(
                    f"the jobs are in {shown_target} now, but {path} could not be marked as moved ({exc}): "
                    f"start nothing on the old file; set store: {shown_target} and remove {path}") from None
            # One self-contained file, readable without its -wal and -shm (best effort: a
            # process that still holds the file open keeps WAL in force).
            try:
                source.execute("PRAGMA journal_mode = DELETE")
            except sqlite3.Error:
                pass
        finally:
            source.close()
    finally:
        target.close()
    return MoveReport(source=path, target=shown_target, jobs_by_state=counted, executions=len(rows.executions),
                      schedules=len(rows.schedules), ledger_rows=len(rows.slots), left_behind=rows.left_behind,
                      recovered=recovered, read_only=_make_read_only(path))


def _check_urls(source_url: str, target_url: str) -> tuple[str, str]:
    check_url(target_url)
    if target_url.split(":", 1)[0] not in POSTGRES_SCHEMES:
        raise MoveRefused(f"--to {safe_url(target_url)}: a store moves to PostgreSQL, "
                          f"as in postgresql://flexiq@db.example/flexiq")
    if source_url.split(":", 1)[0] in POSTGRES_SCHEMES:
        raise MoveRefused(f"{safe_url(source_url)} is a PostgreSQL store already: move-store moves a SQLite "
                          f"store (give it with --url sqlite:////path/queue.db)")
    check_url(source_url)
    return sqlite_path(source_url), safe_url(target_url)


def _check_file(path: str) -> None:
    """Before anything is written anywhere: the file exists, was not moved, and can be marked."""
    if not os.path.isfile(path):
        raise StoreUnavailable(f"there is no queue database at {path}")
    target = moved_to(path)
    if target is not None:
        raise MoveRefused(moved_message(path, target))
    directory = os.path.dirname(os.path.abspath(path))
    for name, what in ((path, "the file"), (directory, "its directory")):
        if not os.access(name, os.W_OK):
            raise MoveRefused(f"cannot move {path}: {what} is not writable for this user (run as root)")


def _quiet_down(source_url: str, now: float | None) -> tuple[int, float]:
    """Refuse early when a daemon beats on the file; else hand back the expired leases of
    workers that are gone (as the daemon would), and refuse if jobs are still held.  The
    number handed back, and ``now``: the store's time (``Backend.clock``) unless given --
    its beats and leases are in it, whatever the wall clock says."""
    backend = open_backend(source_url)  # brings an older file up to this version's schema
    now = backend.clock() if now is None else now
    try:
        refusal = quiet_refusal(backend.hosts(now=now), {}, now)
        if refusal:
            raise MoveRefused(f"cannot move {sqlite_path(source_url)}: {refusal}")
        recovered = backend.recover_expired(now=now) + sum(backend.rescue_dead_hosts(now=now).values())
        refusal = quiet_refusal([], backend.lease_owners(), now)
        if refusal:  # before the target is touched (checked again under the lock)
            raise MoveRefused(f"cannot move {sqlite_path(source_url)}: {refusal}")
        return recovered, now
    finally:
        backend.close()


def _read(conn: sqlite3.Connection, now: float, history: bool) -> _Rows:
    hosts = [host_info(*row, now=now) for row in conn.execute(
        "SELECT name, last_beat, interval, report, registered_at FROM hosts")]
    running = dict(conn.execute("SELECT COALESCE(lease_owner, '?'), COUNT(*) FROM jobs WHERE state = 'running' "
                                "GROUP BY 1"))
    refusal = quiet_refusal(hosts, running, now)
    if refusal:
        raise MoveRefused(f"cannot move the store: {refusal}")
    finished = ", ".join(f"'{state}'" for state in HISTORY_STATES)
    carried = "1" if history else f"j.state NOT IN ({finished})"
    jobs = [_job_row(row) for row in conn.execute(
        f"SELECT {', '.join('j.' + c for c in JOB_COLUMNS)} FROM jobs j WHERE {carried} ORDER BY j.id")]
    left_behind = 0 if history else conn.execute(
        f"SELECT COUNT(*) FROM jobs WHERE state IN ({finished})").fetchone()[0]
    executions = conn.execute(
        f"SELECT {', '.join('e.' + c for c in EXECUTION_COLUMNS)} FROM executions e "
        f"JOIN jobs j ON j.id = e.job_id WHERE {carried} ORDER BY e.id").fetchall()
    return _Rows(
        jobs=jobs, executions=executions,
        schedules=[(name, since, bool(paused), fired, skipped) for name, since, paused, fired, skipped in
                   conn.execute("SELECT name, since, paused, fired, skipped FROM schedules")],
        slots=conn.execute(f"SELECT {', '.join(SLOT_COLUMNS)} FROM schedule_slots").fetchall(),
        tats=conn.execute("SELECT dependency, tat FROM dependency_tat").fetchall(),
        caps=conn.execute("SELECT tenant, max_running FROM tenant_caps").fetchall(),
        left_behind=left_behind)


def _job_row(row: Sequence[Any]) -> tuple:
    values = list(row)
    at = JOB_COLUMNS.index("delayed")
    values[at] = bool(values[at])
    return tuple(values)


def _write_target(target, rows: _Rows) -> dict[str, int]:
    """Write every row in one transaction of the target; the jobs per state it then holds."""
    import psycopg

    from .postgres.database import channel_of

    conn = target.database.connection
    committing = False
    try:
        with conn.transaction():
            # Nobody enqueues between the check and the copy: the ids carried are the old ones.
            conn.execute("LOCK TABLE flexiq_jobs IN SHARE ROW EXCLUSIVE MODE")
            held = conn.execute("SELECT count(*) FROM flexiq_jobs").fetchone()[0]
            if held:
                raise MoveRefused(
                    f"{target.url} holds {held} job{'s' if held != 1 else ''} already: a store moves into an "
                    f"empty one only (jobs keep their ids). If an earlier move of this file reached it, "
                    f"the jobs are there: set store: {target.url}")
            _copy(conn, "flexiq_jobs", JOB_COLUMNS, rows.jobs)
            _copy(conn, "flexiq_executions", EXECUTION_COLUMNS, rows.executions)
            if rows.jobs:  # new ids above the carried ones, and never below ids handed out before
                conn.execute("SELECT setval(s, GREATEST((SELECT max(id) FROM flexiq_jobs), "
                             "COALESCE(pg_sequence_last_value(s::regclass), 0))) "
                             "FROM pg_get_serial_sequence('flexiq_jobs', 'id') AS s")
            # A daemon that ran on the target before may have registered the schedules: the
            # file's pause state and totals win, and its ledger rows join the target's.
            _many(conn, "INSERT INTO flexiq_schedules (name, since, paused, fired, skipped) "
                        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (name) DO UPDATE SET "
                        "since = LEAST(flexiq_schedules.since, excluded.since), paused = excluded.paused, "
                        "fired = flexiq_schedules.fired + excluded.fired, "
                        "skipped = flexiq_schedules.skipped + excluded.skipped", rows.schedules)
            _many(conn, f"INSERT INTO flexiq_schedule_slots ({', '.join(SLOT_COLUMNS)}) "
                        f"VALUES ({', '.join(['%s'] * len(SLOT_COLUMNS))}) ON CONFLICT DO NOTHING", rows.slots)
            _many(conn, "INSERT INTO flexiq_dependencies (dependency, tat) VALUES (%s, %s) "
                        "ON CONFLICT (dependency) DO UPDATE SET tat = GREATEST(flexiq_dependencies.tat, "
                        "excluded.tat)", rows.tats)
            _many(conn, "INSERT INTO flexiq_tenant_caps (tenant, max_running) VALUES (%s, %s) "
                        "ON CONFLICT (tenant) DO NOTHING", rows.caps)
            counted = dict(conn.execute("SELECT state, count(*) FROM flexiq_jobs GROUP BY state").fetchall())
            expected = _by_state(rows.jobs)
            if counted != expected:  # a guard on the copy itself: never commit a partial one
                raise FlexiqdError(f"the move to {target.url} was rolled back: it counted {counted} jobs "
                                   f"per state where the file holds {expected}")
            for queue in sorted({row[JOB_COLUMNS.index("queue")] for row in rows.jobs}):
                conn.execute("SELECT pg_notify(%s, '')", (channel_of(queue),))
            committing = True
    except psycopg.Error as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if committing:  # the COMMIT was sent: nobody knows whether it happened
            raise StoreUnavailable(
                f"the move to {target.url} may or may not have committed ({message}); the old file is left "
                f"as it was. If `flexiq --url TARGET jobs list` shows the jobs there, set store: to it and "
                f"remove the old file; if not, run move-store again") from None
        raise StoreUnavailable(f"the move to {target.url} was rolled back, nothing was written: {message}") from None
    return counted


def _copy(conn, table: str, columns: Sequence[str], rows: Iterable[tuple]) -> None:
    with conn.cursor() as cursor:
        with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)


def _many(conn, statement: str, rows: Sequence[tuple]) -> None:
    if rows:
        with conn.cursor() as cursor:
            cursor.executemany(statement, rows)


def _by_state(jobs: Iterable[tuple]) -> dict[str, int]:
    at = JOB_COLUMNS.index("state")
    counts: dict[str, int] = {}
    for row in jobs:
        counts[row[at]] = counts.get(row[at], 0) + 1
    return counts


def _make_read_only(path: str) -> bool:
    """Remove every write permission of the old file; whether that was done."""
    try:
        mode = os.stat(path).st_mode
        os.chmod(path, stat.S_IMODE(mode) & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    except OSError:
        return False
    return True
