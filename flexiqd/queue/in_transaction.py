"""Enqueue in the application's own transaction (``connection=``): the job exists exactly
when the application's own writes commit, and not at all when they roll back.

- PostgreSQL: ``connection`` is the application's psycopg 3 connection to the queue's
  database.  The jobs are added by one statement calling the store's SQL function
  ``flexiq_enqueue`` (postgres/schema.py), which joins whatever transaction the
  connection has open -- or, in autocommit mode, is one of its own -- and never begins,
  commits or rolls back anything itself.  Its NOTIFY reaches the workers at the commit.
- SQLite: ``connection`` is a ``sqlite3`` connection to the store's own file.  The jobs
  are written by the store's own statements inside a savepoint of the connection's
  transaction (one is begun, as ``sqlite3`` would begin it, when none is open; in
  autocommit mode one is begun and committed here).  Workers see the file change at
  the commit.

Either way an error leaves the application's transaction as any failed statement of
its own would: on PostgreSQL aborted (roll back), on SQLite unchanged.
"""

from __future__ import annotations

import math
import os
import sqlite3
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import QueueError
from .store.backend import Backend
from .store.rows import encode_json, new_row
from .types import NewJob

if TYPE_CHECKING:
    from .sqlite.database import SQLiteBackend

# One call of flexiq_enqueue per job, in the jobs' order (volatile functions in the select
# list are evaluated after the ORDER BY, so the ids follow the order given).
_ENQUEUE_MANY = (
    "SELECT {function}(t.task, t.args::jsonb, t.kwargs::jsonb, t.queue, t.priority, t.delay, "
    "to_timestamp(t.run_at), t.max_attempts, t.timeout, t.idempotency_key, t.tenant) "
    "FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::integer[], %s::float8[], %s::float8[], "
    "%s::integer[], %s::float8[], %s::text[], %s::text[]) WITH ORDINALITY "
    "AS t(task, args, kwargs, queue, priority, delay, run_at, max_attempts, timeout, idempotency_key, tenant, n) "
    "ORDER BY t.n")
_SAVEPOINT = "flexiq_enqueue"


def enqueue_in(connection: Any, jobs: Sequence[NewJob], *, backend: Backend, now: float) -> list[int]:
    """Add ``jobs`` in ``connection``'s transaction; their ids, in order.  See the module."""
    rows = [new_row(job, now) for job in jobs]  # checked and encoded first: fail whole
    if isinstance(connection, sqlite3.Connection):
        return _sqlite(connection, jobs, rows, backend, now)
    if _is_psycopg(connection):
        return _postgres(connection, jobs, backend)
    raise QueueError(f"connection= takes the application's psycopg 3 connection (PostgreSQL) or sqlite3 "
                     f"connection (SQLite), got {type(connection).__module__}.{type(connection).__qualname__}")


def _is_psycopg(connection: Any) -> bool:
    try:
        import psycopg
    except ImportError:
        return False
    if isinstance(connection, psycopg.AsyncConnection):
        raise QueueError("connection= takes a psycopg 3 Connection, not an AsyncConnection: "
                         "call flexiq_enqueue(...) with it in SQL (docs/transactional-enqueue.md)")
    return isinstance(connection, psycopg.Connection)


# -- PostgreSQL ------------------------------------------------------------------------------

def _postgres(connection: Any, jobs: Sequence[NewJob], backend: Backend) -> list[int]:
    from psycopg import errors as pg_errors
    from psycopg import sql
    from psycopg.rows import tuple_row

    from .postgres.database import PostgresBackend

    if not isinstance(backend, PostgresBackend):
        raise QueueError(f"connection= is a PostgreSQL connection, but this queue's store is {backend.url}: "
                         f"the job would land where no worker claims")
    if not jobs:
        return []
    # Named in the store's schema: the application's search_path need not include it.
    statement = sql.SQL(_ENQUEUE_MANY).format(function=sql.Identifier(backend.schema, "flexiq_enqueue"))
    try:
        # A cursor of our own, reading tuples: the application's row factory may be another.
        with connection.cursor(row_factory=tuple_row) as cursor:
            ids = [row[0] for row in cursor.execute(statement, _columns(jobs)).fetchall()]
    except (pg_errors.UndefinedFunction, pg_errors.InvalidSchemaName):
        raise QueueError(
            f"the database of connection= has no {backend.schema}.flexiq_enqueue(): connect to the "
            f"queue's database ({backend.url})") from None
    except pg_errors.InsufficientPrivilege as exc:
        raise QueueError(f"enqueue in the application's transaction was refused: {_first_line(exc)} "
                         f"(docs/security.md: the role that may enqueue)") from None
    except Exception as exc:  # psycopg.Error, or a connection that is closed
        raise QueueError(f"enqueue in the application's transaction failed: {_first_line(exc)}") from None
    return ids


def _columns(jobs: Sequence[NewJob]) -> list[list[Any]]:
    """The arguments of ``_ENQUEUE_MANY``: one array per parameter of flexiq_enqueue."""
    columns: list[list[Any]] = [[] for _ in range(11)]
    for job in jobs:
        args, kwargs = _call_of(job)
        declared = job.from_declaration
        values = (job.task, encode_json(args, f"the arguments of {job.task}"),
                  encode_json(kwargs, f"the keyword arguments of {job.task}"),
                  None if "queue" in declared else job.queue,
                  None if "priority" in declared else job.priority,
                  max(0.0, float(job.delay)), None if job.run_at is None else float(job.run_at),
                  None if "max_attempts" in declared else job.max_attempts,
                  # NULL takes the declaration's timeout; infinity says "no timeout" explicitly.
                  None if "timeout" in declared else (math.inf if job.timeout is None else float(job.timeout)),
                  job.idempotency_key, job.tenant)
        for column, value in zip(columns, values):
            column.append(value)
    return columns


def _call_of(job: NewJob) -> tuple[list, dict]:
    payload = job.payload
    if not (isinstance(payload, dict) and set(payload) <= {"args", "kwargs"}):
        raise QueueError(f"connection= enqueues a task's call (args and kwargs); the payload of {job.task} "
                         f"is {type(payload).__name__}")
    return list(payload.get("args") or []), dict(payload.get("kwargs") or {})


# -- SQLite ----------------------------------------------------------------------------------

def _sqlite(connection: sqlite3.Connection, jobs: Sequence[NewJob], rows: Sequence[dict], backend: Backend,
            now: float) -> list[int]:
    from .sqlite.database import SQLiteBackend

    if not isinstance(backend, SQLiteBackend):
        raise QueueError(f"connection= is a SQLite connection, but this queue's store is {backend.url}: "
                         f"the job would land where no worker claims")
    # The store's statements read plain tuples, whatever the application's row factory.
    row_factory, connection.row_factory = connection.row_factory, None
    try:
        return _sqlite_plain(connection, jobs, rows, backend, now)
    finally:
        connection.row_factory = row_factory


def _sqlite_plain(connection: sqlite3.Connection, jobs: Sequence[NewJob], rows: Sequence[dict],
                  backend: "SQLiteBackend", now: float) -> list[int]:
    from .sqlite.sql import SQLiteTx

    store_file = backend.database.path
    if not _same_file(connection, store_file):
        raise QueueError(f"connection= is a SQLite connection to another file than the queue's store "
                         f"{store_file}: open it on that file")
    if not jobs:
        return []
    own = not connection.in_transaction and connection.isolation_level is None  # autocommit mode
    try:
        if not connection.in_transaction:
            # What sqlite3 would begin before the first write; IMMEDIATE when the commit is ours.
            connection.execute("BEGIN IMMEDIATE" if own else f"BEGIN {connection.isolation_level}")
        connection.execute(f"SAVEPOINT {_SAVEPOINT}")
        try:
            ids = backend.insert_new(SQLiteTx(connection), jobs, rows, now)
        except BaseException:
            connection.execute(f"ROLLBACK TO {_SAVEPOINT}")
            connection.execute(f"RELEASE {_SAVEPOINT}")
            if own:
                connection.execute("ROLLBACK")
            raise
        connection.execute(f"RELEASE {_SAVEPOINT}")
        if own:
            connection.execute("COMMIT")
    except sqlite3.Error as exc:
        raise QueueError(f"enqueue in the application's transaction on {store_file} failed: {exc}") from None
    return ids


def _same_file(connection: sqlite3.Connection, path: str) -> bool:
    try:
        files = {name: file for _, name, file in connection.execute("PRAGMA database_list")}
    except sqlite3.Error as exc:
        raise QueueError(f"connection= is a SQLite connection that cannot be read: {exc}") from None
    main = files.get("main") or ""
    try:
        return bool(main) and os.path.samefile(main, path)
    except OSError:
        return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
