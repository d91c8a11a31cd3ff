"""emit_while_connected: only a bus that went away excuses a failed emission (the real bus: integration)."""

from __future__ import annotations

import pytest

from flexiqd.dbus.emit import emit_while_connected


class Bus:
    def __init__(self, connected: bool) -> None:
        self.connected = connected


def test_nothing_is_emitted_on_a_bus_already_gone():
    calls = []
    emit_while_connected(Bus(connected=False), calls.append, "x")
    assert calls == []


def test_an_error_on_a_bus_still_connected_is_raised():
    def broken(_value):
        raise RuntimeError("a bug of ours, not a lost bus")

    with pytest.raises(RuntimeError, match="a bug of ours"):
        emit_while_connected(Bus(connected=True), broken, "x")


def test_an_error_as_the_bus_goes_away_is_dropped():
    bus = Bus(connected=True)

    def dying(_value):
        bus.connected = False
        raise RuntimeError("Set changed size during iteration")

    emit_while_connected(bus, dying, "x")
    assert bus.connected is False
