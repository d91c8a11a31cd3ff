"""The D-Bus face's writer (flexiqd.dbus.writer): a full socket is waited out, not a lost bus."""

from __future__ import annotations

import asyncio
import socket

import pytest
from dbus_fast import Message

from flexiqd.dbus.writer import PatientWriter


class Bus:
    """What a writer reads of its bus."""

    def __init__(self, sock: socket.socket) -> None:
        self._negotiate_unix_fd = False
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._fd = sock.fileno()
        self._user_disconnect = False
        self.finalized: list[BaseException] = []

    def _finalize(self, error: BaseException) -> None:
        self.finalized.append(error)


@pytest.mark.skipif(PatientWriter is None, reason="another dbus-fast: its own writer is used")
def test_messages_larger_than_the_socket_buffer_arrive_whole_and_in_order():
    async def scenario() -> None:
        ours, peer = socket.socketpair()
        ours.setblocking(False)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        bus = Bus(ours)
        writer = PatientWriter(bus)
        loop = asyncio.get_running_loop()
        messages = [Message.new_signal("/o", "org.example.I", "Big", "s", [str(n) * 300_000]) for n in range(3)]
        futures = [loop.create_future() for _ in messages]
        for message, future in zip(messages, futures):
            writer.buffer_message(message, future)
        loop.add_writer(bus._fd, writer.write_callback)
        expected = b"".join(message._marshall(False) for message in messages)
        received = bytearray()
        peer.setblocking(False)
        while len(received) < len(expected):
            await asyncio.sleep(0.001)  # a slow reader: the buffer fills between reads
            try:
                received += peer.recv(65536)
            except BlockingIOError:
                pass
        await asyncio.wait_for(asyncio.gather(*futures), 5)
        assert bytes(received) == expected  # whole, and the first sent first
        assert bus.finalized == []          # the connection was never given up
        ours.close()
        peer.close()

    asyncio.run(scenario())
