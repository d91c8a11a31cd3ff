"""A consistent copy of a live SQLite store, taken while the daemon and its workers run.

SQLite's online backup API (``sqlite3.Connection.backup``) copies the whole database in
one step, inside one read transaction: the copy is the store as one commit left it,
and WAL lets the workers go on committing meanwhile.  The copy is written to a
temporary file beside the destination, switched out of WAL (one self-contained file),
checked (``PRAGMA integrity_check``), and only then renamed into place, so a failed or
interrupted backup never leaves a half-written file under the destination's name.

A PostgreSQL store is backed up with PostgreSQL's own tools (``pg_dump``): see
docs/operations.md.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import tempfile
from typing import Mapping

from ..errors import FlexiqdError, StoreUnavailable
from .url import POSTGRES_SCHEMES, check_url, safe_url, sqlite_path


class BackupRefused(FlexiqdError):
    """A backup that was not taken: the destination exists, the store is not SQLite, ..."""


@dataclasses.dataclass(frozen=True)
class BackupReport:
    """What a backup wrote: the copy's path and size, and its jobs per state as the copy holds them."""

    source: str
    destination: str
    size: int
    jobs_by_state: Mapping[str, int]

    @property
    def jobs(self) -> int:
        return sum(self.jobs_by_state.values())


def backup_store(url: str, destination: str, *, force: bool = False) -> BackupReport:
    """Copy the SQLite store of ``url`` to ``destination`` (a file path), consistently.

    Blocking; changes nothing in the store.  Refuses (``BackupRefused``) a PostgreSQL
    store, a destination that exists without ``force``, and the store's own file.
    """
    if url.split(":", 1)[0] in POSTGRES_SCHEMES:
        raise BackupRefused(f"{safe_url(url)} is a PostgreSQL store: back it up with PostgreSQL's tools, "
                            f"e.g. pg_dump --format=custom --file=flexiq.dump DATABASE (docs/operations.md)")
    check_url(url)
    source = sqlite_path(url)
    destination = os.path.abspath(destination)
    if not os.path.isfile(source):
        raise StoreUnavailable(f"there is no queue database at {source}")
    if os.path.isdir(destination):
        raise BackupRefused(f"{destination} is a directory: give the backup's file name, "
                            f"e.g. {os.path.join(destination, 'queue.db')}")
    if os.path.exists(destination):
        if os.path.samefile(source, destination):
            raise BackupRefused(f"{destination} is the store itself: give another file")
        if not force:
            raise BackupRefused(f"{destination} exists: give another file, or --force to replace it")
    directory = os.path.dirname(destination)
    if not os.path.isdir(directory):
        raise BackupRefused(f"cannot write {destination}: directory {directory} does not exist")
    # mkstemp: mode 0600 -- the copy holds every job's arguments, as the store does.
    try:
        handle, partial = tempfile.mkstemp(prefix=".flexiq-backup-", suffix=".db", dir=directory)
    except OSError as exc:
        raise BackupRefused(f"cannot write a backup in {directory}: {exc.strerror}") from None
    os.close(handle)
    try:
        _copy(source, partial)
        report = _check(partial, source, destination)
        os.replace(partial, destination)
    except BaseException:
        _remove(partial)
        raise
    return report


def _copy(source: str, partial: str) -> None:
    try:
        # Read-only: a backup must not create, migrate or otherwise write the store.
        src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=30.0)
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"cannot open the queue database {source}: {exc}") from None
    try:
        dst = sqlite3.connect(partial, isolation_level=None)
        try:
            # pages=-1: the whole database in one step, so one read transaction -- a
            # step-wise copy restarts whenever a worker commits, and may never end.
            src.backup(dst, pages=-1)
            dst.execute("PRAGMA journal_mode = DELETE")  # one self-contained file
        finally:
            dst.close()
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"cannot back up the queue database {source}: {exc}") from None
    finally:
        src.close()


def _check(partial: str, source: str, destination: str) -> BackupReport:
    """The copy's integrity check and contents; FlexiqdError when it is not sound."""
    conn = sqlite3.connect(f"file:{partial}?mode=ro", uri=True)
    try:
        problems = [row[0] for row in conn.execute("PRAGMA integrity_check")]
        if problems != ["ok"]:
            raise FlexiqdError(f"the backup of {source} failed its integrity check ({'; '.join(problems[:3])}); "
                               f"nothing was written to {destination}")
        has_jobs = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'jobs'").fetchone()
        states = dict(conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state")) if has_jobs else {}
    finally:
        conn.close()
    return BackupReport(source=source, destination=destination, size=os.path.getsize(partial),
                        jobs_by_state=states)


def _remove(path: str) -> None:
    for name in (path, path + "-journal", path + "-wal", path + "-shm"):
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass
