"""Waking idle workers: LISTEN on the channels of their queues, call back on every NOTIFY.

Every transaction of the PostgreSQL store that makes jobs due on a queue notifies
``channel_of(queue)``; the notice is delivered at its commit.  A worker's listener
runs in a thread of its own with a connection of its own, so the worker's store
calls never wait for it, and it can be stopped at once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import select
import threading
import time
from typing import Callable

import psycopg
from psycopg import sql

from ...errors import StoreUnavailable

log = logging.getLogger(__name__)

# Channel names are identifiers: at most 63 bytes.
_CHANNEL_PREFIX = "flexiq."
_MAX_CHANNEL = 63
# The listener looks at its stop flag at least this often (seconds), and waits this long
# before opening its connection again after losing it.
_LISTEN_TICK = 1.0
_LISTEN_RETRY = 2.0
# While the server stays away, the same reason is logged again at most this often (seconds).
_REPEAT_WARNING = 30.0


def channel_of(queue: str) -> str:
    """The NOTIFY channel of ``queue``: ``flexiq.<queue>``, or a digest of a name too long for one."""
    name = _CHANNEL_PREFIX + queue
    if len(name.encode()) <= _MAX_CHANNEL:
        return name
    return _CHANNEL_PREFIX + hashlib.sha256(queue.encode()).hexdigest()[:40]


class Listener(threading.Thread):
    """LISTEN on some channels; call ``wake`` on every notice.

    psycopg 3.1's ``notifies()`` cannot time out, so this waits with select() on the
    socket and a pipe of its own: ``stop`` writes to the pipe and the wait ends at once.
    """

    def __init__(self, connect: Callable[[], psycopg.Connection], channels: list[str],
                 wake: Callable[[], None]) -> None:
        super().__init__(name="flexiq-listen", daemon=True)
        self._connect = connect
        self._channels = channels
        self._wake = wake
        self._stopping = threading.Event()
        self._stop_read, self._stop_write = os.pipe()
        self._pipe_lock = threading.Lock()  # the thread closes the pipe as it ends
        self._pipe_open = True
        self._warned: tuple[str, float] | None = None  # the outage's last logged reason, and when

    def stop(self) -> None:
        """Stop listening; returns once the thread has ended, or after a few seconds if it is
        stuck connecting (it ends when that attempt does).  Idempotent."""
        with self._pipe_lock:
            if self._stopping.is_set():
                return
            self._stopping.set()
            if self._pipe_open:
                os.write(self._stop_write, b"x")
        if self.is_alive():
            self.join(timeout=5.0)

    def run(self) -> None:
        try:
            self._run()
        finally:
            with self._pipe_lock:
                self._pipe_open = False
                os.close(self._stop_read)
                os.close(self._stop_write)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                conn = self._connect()
            except StoreUnavailable as exc:
                self._warn("Not listening for new jobs: %s; trying again every %gs.", str(exc))
                self._pause(_LISTEN_RETRY)
                continue
            try:
                for channel in self._channels:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                if self._warned is not None:
                    log.info("Listening for new jobs again.")
                    self._warned = None
                # Jobs that came before the LISTEN (or while a lost connection was down)
                # sent their notices to nobody: look once now.
                self._wake()
                self._listen(conn)
            except psycopg.Error as exc:
                if not self._stopping.is_set():
                    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                    self._warn("Listening for new jobs stopped (%s); listening again in %gs.", reason)
                    self._pause(_LISTEN_RETRY)
            finally:
                conn.close()

    def _warn(self, message: str, reason: str) -> None:
        """Log an outage's reason: when it starts or changes, then every ``_REPEAT_WARNING`` s
        (a server away for minutes must not fill the journal every retry)."""
        now = time.monotonic()
        if self._warned is not None and self._warned[0] == reason and now - self._warned[1] < _REPEAT_WARNING:
            return
        self._warned = (reason, now)
        log.warning(message, reason, _LISTEN_RETRY)

    def _listen(self, conn: psycopg.Connection) -> None:
        pgconn = conn.pgconn
        while not self._stopping.is_set():
            readable, _, _ = select.select([pgconn.socket, self._stop_read], [], [], _LISTEN_TICK)
            if pgconn.socket not in readable:
                continue
            pgconn.consume_input()
            if pgconn.status != psycopg.pq.ConnStatus.OK:
                raise psycopg.OperationalError("the listening connection was closed")
            heard = False
            while pgconn.notifies() is not None:
                heard = True
            if heard:
                self._wake()

    def _pause(self, seconds: float) -> None:
        select.select([self._stop_read], [], [], seconds)
