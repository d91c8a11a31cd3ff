"""Writing to the bus without being thrown off it when the socket is full.

dbus-fast 1.84 (Debian bookworm's) sends on a non-blocking socket and treats a
full send buffer (``BlockingIOError``) as a broken connection: the bus is closed
and the daemon is off it until restarted.  A few large replies at once -- twenty
pools' ``History`` asked for together by a page, which any local user may ask
for -- fill the buffer.  It also sends queued messages newest first, and ends
the bus inside the write that failed, which breaks the signal being emitted.
This writer waits for the socket to be writable instead, keeps the order, and
ends a lost bus on the loop's next turn.  It replaces
the library's own only where the library is the one it was written against
(``dbus_fast.aio.message_bus._MessageWriter`` with these members).
"""

from __future__ import annotations

import array
import socket
from typing import Any

try:
    from dbus_fast.aio.message_bus import _MessageWriter
except ImportError:  # another dbus-fast: its own writer stays
    _MessageWriter = None  # type: ignore[assignment,misc]

_MEMBERS = ("messages", "sock", "loop", "fd", "buf", "offset", "unix_fds", "fut", "negotiate_unix_fd", "bus")


def _settle(future: Any, error: BaseException | None = None) -> None:
    if future is not None and not future.done():
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
            # A signal's or a reply's future is awaited by nobody: read the error here, or asyncio
            # logs every such send as an error when the bus is lost.  The keeper logs the loss once;
            # a caller that awaits the future still gets the exception.
            future.exception()


if _MessageWriter is not None:
    class PatientWriter(_MessageWriter):
        """The library's writer, but a full socket is waited out and messages go in order."""

        def write_callback(self, remove_writer: bool = True) -> None:
            try:
                while True:
                    if self.buf is None:
                        if not self.messages:
                            if remove_writer:
                                self.loop.remove_writer(self.fd)
                            return
                        buf, self.unix_fds, self.fut = self.messages.popleft()
                        self.buf, self.offset = memoryview(buf), 0
                    try:
                        self.offset += self._send()
                    except BlockingIOError:
                        self.loop.add_writer(self.fd, self.write_callback)  # on when it drains
                        return
                    if self.offset < len(self.buf):
                        self.loop.add_writer(self.fd, self.write_callback)
                        return
                    self.buf = None
                    _settle(self.fut)
            except Exception as exc:  # the connection is gone: as the library ends it
                _settle(self.fut, None if self.bus._user_disconnect else exc)
                # Ended on the loop's next turn, not inside this write: a write is often part of an
                # emission, which iterates over the buses the interface is exported on, and ending
                # the bus unexports it from that very set ("Set changed size during iteration",
                # raised into the daemon's loop when the bus daemon restarts).
                self.loop.call_soon(self.bus._finalize, exc)

        def _send(self) -> int:
            if self.unix_fds and self.negotiate_unix_fd:
                sent = self.sock.sendmsg([self.buf[self.offset:]],
                                         [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", self.unix_fds))])
                self.unix_fds = None  # sent with the first bytes
                return sent
            return self.sock.send(self.buf[self.offset:])
else:
    PatientWriter = None  # type: ignore[assignment,misc]


def install_patient_writer(bus: Any) -> bool:
    """Give ``bus`` (a dbus_fast.aio.MessageBus, before it connects) the patient writer when its
    library is the one it was written for; whether it did."""
    if PatientWriter is None:
        return False
    writer = getattr(bus, "_writer", None)
    if type(writer) is not _MessageWriter or not all(hasattr(writer, name) for name in _MEMBERS):
        return False
    bus._writer = PatientWriter(bus)
    return True
