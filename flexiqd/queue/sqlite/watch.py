"""Waking a SQLite store's waiters when jobs become due: a look at each commit, no polling.

The folder watch (``file_watch``) hears a commit when its frames are written to the
``-wal`` file, which is a moment *before* the commit is visible: SQLite then syncs the
file and only after that publishes the commit in the shared index.  So a look that
finds the database unchanged (``PRAGMA data_version``: it moves when any other
connection commits) looks again a moment later, for as long as a commit can take to
land.  The look has a connection of its own, so the process's own commits count as
changes too, and its store calls never wait for a look.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from typing import Callable, Sequence

from .file_watch import FolderWatch, WatchUnavailable

log = logging.getLogger(__name__)

# How long a commit may take from its first -wal write to being visible (an fsync on a
# slow disk), and the first pause between looks (doubling up to the last).  A write that is
# no commit (a checkpoint restarting the -wal) is looked at for that long too: about ten
# looks, not one every few milliseconds.
LANDS_WITHIN = 0.5
FIRST_PAUSE = 0.001
LONGEST_PAUSE = 0.1


class DueLook:
    """Called at each commit: wakes when one of ``queues`` has more due jobs than last time."""

    def __init__(self, path: str, queues: Sequence[str], wake: Callable[[], None], *,
                 busy_timeout: float = 5.0) -> None:
        self._path = path
        self._queues = tuple(queues)
        self._wake = wake
        self._busy_timeout = busy_timeout
        self._conn: sqlite3.Connection | None = None
        self._version: int | None = None
        self._due: dict[str, int] = {}
        self._sql = (f"SELECT queue, sum(n) FROM counts WHERE state = 'queued' "
                     f"AND queue IN ({','.join('?' * len(self._queues))}) GROUP BY queue")

    def __call__(self) -> None:
        try:
            version, due = self._read()
            deadline = time.monotonic() + LANDS_WITHIN
            pause = FIRST_PAUSE
            while version == self._version and time.monotonic() < deadline:
                time.sleep(pause)  # written, not landed yet (or a write that changed nothing)
                pause = min(2 * pause, LONGEST_PAUSE)
                version, due = self._read()
        except sqlite3.Error as exc:  # locked for a moment, say: the next commit looks again
            log.debug("Not looking for new jobs in %s this time: %s", self._path, exc)
            return
        grew = any(n > self._due.get(queue, 0) for queue, n in due.items())
        self._version, self._due = version, due
        if grew:
            self._wake()

    def _read(self) -> tuple[int, dict[str, int]]:
        if self._conn is None:
            self._conn = sqlite3.connect(self._path, timeout=self._busy_timeout, isolation_level=None,
                                         check_same_thread=False)
        conn = self._conn
        conn.execute("BEGIN")
        try:
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            due = dict(conn.execute(self._sql, self._queues).fetchall())
        finally:
            conn.execute("COMMIT")
        return version, due

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def watch_due(path: str, queues: Sequence[str], wake: Callable[[], None], *,
              busy_timeout: float = 5.0) -> Callable[[], None] | None:
    """Call ``wake`` (from a thread of its own) when a commit leaves more due jobs on one of
    ``queues`` than the last look found, the first look being at the start; return the
    function that stops it, or None when the folder cannot be watched (the caller polls)."""
    look = DueLook(path, queues, wake, busy_timeout=busy_timeout)
    name = os.path.basename(path)
    try:
        watch = FolderWatch(os.path.dirname(os.path.abspath(path)), (f"{name}-wal",), look)
    except WatchUnavailable as exc:
        log.warning("Not watching %s for new jobs (polling finds them): %s", path, exc)
        return None
    watch.start()

    def stop() -> None:
        watch.stop()
        look.close()
    return stop
