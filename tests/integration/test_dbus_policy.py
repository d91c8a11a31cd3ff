"""The bus policy file units/org.flexiq.flexiqd1.conf, on a private bus configured like the system bus.

The bus runs Debian's own system.conf minus what a test cannot have (<user>,
<fork/>, the pidfile, syslog), listening in a temporary directory, with its
system.d include directories replaced by one holding only our file -- the way
the package installs it.  A real flexiqd (as root) owns the name; callers are
switched with setpriv.  Here it is the bus that refuses: its error text
("Rejected send message") differs from the daemon's own refusal.

Needs root (setpriv) and dbus-daemon: skips without them on a laptop, fails in CI.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from .conftest import REPO
from .test_dbus_api import (DaemonProcess, PrivateBus, as_user, dbus_send, flexiqctl, one_line_error,
                           operator_group, producer_group, require, require_root_and_dbus, status)

SYSTEM_CONF = pathlib.Path("/usr/share/dbus-1/system.conf")
POLICY = pathlib.Path(__file__).resolve().parents[2] / "units" / "org.flexiq.flexiqd1.conf"


def system_bus_config() -> str:
    """Debian's system.conf as a template for PrivateBus: {socket} and {directory} filled in there."""
    text = SYSTEM_CONF.read_text().replace("{", "{{").replace("}", "}}")
    for element in (r"<user>.*?</user>", r"<fork/>", r"<pidfile>.*?</pidfile>", r"<syslog/>",
                    r"<includedir>.*?</includedir>"):
        text, count = re.subn(r"\s*" + element, "", text, flags=re.S)
        assert count, f"{SYSTEM_CONF} has no {element}: adapt this test to it"
    text, count = re.subn(r"<listen>.*?</listen>", "<listen>unix:path={socket}</listen>", text, flags=re.S)
    assert count == 1
    # Included like the system bus includes system.d: a broken file is logged and skipped there.
    return text.replace("</busconfig>", "  <includedir>{directory}/system.d</includedir>\n</busconfig>")


def install_policy(directory: pathlib.Path) -> None:
    (directory / "system.d").mkdir()
    shutil.copy(POLICY, directory / "system.d" / POLICY.name)


@pytest.fixture(scope="module")
def bus():
    require_root_and_dbus()
    require(SYSTEM_CONF.exists(), f"needs {SYSTEM_CONF} (the dbus package's system bus config)")
    operator_group()  # before the bus starts: it resolves group="flexiq-admin" when it reads our file
    producer_group()
    private = PrivateBus(system_bus_config(), prepare=install_policy)
    yield private
    private.stop()


@pytest.fixture(scope="module")
def daemon(bus, tmp_path_factory):
    process = DaemonProcess(tmp_path_factory.mktemp("flexiqd-policy"), bus.address)
    yield process
    process.stop()


def test_the_bus_reads_the_policy_file_without_errors(bus):
    # A broken file in an include directory does not stop the bus: it is logged and skipped.
    log = bus.log.read_text()
    assert "Encountered error" not in log, log
    assert POLICY.name not in log, log
    assert "Unknown group" not in log, log


def test_root_owns_the_name_and_calls_everything(bus, daemon):
    assert status(bus.address)["pools"]["default"]["name"] == "default"
    assert flexiqctl(bus.address, "resume", "default").returncode == 0


def test_everyone_may_read(bus, daemon):
    nobody = as_user()
    assert flexiqctl(bus.address, "status", user=nobody).returncode == 0
    assert flexiqctl(bus.address, "events", user=nobody).returncode == 0
    for member, args, interface in (
            ("Get", ["string:org.flexiq.flexiqd1.Manager", "string:Version"], "org.freedesktop.DBus.Properties"),
            ("GetAll", ["string:org.flexiq.flexiqd1.Manager"], "org.freedesktop.DBus.Properties"),
            ("Introspect", [], "org.freedesktop.DBus.Introspectable"),
            ("Ping", [], "org.freedesktop.DBus.Peer"),
            ("History", ["string:default", "double:0"], "org.flexiq.flexiqd1.Manager"),
            ("Schedules", [], "org.flexiq.flexiqd1.Manager")):
        result = dbus_send(bus.address, member, *args, interface=interface, user=nobody)
        assert result.returncode == 0, f"{interface}.{member}: {result.stderr}"


# Every member only root and the steering group may call, with arguments that would be valid.
CHECKED_CALLS = (("Scale", ["string:default", "uint32:2", "double:0"]), ("Pause", ["string:default"]),
                 ("Unpin", ["string:default"]), ("Reload", []), ("Jobs", ["string:{}"]), ("Job", ["uint64:1"]),
                 ("RetryDead", ["string:", "array:uint64:"]), ("PurgeDead", ["string:", "array:uint64:"]),
                 ("RunSchedule", ["string:s"]), ("PauseSchedule", ["string:s"]),
                 ("ResumeSchedule", ["string:s"]), ("Restart", ["string:default"]))


def test_a_job_producer_in_group_flexiq_may_read_the_status_and_nothing_more(bus, daemon):
    producer = as_user(groups=[producer_group()])
    assert flexiqctl(bus.address, "status", user=producer).returncode == 0
    for member, args in CHECKED_CALLS:
        result = dbus_send(bus.address, member, *args, user=producer)
        assert "Rejected send message" in result.stderr and f'member="{member}"' in result.stderr, result.stderr
    refused = dbus_send(bus.address, "Pause", interface="org.flexiq.flexiqd1.Pool",
                        path="/org/flexiq/flexiqd1/pool/default", user=producer)
    assert "Rejected send message" in refused.stderr, refused.stderr
    result = flexiqctl(bus.address, "pause", "default", user=producer)
    assert result.returncode == 1
    assert "root or as a member of the flexiq-admin group" in one_line_error(result)
    assert status(bus.address)["pools"]["default"]["paused"] is False


def test_everyone_else_is_refused_by_the_bus_itself(bus, daemon):
    nobody = as_user()
    # The jobs' own data too: their arguments and errors are not other users' to read.
    for member, args in CHECKED_CALLS:
        result = dbus_send(bus.address, member, *args, user=nobody)
        assert "org.freedesktop.DBus.Error.AccessDenied" in result.stderr, result.stderr
        # dbus-daemon's wording, not flexiqd's: the call never reached the daemon.
        assert "Rejected send message" in result.stderr and f'member="{member}"' in result.stderr
    properties_set = dbus_send(bus.address, "Set", "string:org.flexiq.flexiqd1.Manager", "string:Version",
                               "variant:string:9", interface="org.freedesktop.DBus.Properties", user=nobody)
    assert "Rejected send message" in properties_set.stderr
    result = flexiqctl(bus.address, "scale", "default", "2", user=nobody)
    assert result.returncode == 1
    assert "root or as a member of the flexiq-admin group" in one_line_error(result)
    assert status(bus.address)["pools"]["default"]["pinned"] is None


def test_only_root_may_own_the_name(bus, daemon):
    result = dbus_send(bus.address, "RequestName", "string:org.flexiq.flexiqd1", "uint32:4",
                       interface="org.freedesktop.DBus", destination="org.freedesktop.DBus",
                       path="/org/freedesktop/DBus", user=as_user(groups=[operator_group()]))
    assert "org.freedesktop.DBus.Error.AccessDenied" in result.stderr, result.stderr
    assert "not allowed to own the service" in result.stderr


def test_a_member_of_the_steering_group_may_steer(bus, daemon):
    operator = as_user(groups=[operator_group()])
    result = flexiqctl(bus.address, "scale", "default", "2", "--for", "30s", user=operator)
    assert result.returncode == 0, result.stderr
    assert status(bus.address)["pools"]["default"]["pinned"]["workers"] == 2
    assert flexiqctl(bus.address, "unpin", "default", user=operator).returncode == 0
    assert status(bus.address)["pools"]["default"]["pinned"] is None
    jobs = dbus_send(bus.address, "Jobs", "string:{}", user=operator)
    assert jobs.returncode == 0 and '"jobs": [' in jobs.stdout, jobs.stderr


POOL_PATH = "/org/flexiq/flexiqd1/pool/default"
POOL_INTERFACE = "org.flexiq.flexiqd1.Pool"


def test_everyone_may_read_the_pool_objects_and_only_operators_may_steer_them(bus, daemon):
    nobody = as_user()
    for member, args, path, interface in (
            ("Get", [f"string:{POOL_INTERFACE}", "string:ActiveWorkers"], POOL_PATH, "org.freedesktop.DBus.Properties"),
            ("GetAll", [f"string:{POOL_INTERFACE}"], POOL_PATH, "org.freedesktop.DBus.Properties"),
            ("Introspect", [], POOL_PATH, "org.freedesktop.DBus.Introspectable"),
            ("GetManagedObjects", [], "/org/flexiq/flexiqd1", "org.freedesktop.DBus.ObjectManager")):
        result = dbus_send(bus.address, member, *args, interface=interface, path=path, user=nobody)
        assert result.returncode == 0, f"{interface}.{member}: {result.stderr}"
    assert POOL_PATH in dbus_send(bus.address, "GetManagedObjects", interface="org.freedesktop.DBus.ObjectManager",
                                  user=nobody).stdout
    for member, args in (("Scale", ["uint32:2", "double:0"]), ("Pause", []), ("Drain", []), ("Restart", [])):
        refused = dbus_send(bus.address, member, *args, interface=POOL_INTERFACE, path=POOL_PATH, user=nobody)
        assert "Rejected send message" in refused.stderr and f'member="{member}"' in refused.stderr, refused.stderr
    assert status(bus.address)["pools"]["default"]["pinned"] is None
    operator = as_user(groups=[operator_group()])
    allowed = dbus_send(bus.address, "Scale", "uint32:2", "double:30", interface=POOL_INTERFACE, path=POOL_PATH,
                        user=operator)
    assert allowed.returncode == 0, allowed.stderr
    assert status(bus.address)["pools"]["default"]["pinned"]["workers"] == 2
    assert dbus_send(bus.address, "Unpin", interface=POOL_INTERFACE, path=POOL_PATH, user=operator).returncode == 0
    assert status(bus.address)["pools"]["default"]["pinned"] is None


# Subscribes as whoever runs it, says so, then prints the pool's first PropertiesChanged that says Paused.
FOLLOW_POOL = f"""
import asyncio, sys
from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

async def main():
    bus = await MessageBus(bus_address=sys.argv[1]).connect()
    changed = asyncio.get_running_loop().create_future()

    def handler(message):
        if (message.message_type is MessageType.SIGNAL and message.path == "{POOL_PATH}"
                and message.member == "PropertiesChanged" and "Paused" in message.body[1]
                and not changed.done()):
            changed.set_result(sorted(message.body[1]))

    bus.add_message_handler(handler)
    reply = await bus.call(Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                                   interface="org.freedesktop.DBus", member="AddMatch", signature="s",
                                   body=["type='signal',sender='org.flexiq.flexiqd1',path='{POOL_PATH}'"]))
    assert reply.message_type is MessageType.METHOD_RETURN, reply.body
    print("subscribed", flush=True)
    print(" ".join(await asyncio.wait_for(changed, 20)), flush=True)

asyncio.run(main())
"""


def test_everyone_may_follow_a_pools_properties_changed(bus, daemon):
    follower = subprocess.Popen([*as_user(), sys.executable, "-c", FOLLOW_POOL, bus.address],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO))
    try:
        assert follower.stdout.readline().strip() == "subscribed", follower.stderr.read()
        assert flexiqctl(bus.address, "pause", "default").returncode == 0
        names = follower.stdout.readline().split()
        assert "Paused" in names and "MaxWorkers" not in names, follower.stderr.read()
        assert follower.wait(timeout=10) == 0
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        flexiqctl(bus.address, "resume", "default")
