"""A signal emitted as the bus dies is dropped, not raised (flexiqd.dbus.emit), on a real dbus-daemon.

dbus-fast writes a signal at once and, when the write fails, finalizes the bus
inside the emission: the emission then raises "Set changed size during
iteration" into the daemon's loop.  Here the bus daemon is killed and, before
the loop reads the hang-up, a property change and a signal are emitted.

Needs dbus-daemon: skips without it on a laptop, fails in CI.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import shutil

import pytest
from dbus_fast.aio import MessageBus
from dbus_fast.service import PropertyAccess, ServiceInterface, dbus_property, signal

from flexiqd.dbus.emit import emit_while_connected
from flexiqd.dbus.writer import install_patient_writer

from .test_dbus_api import OPEN_BUS_CONFIG, PrivateBus, require


class Counter(ServiceInterface):
    def __init__(self) -> None:
        super().__init__("org.example.Counter")
        self.value = 0

    @dbus_property(access=PropertyAccess.READ)
    def Value(self) -> "i":
        return self.value

    @signal()
    def Bumped(self, value: int) -> "i":
        return value


@pytest.fixture
def private_bus():
    require(shutil.which("dbus-daemon") is not None, "needs dbus-daemon")
    private = PrivateBus(OPEN_BUS_CONFIG)
    yield private
    private.stop()


def emit_after_the_bus_died(private: PrivateBus, emit) -> tuple[bool, bool]:
    """(connected before, connected after) around ``emit(bus, counter)`` on a bus whose daemon was just
    killed; the bus writes as the daemon's does."""
    async def scenario() -> tuple[bool, bool]:
        bus = MessageBus(bus_address=private.address)
        install_patient_writer(bus)
        await bus.connect()
        counter = Counter()
        bus.export("/org/example/counter", counter)
        private.kill()  # blocks the loop: the hang-up is not read before the emission
        before = bus.connected
        try:
            emit(bus, counter)
            return before, bus.connected
        finally:
            with pytest.raises(OSError):  # the loss, read as the daemon's keeper reads it
                await asyncio.wait_for(bus.wait_for_disconnect(), 5)

    try:
        return asyncio.run(scenario())
    finally:
        gc.collect()  # a future whose failure nobody read is logged as it is collected


@pytest.fixture
def loop_errors(caplog):
    """What asyncio logged as errors (a task's or a future's exception nobody retrieved)."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    return lambda: [record.getMessage() for record in caplog.records if record.name == "asyncio"]


def test_the_library_alone_raises_when_the_bus_dies_mid_emission(private_bus):
    """The failure the helper exists for: if dbus-fast stops raising here, the helper can go."""
    with pytest.raises(RuntimeError, match="changed size during iteration"):
        emit_after_the_bus_died(private_bus, lambda bus, counter: counter.emit_properties_changed({"Value": 1}))


def test_a_property_change_emitted_as_the_bus_dies_is_dropped(private_bus, loop_errors):
    before, after = emit_after_the_bus_died(
        private_bus, lambda bus, counter: emit_while_connected(bus, counter.emit_properties_changed, {"Value": 1}))
    assert (before, after) == (True, False)  # it was connected, the emission found it gone, and nothing raised
    assert loop_errors() == []


def test_a_signal_emitted_as_the_bus_dies_is_dropped(private_bus, loop_errors):
    before, after = emit_after_the_bus_died(
        private_bus, lambda bus, counter: emit_while_connected(bus, counter.Bumped, 2))
    assert (before, after) == (True, False)
    assert loop_errors() == []
