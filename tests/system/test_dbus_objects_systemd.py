"""The pool objects under the real systemd, on the real system bus with the installed policy, read with busctl."""

from __future__ import annotations

import json
import queue as queue_module
import subprocess
import threading
import time

import pytest

from .flexiqd_install import DAEMON, install, workers
from .sandbox import Sandbox

BUS_NAME = "org.flexiq.flexiqd1"
MANAGER = "/org/flexiq/flexiqd1"
POOL = "/org/flexiq/flexiqd1/pool/default"
POOL_INTERFACE = "org.flexiq.flexiqd1.Pool"
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
OPERATOR = ["setpriv", "--reuid=operator1", "--regid=operator1", "--init-groups"]


@pytest.fixture(scope="module")
def flexiqd(sandbox: Sandbox) -> Sandbox:
    install(sandbox)
    sandbox.wait_for(lambda: len(workers(sandbox)) == 1, 30, what="the minimum worker unit")
    sandbox.run("getent passwd operator1 >/dev/null || useradd --no-create-home --groups flexiq-admin operator1")
    yield sandbox
    sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*'; true", timeout=120)


def busctl(sbx: Sandbox, *args: str, user: list[str] | None = None) -> subprocess.CompletedProcess:
    return sbx.run([*(user or []), "busctl", "--system", *args], check=False)


def pool_property(sbx: Sandbox, name: str, user: list[str] | None = None) -> str:
    result = busctl(sbx, "get-property", BUS_NAME, POOL, POOL_INTERFACE, name, user=user)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_everyone_reads_the_pool_objects_with_busctl(flexiqd):
    introspected = busctl(flexiqd, "introspect", BUS_NAME, POOL, user=NOBODY)
    assert introspected.returncode == 0, introspected.stderr
    assert any(line.split()[:3] == [".ActiveWorkers", "property", "i"] for line in introspected.stdout.splitlines())
    flexiqd.wait_for(lambda: pool_property(flexiqd, "ActiveWorkers", NOBODY) == "i 1", 20,
                     what="ActiveWorkers to show the minimum worker")
    assert pool_property(flexiqd, "MaxWorkers", NOBODY) == "u 6"
    listed = busctl(flexiqd, "--json=short", "call", BUS_NAME, MANAGER, "org.freedesktop.DBus.ObjectManager",
                    "GetManagedObjects", user=NOBODY)
    assert listed.returncode == 0, listed.stderr
    objects = json.loads(listed.stdout)["data"][0]
    assert list(objects) == [POOL]
    values = objects[POOL][POOL_INTERFACE]
    assert values["Name"] == {"type": "s", "data": "default"} and values["Concurrency"] == {"type": "u", "data": 2}


def test_an_operators_pool_scale_is_followed_by_properties_changed_and_nobody_is_refused_by_the_bus(flexiqd):
    monitor = subprocess.Popen(
        ["nsenter", "-t", str(flexiqd.leader), "-a", "--", "busctl", "--system", "monitor", "--json=short",
         f"--match=type='signal',sender='{BUS_NAME}',path='{POOL}',member='PropertiesChanged'"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    messages: queue_module.Queue = queue_module.Queue()

    def read() -> None:
        for line in monitor.stdout:
            if line.strip():
                messages.put(json.loads(line))

    threading.Thread(target=read, daemon=True).start()
    try:
        started = monitor.stderr.readline()  # once it says so, the bus streams to it
        assert "Monitoring bus message stream" in started, started
        refused = busctl(flexiqd, "call", BUS_NAME, POOL, POOL_INTERFACE, "Pause", user=NOBODY)
        assert refused.returncode != 0 and "Access denied" in refused.stderr, refused.stderr
        allowed = busctl(flexiqd, "call", BUS_NAME, POOL, POOL_INTERFACE, "Scale", "ud", "3", "30", user=OPERATOR)
        assert allowed.returncode == 0, allowed.stderr

        seen, deadline = [], time.monotonic() + 20
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no PropertiesChanged with the pin within 20 s; saw {seen}"
            try:
                message = messages.get(timeout=remaining)
            except queue_module.Empty:
                continue
            seen.append(message)
            interface, changed, _ = message["payload"]["data"]
            if interface == POOL_INTERFACE and changed.get("Pinned", {}).get("data") is True:
                break
        assert changed["PinnedWorkers"] == {"type": "i", "data": 3}
        assert "MaxWorkers" not in changed and "Paused" not in changed  # only what changed
        flexiqd.wait_for(lambda: len(workers(flexiqd)) == 3, 30, what="three worker units")
        flexiqd.wait_for(lambda: pool_property(flexiqd, "ActiveWorkers") == "i 3", 20,
                         what="ActiveWorkers to follow the units")
        assert pool_property(flexiqd, "Paused") == "b false"  # nobody's Pause never reached flexiqd
    finally:
        busctl(flexiqd, "call", BUS_NAME, POOL, POOL_INTERFACE, "Unpin")
        monitor.terminate()
        monitor.wait(10)
