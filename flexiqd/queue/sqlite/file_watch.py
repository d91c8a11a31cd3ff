"""Being told when files are written, without polling them: an inotify watch on their folder.

SQLite has no notices of its own (PostgreSQL has LISTEN/NOTIFY): a process learns that
another one committed by looking.  Every commit appends to the ``-wal`` file, so a
watch on the database's folder hears each commit as it lands, and costs nothing while
nothing is written.  The folder is watched rather than the files, because SQLite may
delete and create the ``-wal`` file again (the last connection to close removes it).

inotify is reached through the C library (``ctypes.CDLL(None)``: the symbols the process
already has; ``ctypes.util.find_library`` would cost a few MiB of every worker's RSS).
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import struct
import threading
from typing import Callable, Collection

log = logging.getLogger(__name__)

# <sys/inotify.h>
_IN_MODIFY = 0x002
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_Q_OVERFLOW = 0x4000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name
_WRITTEN = _IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE


class WatchUnavailable(OSError):
    """inotify cannot watch here (not Linux, no instances left, a folder it cannot read)."""


def _written_names(buffer: bytes) -> tuple[set[str], bool]:
    """The names in a read of inotify events, and whether the kernel dropped some (overflow)."""
    names: set[str] = set()
    overflow = False
    at = 0
    while at + _EVENT.size <= len(buffer):
        _, mask, _, length = _EVENT.unpack_from(buffer, at)
        at += _EVENT.size
        name = buffer[at:at + length].rstrip(b"\0")
        at += length
        if mask & _IN_Q_OVERFLOW:
            overflow = True
        elif name:
            names.add(os.fsdecode(name))
    return names, overflow


class FolderWatch(threading.Thread):
    """Calls ``changed()`` on its own thread when it starts, then soon after one of ``names``
    in ``folder`` is written.

    Writes that come in a stream are answered at most once every ``gap`` seconds: the
    first at once, the ones during the gap together after it.  ``changed`` must not
    raise; the watch knows nothing of what it looks at.
    """

    def __init__(self, folder: str, names: Collection[str], changed: Callable[[], None], *,
                 gap: float = 0.02) -> None:
        super().__init__(name="flexiq-watch", daemon=True)
        self._names = set(names)
        self._changed = changed
        self._gap = gap
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            self._fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if self._fd < 0:
                raise WatchUnavailable(ctypes.get_errno(), f"inotify: {os.strerror(ctypes.get_errno())}")
            if libc.inotify_add_watch(self._fd, os.fsencode(folder), _WRITTEN) < 0:
                errno = ctypes.get_errno()
                os.close(self._fd)
                raise WatchUnavailable(errno, f"cannot watch {folder}: {os.strerror(errno)}")
        except AttributeError:  # a C library without inotify
            raise WatchUnavailable("inotify is not available") from None
        self._stop_read, self._stop_write = os.pipe2(os.O_CLOEXEC)
        self._stopping = threading.Event()

    def stop(self) -> None:
        """Stop watching; returns once the thread has ended.  Idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        os.write(self._stop_write, b"x")
        if self.is_alive() and threading.current_thread() is not self:
            self.join()
        if not self.is_alive():
            self._close()

    def run(self) -> None:
        try:
            self._changed()  # what was written before the watch began
            while not self._stopping.is_set():
                readable, _, _ = select.select([self._fd, self._stop_read], [], [])
                if self._stop_read in readable:
                    return
                if self._take_events():
                    self._changed()
                    # Let a stream of commits gather: one look per gap, not one per commit.
                    select.select([self._stop_read], [], [], self._gap)
        except OSError as exc:  # the descriptor failed: whoever relies on it still polls
            log.warning("Stopped watching the store's files for changes: %s", exc)

    def _take_events(self) -> bool:
        """Read every pending event; whether one of them wrote a watched name."""
        written = False
        while True:
            try:
                buffer = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return written
            names, overflow = _written_names(buffer)
            written = written or overflow or not self._names.isdisjoint(names)

    def _close(self) -> None:
        for fd in (self._fd, self._stop_read, self._stop_write):
            try:
                os.close(fd)
            except OSError:
                pass
