"""Each pool as a D-Bus object, read and followed with busctl itself, on a private bus.

The same private bus and real flexiqd (process fleet) as test_dbus_api.py, one of
each for this module.  Everything is asked with ``busctl --address=...``, the way
an operator or another D-Bus client would, not through flexiqd's own client.

Needs root (setpriv, busctl monitor) and dbus-daemon: skips without them on a laptop, fails in CI.
"""

from __future__ import annotations

import json
import queue as queue_module
import shutil
import subprocess
import threading
import time

import pytest

from .conftest import wait_for
from .test_dbus_api import (BUS_NAME, NOBODY, OBJECT_PATH, as_user, bus, daemon, dbus_send,  # noqa: F401
                            flexiqctl, require, status)

POOL_INTERFACE = "org.flexiq.flexiqd1.Pool"
DEFAULT_POOL = f"{OBJECT_PATH}/pool/default"
EXTRA_POOL = f"{OBJECT_PATH}/pool/extra"


@pytest.fixture(scope="module")
def address(daemon) -> str:  # noqa: F811
    require(shutil.which("busctl") is not None, "needs busctl")
    return daemon.address


def busctl(address: str, *args: str, user: list[str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*(user or []), "busctl", f"--address={address}", *args],
                          capture_output=True, text=True, timeout=30)


def get_property(address: str, path: str, name: str) -> str:
    """``busctl get-property``'s answer, e.g. ``i 1`` or ``d nan``."""
    result = busctl(address, "get-property", BUS_NAME, path, POOL_INTERFACE, name)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def managed_objects(address: str) -> dict:
    result = busctl(address, "--json=short", "call", BUS_NAME, OBJECT_PATH,
                    "org.freedesktop.DBus.ObjectManager", "GetManagedObjects")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["data"][0]


class Monitor:
    """``busctl monitor --json=short`` for one match rule; messages read by a thread, waited for with a deadline."""

    def __init__(self, address: str, match: str) -> None:
        self.proc = subprocess.Popen(["busctl", f"--address={address}", "monitor", "--json=short",
                                      f"--match={match}"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.messages: queue_module.Queue = queue_module.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()
        # busctl says so on stderr once the bus streams to it: from then on nothing is missed.
        started = self.proc.stderr.readline()
        assert "Monitoring bus message stream" in started, started

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.strip():
                self.messages.put(json.loads(line))

    def wait_for(self, predicate, timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}; saw: {self.seen}")
            try:
                message = self.messages.get(timeout=remaining)
            except queue_module.Empty:
                continue
            self.seen.append(message)
            if predicate(message):
                return message

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def changed(message: dict) -> dict:
    """name -> value of a PropertiesChanged message (as busctl --json prints it)."""
    interface, values, _invalidated = message["payload"]["data"]
    assert interface == POOL_INTERFACE
    return {name: variant["data"] for name, variant in values.items()}


def is_signal(message: dict, path: str, member: str) -> bool:
    return message.get("type") == "signal" and message.get("path") == path and message.get("member") == member


# -- tests ------------------------------------------------------------------------------------------

def test_busctl_introspect_shows_each_pool_with_typed_properties(address):
    tree = busctl(address, "tree", BUS_NAME)
    assert tree.returncode == 0 and DEFAULT_POOL in tree.stdout, tree.stdout + tree.stderr
    result = busctl(address, "introspect", BUS_NAME, DEFAULT_POOL)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split()[1:3] for line in result.stdout.splitlines()[1:] if line.strip()}
    assert rows[POOL_INTERFACE] == ["interface", "-"]
    for name, signature in (("MaxWorkers", "u"), ("ActiveWorkers", "i"), ("DesiredWorkers", "i"),
                            ("OldestRunnableAge", "d"), ("TimeToDrain", "d"), ("BindingCap", "s"),
                            ("Paused", "b"), ("PinnedUntil", "d"), ("StartCost", "d"), ("Reason", "s")):
        assert rows[f".{name}"] == ["property", signature], name
    assert rows[".Scale"] == ["method", "ud"] and rows[".Pause"] == ["method", "-"]
    manager = busctl(address, "introspect", BUS_NAME, OBJECT_PATH).stdout
    assert any(line.split()[:3] == [".ScaleEvent", "signal", "suust"] for line in manager.splitlines()), manager
    assert "org.freedesktop.DBus.ObjectManager" in manager


def test_get_property_and_get_managed_objects_say_what_status_says(address):
    wait_for(lambda: get_property(address, DEFAULT_POOL, "ActiveWorkers") == "i 1", 30, "one active worker")
    assert get_property(address, DEFAULT_POOL, "MaxWorkers") == "u 5"
    assert get_property(address, DEFAULT_POOL, "PinnedWorkers") == "i -1"    # not pinned: -1
    assert get_property(address, DEFAULT_POOL, "StartCost") == "d nan"       # not measured: NaN
    objects = managed_objects(address)
    assert list(objects) == [DEFAULT_POOL]
    values = {name: variant["data"] for name, variant in objects[DEFAULT_POOL][POOL_INTERFACE].items()}
    pool = status(address)["pools"]["default"]
    assert values["Name"] == pool["name"] and values["Queues"] == pool["queues"]
    assert (values["Concurrency"], values["MinWorkers"], values["MaxWorkers"]) == \
        (pool["concurrency"], pool["min_workers"], pool["max_workers"])
    assert values["ActiveWorkers"] == pool["workers"]["active"] and values["DesiredWorkers"] == pool["desired"]
    assert values["Paused"] is pool["paused"] is False and values["Pinned"] is False
    assert values["Runnable"] == pool["metrics"]["runnable"] and values["Reason"] == pool["decision"]["reason"]


def test_pool_methods_steer_and_properties_changed_follows_with_only_what_changed(address):
    monitor = Monitor(address, f"type='signal',sender='{BUS_NAME}'")
    try:
        result = busctl(address, "call", BUS_NAME, DEFAULT_POOL, POOL_INTERFACE, "Scale", "ud", "3", "0")
        assert result.returncode == 0, result.stderr
        event = monitor.wait_for(lambda m: is_signal(m, OBJECT_PATH, "ScaleEvent"), 20, "the ScaleEvent")
        pool, _previous, desired, reason, seq = event["payload"]["data"]
        assert (pool, desired, reason) == ("default", 3, "Pinned")
        recorded = json.loads(flexiqctl(address, "events", "--json", "--since", str(seq - 1)).stdout.splitlines()[0])
        assert (recorded["seq"], recorded["desired"], recorded["reason"]) == (seq, 3, "Pinned")

        pinned = monitor.wait_for(lambda m: is_signal(m, DEFAULT_POOL, "PropertiesChanged")
                                  and changed(m).get("Pinned") is True, 20, "PropertiesChanged with Pinned")
        values = changed(pinned)
        assert values["PinnedWorkers"] == 3 and values["DesiredWorkers"] == 3
        assert values["PinnedUntil"] is None  # inf (until unpinned): JSON has no infinity, busctl prints null
        assert not {"Name", "MaxWorkers", "Concurrency", "Paused"} & set(values)  # only the changed ones
        assert get_property(address, DEFAULT_POOL, "PinnedUntil") == "d inf"
        wait_for(lambda: get_property(address, DEFAULT_POOL, "ActiveWorkers") == "i 3", 30, "three active workers")

        # The pool's mutating methods take the manager's credentials check.
        refused = busctl(address, "call", BUS_NAME, DEFAULT_POOL, POOL_INTERFACE, "Pause", user=as_user())
        assert refused.returncode != 0 and "Access denied" in refused.stderr
        # busctl shows only the error's name; dbus-send shows the daemon's own text.
        raw = dbus_send(address, "Pause", interface=POOL_INTERFACE, path=DEFAULT_POOL, user=as_user())
        assert f"Pause is for root and members of the flexiq-admin group (caller uid {NOBODY})" in raw.stderr
        assert busctl(address, "call", BUS_NAME, DEFAULT_POOL, POOL_INTERFACE, "Pause").returncode == 0
        monitor.wait_for(lambda m: is_signal(m, DEFAULT_POOL, "PropertiesChanged")
                         and changed(m).get("Paused") is True, 20, "PropertiesChanged with Paused")
        assert status(address)["pools"]["default"]["paused"] is True
    finally:
        busctl(address, "call", BUS_NAME, DEFAULT_POOL, POOL_INTERFACE, "Resume")
        busctl(address, "call", BUS_NAME, DEFAULT_POOL, POOL_INTERFACE, "Unpin")
        monitor.stop()
    pool = status(address)["pools"]["default"]
    assert pool["paused"] is False and pool["pinned"] is None


def test_a_reload_that_adds_and_removes_a_pool_is_announced_by_the_object_manager(daemon, address):  # noqa: F811
    monitor = Monitor(address, f"type='signal',sender='{BUS_NAME}',path='{OBJECT_PATH}',"
                               f"interface='org.freedesktop.DBus.ObjectManager'")
    try:
        daemon.config.write_text(daemon.good_config + "  extra:\n    app: flexiqd.demo:queue\n"
                                                      "    min_workers: 0\n    max_workers: 2\n")
        assert flexiqctl(address, "reload").returncode == 0
        added = monitor.wait_for(lambda m: m["member"] == "InterfacesAdded", 20, "InterfacesAdded")
        path, interfaces = added["payload"]["data"]
        assert path == EXTRA_POOL and interfaces[POOL_INTERFACE]["Name"]["data"] == "extra"
        assert interfaces[POOL_INTERFACE]["MaxWorkers"] == {"type": "u", "data": 2}
        assert sorted(managed_objects(address)) == [DEFAULT_POOL, EXTRA_POOL]
        assert get_property(address, EXTRA_POOL, "MinWorkers") == "u 0"

        daemon.config.write_text(daemon.good_config)
        assert flexiqctl(address, "reload").returncode == 0
        removed = monitor.wait_for(lambda m: m["member"] == "InterfacesRemoved", 20, "InterfacesRemoved")
        assert removed["payload"]["data"] == [EXTRA_POOL, [POOL_INTERFACE]]
        assert list(managed_objects(address)) == [DEFAULT_POOL]
        gone = busctl(address, "get-property", BUS_NAME, EXTRA_POOL, POOL_INTERFACE, "Name")
        assert gone.returncode != 0
    finally:
        daemon.config.write_text(daemon.good_config)
        flexiqctl(address, "reload")
        monitor.stop()


def test_stopping_the_daemon_leaves_the_bus_cleanly(daemon, address):  # noqa: F811  (last: it stops the daemon)
    daemon.stop()
    log = daemon.log.read_text()
    assert daemon.proc.returncode == 0 and "Traceback" not in log, log
    gone = busctl(address, "get-property", BUS_NAME, DEFAULT_POOL, POOL_INTERFACE, "Name")
    assert gone.returncode != 0
