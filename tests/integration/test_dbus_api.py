"""flexiqd's D-Bus API and flexiqctl, end to end on a private bus.

One private dbus-daemon (any user may connect, no bus policy) and one real
flexiqd with the process fleet serve every test of this module; flexiqctl runs
as a subprocess, like an operator's.  Callers other than root are switched with
setpriv, so the daemon's own credentials check is what refuses them here (the
bus policy file is tested in test_dbus_policy.py).

Needs root (setpriv) and dbus-daemon: skips without them on a laptop, fails in CI.
"""

from __future__ import annotations

import asyncio
import grp
import json
import os
import pathlib
import queue as queue_module
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import psutil
import pytest

from flexiqd.busnames import OPERATOR_GROUP

from .conftest import REPO, wait_for

BUS_NAME = "org.flexiq.flexiqd1"
OBJECT_PATH = "/org/flexiq/flexiqd1"
INTERFACE = "org.flexiq.flexiqd1.Manager"
NOBODY = 65534

CONFIG = """
store: sqlite:///{store}
tick: 200ms
fleet: process
schedules:
  nightly: {{task: app.report, args: [secret], cron: "0 3 * * *", timezone: Europe/Berlin, queue: reports}}
pools:
  default:
    app: flexiqd.demo:queue
    concurrency: 2
    min_workers: 1
    max_workers: 5
    drain_timeout: 5s
"""

# Any local user may connect and call anything: only the daemon's own check guards.
OPEN_BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"""


# -- helpers shared with test_dbus_policy.py --------------------------------------------------------

def require(condition: bool, reason: str) -> None:
    """Skip when ``condition`` does not hold -- except in CI, where a skipped test hides a gap."""
    if condition:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: these tests must run)")
    pytest.skip(reason)


def require_root_and_dbus() -> None:
    require(os.geteuid() == 0, "needs root: callers are switched to other users with setpriv")
    for tool in ("dbus-daemon", "setpriv", "dbus-send"):
        require(shutil.which(tool) is not None, f"needs {tool}")


def system_group(name: str) -> int:
    """The gid of group ``name``, created (as the package's sysusers.d would) when missing."""
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        pass
    result = subprocess.run(["groupadd", "--system", name], capture_output=True, text=True)
    try:
        return grp.getgrnam(name).gr_gid  # also when a concurrent run created it first
    except KeyError:
        pytest.fail(f"cannot create group {name}: {result.stderr.strip()}")


def operator_group() -> int:
    """The steering group's gid (flexiq-admin)."""
    return system_group(OPERATOR_GROUP)


def producer_group() -> int:
    """Group flexiq's gid: the workers', and the job producers' who enqueue."""
    return system_group("flexiq")


def as_user(*, groups: list[int] | None = None) -> list[str]:
    """A setpriv prefix running a command as nobody, with exactly ``groups`` as supplementary groups."""
    prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}"]
    return prefix + ([f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"])


class PrivateBus:
    """A dbus-daemon of our own, listening in a directory every user can reach."""

    def __init__(self, config_template: str, prepare=None) -> None:
        """``config_template``: {socket} and {directory} are filled in; ``prepare(directory)``
        runs before the bus starts (to put files its config includes)."""
        # pytest's tmp_path lives under a root-only directory: nobody could not reach the socket.
        self.directory = pathlib.Path(tempfile.mkdtemp(prefix="flexiqd-bus-"))
        self.directory.chmod(0o755)
        if prepare is not None:
            prepare(self.directory)
        self.config = self.directory / "bus.conf"
        self.config.write_text(config_template.format(socket=self.directory / "socket",
                                                      directory=self.directory))
        self.log = self.directory / "bus.log"
        self._start()

    def _start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                ["dbus-daemon", f"--config-file={self.config}", "--nofork", "--print-address=1"],
                stdout=subprocess.PIPE, stderr=log)
        ready, _, _ = select.select([self.proc.stdout], [], [], 10)
        if not ready:
            self.stop()
            raise AssertionError(f"dbus-daemon printed no address within 10s: {self.log.read_text()}")
        self.address = self.proc.stdout.readline().decode().strip()
        if not self.address:
            self.stop()
            raise AssertionError(f"dbus-daemon did not start: {self.log.read_text()}")

    def kill(self) -> None:
        """The bus daemon dies (SIGKILL), as in a crash: every connection is cut at once."""
        self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()

    def start_again(self) -> None:
        """A new bus daemon at the same address (as socket activation brings one back)."""
        self._start()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


class DaemonProcess:
    """``flexiqd --fleet process`` on a given bus (through $DBUS_SYSTEM_BUS_ADDRESS, as in production)."""

    def __init__(self, directory: pathlib.Path, address: str, *, offering: bool = True) -> None:
        """``offering``: wait until it offers its API (else only until it says it cannot yet)."""
        self.directory = directory
        self.address = address
        self.store = f"{directory / 'queue.db'}"
        self.config = directory / "flexiqd.yaml"
        self.good_config = CONFIG.format(store=self.store)
        self.config.write_text(self.good_config)
        self.log = directory / "daemon.log"
        env = dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=address, STATE_DIRECTORY=str(directory))
        env.pop("NOTIFY_SOCKET", None)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "flexiqd.cli.daemon", "--config", str(self.config), "--fleet", "process"],
                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO))
        try:
            wait_for(lambda: self.proc.poll() is not None or "ffering the D-Bus API" in self.log.read_text()
                     or "Offering org.flexiq.flexiqd1" in self.log.read_text(), 30, "flexiqd to offer its API")
        except AssertionError:
            pass  # reported below, with the daemon's log
        said = "Offering org.flexiq.flexiqd1" if offering else "Not offering the D-Bus API yet"
        if self.proc.poll() is not None or said not in self.log.read_text():
            self.stop()
            pytest.fail(f"flexiqd does not offer its API:\n{self.log.read_text()}")

    def workers(self) -> list[int]:
        return [child.pid for child in psutil.Process(self.proc.pid).children()
                if child.is_running() and child.status() != psutil.STATUS_ZOMBIE]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def flexiqctl(address: str, *args: str, user: list[str] | None = None,
              timeout: float = 60) -> subprocess.CompletedProcess:
    command = [*(user or []), sys.executable, "-m", "flexiqd.cli.flexiqctl", "--bus-address", address, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=str(REPO))


def dbus_send(address: str, member: str, *args: str, interface: str = INTERFACE,
              user: list[str] | None = None, destination: str = BUS_NAME,
              path: str = OBJECT_PATH) -> subprocess.CompletedProcess:
    """A raw call with dbus-send: the error name and text exactly as the caller gets them."""
    command = [*(user or []), "dbus-send", f"--bus={address}", "--print-reply", f"--dest={destination}",
               path, f"{interface}.{member}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def status(address: str) -> dict:
    result = flexiqctl(address, "status", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The stderr of a failed flexiqctl: exactly one line, no traceback."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


class LineReader:
    """Lines of a subprocess's stdout, read by a thread, to wait for with a deadline."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: queue_module.Queue = queue_module.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(proc.stdout,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, predicate, timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}; read: {self.seen}")
            try:
                line = self.lines.get(timeout=remaining)
            except queue_module.Empty:
                continue
            self.seen.append(line)
            if predicate(line):
                return line


async def _call_and_catch_signal(address: str, member: str, signal_member: str,
                                 signal_interface: str, timeout: float = 15) -> list:
    """Call ``member`` as root and return the body of the first ``signal_member`` flexiqd sends."""
    from dbus_fast import Message, MessageType
    from dbus_fast.aio import MessageBus

    bus = await MessageBus(bus_address=address).connect()
    caught = asyncio.get_running_loop().create_future()

    def handler(message):
        if (message.message_type is MessageType.SIGNAL and message.path == OBJECT_PATH
                and message.interface == signal_interface and message.member == signal_member
                and not caught.done()):
            caught.set_result(list(message.body))

    bus.add_message_handler(handler)
    try:
        await bus.call(Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                               interface="org.freedesktop.DBus", member="AddMatch", signature="s",
                               body=[f"type='signal',path='{OBJECT_PATH}',interface='{signal_interface}',"
                                     f"member='{signal_member}'"]))
        reply = await bus.call(Message(destination=BUS_NAME, path=OBJECT_PATH, interface=INTERFACE,
                                       member=member))
        assert reply.message_type is MessageType.METHOD_RETURN, reply.body
        return await asyncio.wait_for(caught, timeout)
    finally:
        bus.disconnect()


# -- fixtures -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bus():
    require_root_and_dbus()
    private = PrivateBus(OPEN_BUS_CONFIG)
    yield private
    private.stop()


@pytest.fixture(scope="module")
def daemon(bus, tmp_path_factory):
    operator_group()
    process = DaemonProcess(tmp_path_factory.mktemp("flexiqd"), bus.address)
    yield process
    process.stop()


@pytest.fixture
def address(daemon) -> str:
    return daemon.address


# -- tests ----------------------------------------------------------------------------------------

def test_status_json_shows_the_pool_and_its_numbers(daemon, address):
    document = wait_for(lambda: (lambda d: d if (d["pools"]["default"]["workers"] or {}).get("active") == 1
                                 else None)(status(address)), 30, "one active worker in status")
    assert document["version"] and document["config_path"] == str(daemon.config)
    assert document["config_error"] is None and document["fleet"] == "process"
    pool = document["pools"]["default"]
    assert (pool["min_workers"], pool["max_workers"], pool["concurrency"]) == (1, 5, 2)
    assert pool["workers"] == {"active": 1, "starting": 0, "draining": 0, "failed": 0}
    assert pool["desired"] == 1 and pool["paused"] is False and pool["pinned"] is None
    assert set(pool["metrics"]) == {"runnable", "delayed", "running", "oldest_runnable_age", "time_to_drain",
                                    "arrival_rate", "completion_rate", "duration_p50", "duration_p95",
                                    "duration_p99", "coming_due", "coming_due_within", "running_age_mean",
                                    "held_by_tenant_cap", "waiting_for_dependency"}
    assert pool["metrics"]["runnable"] == 0 and pool["utilisation"] == 0.0
    assert (pool["metrics"]["held_by_tenant_cap"], pool["metrics"]["waiting_for_dependency"]) == (0, 0)
    assert document["dependencies"] == []  # none declared
    assert pool["start_cost"] is None  # its one worker was started with nothing waiting
    assert pool["decision"]["reason"] and pool["decision"]["rationale"].startswith("default ")

    table = flexiqctl(address, "status")
    assert table.returncode == 0, table.stderr
    assert "pool default" in table.stdout and "1 active" in table.stdout and "(min 1, max 5)" in table.stdout
    assert "startup      not measured yet" in table.stdout


def test_properties_are_readable(address):
    result = dbus_send(address, "GetAll", f"string:{INTERFACE}", interface="org.freedesktop.DBus.Properties")
    assert result.returncode == 0, result.stderr
    for name in ("Version", "ConfigPath", "ConfigError", "Pools"):
        assert f'"{name}"' in result.stdout
    assert '"default"' in result.stdout


def test_scale_pins_the_pool_and_the_workers_appear(daemon, address):
    result = flexiqctl(address, "scale", "default", "3", "--for", "1m")
    assert result.returncode == 0, result.stderr
    assert "pinned at 3 workers for 1m" in result.stdout
    wait_for(lambda: len(daemon.workers()) == 3, 30, "three worker processes")
    wait_for(lambda: status(address)["pools"]["default"]["workers"]["active"] == 3, 30, "three active workers")
    pool = status(address)["pools"]["default"]
    assert pool["pinned"]["workers"] == 3 and pool["pinned"]["until"] > time.time() + 30
    assert pool["decision"]["reason"] == "Pinned"

    events = flexiqctl(address, "events")
    assert events.returncode == 0, events.stderr
    assert any("Pinned" in line and "-> 3" in line for line in events.stdout.splitlines()), events.stdout
    as_json = [json.loads(line) for line in flexiqctl(address, "events", "--json").stdout.splitlines()]
    pinned = [e for e in as_json if e["reason"] == "Pinned" and e["desired"] == 3]
    assert pinned and pinned[-1]["pool"] == "default"
    later = flexiqctl(address, "events", "--since", str(pinned[-1]["seq"]), "--json").stdout.splitlines()
    assert all(json.loads(line)["seq"] > pinned[-1]["seq"] for line in later)

    assert flexiqctl(address, "unpin", "default").returncode == 0
    assert status(address)["pools"]["default"]["pinned"] is None


def test_scale_beyond_max_workers_is_refused_with_the_reason(address):
    result = flexiqctl(address, "scale", "default", "999")
    assert result.returncode == 1
    assert "999 workers is outside 0..5 (its max_workers)" in one_line_error(result)
    raw = dbus_send(address, "Scale", "string:default", "uint32:999", "double:0")
    assert "org.flexiq.flexiqd1.Error.InvalidArgs" in raw.stderr


def test_scale_of_an_unknown_pool_names_it(address):
    result = flexiqctl(address, "scale", "nosuchpool", "1")
    assert result.returncode == 1
    line = one_line_error(result)
    assert "nosuchpool" in line and "pools: default" in line


def test_pause_keeps_a_job_queued_and_resume_runs_it(daemon, address):
    from flexiqd import Queue

    assert flexiqctl(address, "pause", "default").returncode == 0
    assert status(address)["pools"]["default"]["paused"] is True
    enqueued = subprocess.run([sys.executable, "-m", "flexiqd.cli.flexiq", "--url", f"sqlite:///{daemon.store}",
                               "enqueue", "flexiqd.demo.sleep", "0.1"],
                              capture_output=True, text=True, timeout=30, cwd=str(REPO))
    assert enqueued.returncode == 0, enqueued.stderr
    job_id = int(enqueued.stdout.strip())
    jobs = Queue(f"sqlite:///{daemon.store}")
    try:
        # Idle workers poll at least every 0.5s: waiting 1.5s in the queue means nobody claims it.
        wait_for(lambda: (lambda m: m and m["runnable"] == 1 and m["oldest_runnable_age"] >= 1.5)(
            status(address)["pools"]["default"]["metrics"]), 30, "the job to wait 1.5s in the queue")
        assert jobs.get(job_id).state.value == "queued"

        assert flexiqctl(address, "resume", "default").returncode == 0
        wait_for(lambda: jobs.get(job_id).state.value == "done", 30, "the job to run after resume")
        assert status(address)["pools"]["default"]["paused"] is False
    finally:
        jobs.close()


def test_a_burst_gets_the_process_fleets_start_cost_measured(daemon, address):
    from flexiqd import Queue
    from flexiqd.queue.types import NewJob

    assert flexiqctl(address, "unpin", "default").returncode == 0
    jobs = Queue(f"sqlite:///{daemon.store}")
    try:
        ids = jobs.enqueue_many([NewJob(task="flexiqd.demo.sleep", payload={"args": [0.3]})] * 40)
        # Workers started while jobs wait are measured; a pin starts them whatever the policy thinks.
        assert flexiqctl(address, "scale", "default", "3", "--for", "20s").returncode == 0
        cost = wait_for(lambda: status(address)["pools"]["default"]["start_cost"], 30, "a measured start cost")
        assert 0 < cost["seconds"] < 60 and cost["samples"] >= 1
        assert cost["ready"] is None  # the process fleet has no readiness of its own to report
        wait_for(lambda: all(jobs.get(i).state.value == "done" for i in ids), 60, "the burst to finish")
    finally:
        flexiqctl(address, "unpin", "default")
        jobs.close()


def ctrl_c_works() -> None:
    """In the child: SIGINT as a terminal gives it, even when this run inherited it ignored
    (started in the background by a shell), so the child's Ctrl-C handling is what is tested."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_events_follow_prints_history_then_a_scale_event_as_it_happens(daemon, address):
    history = [json.loads(line) for line in flexiqctl(address, "events", "--json").stdout.splitlines()]
    follower = subprocess.Popen(
        [sys.executable, "-m", "flexiqd.cli.flexiqctl", "--bus-address", address, "events", "--follow"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO), preexec_fn=ctrl_c_works)
    try:
        lines = LineReader(follower)
        last = history[-1]["seq"]
        lines.wait_for(lambda line: f"#{last} " in line, 20, f"the history up to event #{last}")
        current = status(address)["pools"]["default"]["workers"]["active"]
        target = 2 if current != 2 else 4
        assert flexiqctl(address, "scale", "default", str(target), "--for", "1m").returncode == 0
        line = lines.wait_for(lambda text: "Pinned" in text and f"-> {target}:" in text, 20,
                              f"the Pinned event to {target} workers")
        assert int(line.split("#")[1].split()[0]) > last
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=10) == 0, follower.stderr.read()
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        flexiqctl(address, "unpin", "default")


def test_watch_refreshes_until_ctrl_c(address):
    watcher = subprocess.Popen(
        [sys.executable, "-m", "flexiqd.cli.flexiqctl", "--bus-address", address, "watch", "--interval", "200ms"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO), preexec_fn=ctrl_c_works)
    try:
        lines = LineReader(watcher)
        for refresh in (1, 2):
            lines.wait_for(lambda line: line == "pool default", 20, f"refresh {refresh} of the table")
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=10) == 130, watcher.stderr.read()  # interrupted, as a shell counts it
        assert not any("\x1b" in line for line in lines.seen)  # no screen control codes into a pipe
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()


def test_reload_of_a_broken_file_is_reported_and_shown_in_status(daemon, address):
    daemon.config.write_text(daemon.good_config + "    max_wrkers: 3\n")
    try:
        result = flexiqctl(address, "reload")
        assert result.returncode == 1
        line = one_line_error(result)
        assert "reload rejected" in line and "max_wrkers" in line
        document = status(address)
        assert "max_wrkers" in document["config_error"]
        assert "config rejected" in flexiqctl(address, "status").stdout
        prop = dbus_send(address, "Get", f"string:{INTERFACE}", "string:ConfigError",
                         interface="org.freedesktop.DBus.Properties")
        assert "max_wrkers" in prop.stdout
    finally:
        daemon.config.write_text(daemon.good_config)
    # The error clears on a good reload, and PropertiesChanged says so.
    body = asyncio.run(_call_and_catch_signal(address, "Reload", "PropertiesChanged",
                                              "org.freedesktop.DBus.Properties"))
    assert body[0] == INTERFACE and body[1]["ConfigError"].value == ""
    assert status(address)["config_error"] is None
    good = flexiqctl(address, "reload")
    assert good.returncode == 0 and "reloaded" in good.stdout


@pytest.mark.parametrize("who", ["nobody", "producer"])
def test_a_caller_neither_root_nor_in_the_steering_group_is_refused_by_the_daemon(address, who):
    # A job producer (group flexiq, which shares the SQLite store) is no one special here.
    nobody = as_user(groups=[producer_group()] if who == "producer" else None)
    assert flexiqctl(address, "status", user=nobody).returncode == 0  # reading is for everyone
    result = flexiqctl(address, "pause", "default", user=nobody)
    assert result.returncode == 1
    line = one_line_error(result)
    assert "permission denied" in line and "member of the flexiq-admin group" in line
    for member, args in (("Scale", ["string:default", "uint32:2", "double:0"]), ("Pause", ["string:default"]),
                         ("Drain", ["string:default"]), ("ClearCeiling", ["string:default"]), ("Restart", ["string:default"]),
                         ("Reload", []), ("Jobs", ["string:{}"]), ("Job", ["uint64:1"])):
        raw = dbus_send(address, member, *args, user=nobody)
        assert raw.returncode != 0
        # The daemon's own refusal: this bus has no policy that would refuse it.
        assert "org.freedesktop.DBus.Error.AccessDenied" in raw.stderr, raw.stderr
        assert f"{member} is for root and members of the flexiq-admin group (caller uid {NOBODY})" in raw.stderr
    assert status(address)["pools"]["default"]["paused"] is False


def test_clear_ceiling_is_taken_for_a_pool_and_refused_for_an_unknown_one(address):
    result = flexiqctl(address, "clear-ceiling", "default")
    assert result.returncode == 0, result.stderr
    assert "measured again" in result.stdout
    unknown = flexiqctl(address, "clear-ceiling", "nosuchpool")
    assert unknown.returncode == 1 and "nosuchpool" in one_line_error(unknown)


def test_restart_wait_replaces_the_process_fleets_workers_and_exits_0(daemon, address):
    before = set(daemon.workers())
    assert before
    result = flexiqctl(address, "restart", "default", "--wait", "--timeout", "50s")
    assert result.returncode == 0, result.stderr
    assert "default: restart requested" in result.stdout and "default: restart done at" in result.stdout
    assert not before & set(daemon.workers()), "a worker started before the restart still runs"
    restart = status(address)["pools"]["default"]["restart"]
    assert restart["state"] == "done" and restart["old_serving"] == 0
    unknown = flexiqctl(address, "restart", "nosuchpool")
    assert unknown.returncode == 1 and "nosuchpool" in one_line_error(unknown)
    usage = flexiqctl(address, "restart", "default", "--timeout", "5s")
    assert usage.returncode == 2 and "--timeout is for --wait" in usage.stderr


def test_a_member_of_the_steering_group_may_steer(address):
    operator = as_user(groups=[operator_group()])
    result = flexiqctl(address, "scale", "default", "2", "--for", "30s", user=operator)
    assert result.returncode == 0, result.stderr
    assert status(address)["pools"]["default"]["pinned"]["workers"] == 2
    assert flexiqctl(address, "unpin", "default", user=operator).returncode == 0


def test_flexiqctl_without_a_daemon_exits_3_and_says_how_to_start_it(bus):
    empty = PrivateBus(OPEN_BUS_CONFIG)
    try:
        result = flexiqctl(empty.address, "status")
    finally:
        empty.stop()
    assert result.returncode == 3
    assert "flexiqd is not running" in one_line_error(result) and "systemctl start flexiqd" in result.stderr

    unreachable = flexiqctl("unix:path=/nonexistent/flexiqd-test-bus", "scale", "default", "1")
    assert unreachable.returncode == 3
    assert "systemctl start flexiqd" in one_line_error(unreachable)


def test_flexiqd_offers_its_api_again_when_the_bus_comes_back(bus, tmp_path):
    """The bus daemon killed, then another at the same address: flexiqd owns its name again by
    itself, without restarting; in the gap flexiqctl fails in one line (exit 3)."""
    own_bus = PrivateBus(OPEN_BUS_CONFIG)
    directory = pathlib.Path(tempfile.mkdtemp(prefix="flexiqd-rebus-"))
    flexiqd = DaemonProcess(directory, own_bus.address)
    try:
        assert flexiqctl(own_bus.address, "status").returncode == 0
        own_bus.kill()
        gap = flexiqctl(own_bus.address, "status")
        assert gap.returncode == 3 and "cannot reach the system bus" in one_line_error(gap)
        own_bus.start_again()
        wait_for(lambda: flexiqctl(own_bus.address, "status").returncode == 0, 20,
                 "flexiqd to offer its API again")
        assert flexiqd.proc.poll() is None  # the same process: it did not restart
        log = flexiqd.log.read_text()
        assert "Lost the bus connection" in log and "Offering org.flexiq.flexiqd1 on the bus again" in log
        assert "Traceback" not in log
        # Steering works again too, not only reading.
        assert flexiqctl(own_bus.address, "scale", "default", "2", "--for", "5s").returncode == 0
    finally:
        flexiqd.stop()
        own_bus.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_flexiqd_started_while_the_bus_is_away_offers_its_api_once_it_is_back(bus):
    own_bus = PrivateBus(OPEN_BUS_CONFIG)
    own_bus.kill()
    directory = pathlib.Path(tempfile.mkdtemp(prefix="flexiqd-nobus-"))
    flexiqd = DaemonProcess(directory, own_bus.address, offering=False)
    try:
        time.sleep(1.5)  # a few attempts: said once, not once each
        assert flexiqd.log.read_text().count("offer the API") <= 1, flexiqd.log.read_text()
        own_bus.start_again()
        wait_for(lambda: flexiqctl(own_bus.address, "status").returncode == 0, 20, "flexiqd to offer its API")
        assert flexiqd.proc.poll() is None
        assert "Offering org.flexiq.flexiqd1 on the bus again" in flexiqd.log.read_text()
    finally:
        flexiqd.stop()
        own_bus.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_serve_api_refuses_a_name_already_owned_and_an_unreachable_bus(daemon, address):
    from flexiqd.dbus.service import serve_api
    from flexiqd.errors import FlexiqdError

    class StandIn:
        """A daemon with no pools that records who subscribes."""
        config_path = "x.yaml"
        listeners: list = []

        def config_error(self):
            return None

        def pool_names(self):
            return []

        async def status(self):
            return {"pools": {}}

        def subscribe(self, listener):
            self.listeners.append(listener)

    stand_in = StandIn()
    with pytest.raises(FlexiqdError, match="already owned by another process"):
        asyncio.run(serve_api(stand_in, address))
    with pytest.raises(FlexiqdError, match="cannot connect to unix:path=/nonexistent"):
        asyncio.run(serve_api(stand_in, "unix:path=/nonexistent/flexiqd-test-bus"))
    assert stand_in.listeners == []


# -- the pools' history and the jobs themselves -------------------------------------------------------

def reply_string(result: subprocess.CompletedProcess) -> str:
    """The one string a dbus-send --print-reply printed (between quotes it does not escape)."""
    assert result.returncode == 0, result.stderr
    text = result.stdout.split("string ", 1)[1].strip()
    assert text[0] == text[-1] == '"', text
    return text[1:-1]


def test_history_gives_everyone_the_pools_samples_and_its_scale_events(daemon, address):
    since = time.time() - 3600
    wait_for(lambda: json.loads(reply_string(dbus_send(address, "History", "string:default", f"double:{since}",
                                                       user=as_user())))["samples"], 10, "a first sample")
    history = json.loads(reply_string(dbus_send(address, "History", "string:default", f"double:{since}",
                                                user=as_user())))
    assert (history["pool"], history["step"]) == ("default", 5.0)
    assert history["target_age"] == 30.0  # the default age target
    last = history["samples"][-1]
    assert set(last) == {"t", "active", "starting", "draining", "desired", "runnable", "running", "delayed",
                         "oldest_age"}
    assert last["active"] + last["starting"] >= 1 and last["t"] <= time.time()
    assert [e["pool"] for e in history["events"]] and {e["pool"] for e in history["events"]} == {"default"}
    later = json.loads(reply_string(dbus_send(address, "History", "string:default", f"double:{time.time() + 60}")))
    assert (later["samples"], later["events"]) == ([], [])
    unknown = dbus_send(address, "History", "string:nope", "double:0")
    assert "org.flexiq.flexiqd1.Error.InvalidArgs" in unknown.stderr and "no pool 'nope'" in unknown.stderr


def test_jobs_and_job_are_for_the_steering_group_only_and_page_through_the_store(daemon, address):
    from flexiqd.queue.types import NewJob
    from flexiqd.queue.url import open_backend

    backend = open_backend(f"sqlite:///{daemon.store}")
    try:
        ids = backend.enqueue([NewJob(task="report.build", payload={"secret": "s3"}, queue="reports", tenant="acme")
                               for _ in range(3)], now=time.time())
    finally:
        backend.close()
    query = json.dumps({"queue": "reports", "tenant": "acme", "limit": 2})
    refused = dbus_send(address, "Jobs", f"string:{query}", user=as_user())
    assert "org.freedesktop.DBus.Error.AccessDenied" in refused.stderr
    assert "Jobs is for root and members of the flexiq-admin group" in refused.stderr
    assert "org.freedesktop.DBus.Error.AccessDenied" in dbus_send(address, "Job", f"uint64:{ids[0]}",
                                                                   user=as_user()).stderr
    operator = as_user(groups=[operator_group()])
    first = json.loads(reply_string(dbus_send(address, "Jobs", f"string:{query}", user=operator)))
    assert [job["id"] for job in first["jobs"]] == [ids[2], ids[1]] and first["next"] == ids[1]
    assert "payload" not in first["jobs"][0]  # a list says what a job is, not its arguments
    second = json.loads(reply_string(dbus_send(
        address, "Jobs", "string:" + json.dumps({"queue": "reports", "limit": 2, "before": first["next"]}),
        user=operator)))
    assert [job["id"] for job in second["jobs"]] == [ids[0]] and second["next"] is None
    whole = json.loads(reply_string(dbus_send(address, "Job", f"uint64:{ids[0]}", user=operator)))
    assert whole["job"]["payload"] == {"secret": "s3"} and whole["attempts"] == []
    bad = dbus_send(address, "Jobs", "string:" + json.dumps({"state": "lost"}), user=operator)
    assert "org.flexiq.flexiqd1.Error.InvalidArgs" in bad.stderr and "state must be one of" in bad.stderr
    missing = dbus_send(address, "Job", "uint64:999999", user=operator)
    assert "org.flexiq.flexiqd1.Error.InvalidArgs" in missing.stderr and "no job with id 999999" in missing.stderr


def test_dead_letters_are_retried_and_purged_by_operators_only(daemon, address):
    from flexiqd.queue.types import ClaimRequest, JobState, NewJob, Outcome
    from flexiqd.queue.url import open_backend

    backend = open_backend(f"sqlite:///{daemon.store}")
    try:
        now = time.time()
        revive, purge = backend.enqueue([NewJob(task="t", queue="letters", max_attempts=1) for _ in range(2)],
                                        now=now)
        backend.claim(ClaimRequest(owner="w", queues=("letters",), limit=2), now=now)
        backend.settle("w", [Outcome.dead(revive, "boom"), Outcome.dead(purge, "boom")], now=now)
        refused = dbus_send(address, "RetryDead", "string:letters", f"array:uint64:{revive}", user=as_user())
        assert "org.freedesktop.DBus.Error.AccessDenied" in refused.stderr
        operator = as_user(groups=[operator_group()])
        retried = dbus_send(address, "RetryDead", "string:letters", f"array:uint64:{revive}", user=operator)
        assert retried.returncode == 0 and "uint32 1" in retried.stdout, retried.stderr
        purged = dbus_send(address, "PurgeDead", "string:letters", "array:uint64:", user=operator)
        assert purged.returncode == 0 and "uint32 1" in purged.stdout, purged.stderr
        assert backend.get(revive).state is JobState.QUEUED
        assert [job.id for job in backend.list_jobs(queue="letters")] == [revive]
    finally:
        backend.close()


def test_schedules_are_shown_to_everyone_and_run_paused_resumed_by_operators_only(daemon, address):
    from flexiqd.queue.url import open_backend

    wait_for(lambda: json.loads(flexiqctl(address, "schedules", "--json").stdout)["schedules"]["nightly"]["next_fire"],
             30, "the firing loop's first pass")
    shown = flexiqctl(address, "schedules", user=as_user())
    assert shown.returncode == 0, shown.stderr
    assert "schedule nightly" in shown.stdout and "'0 3 * * *' in Europe/Berlin" in shown.stdout
    assert "next fire" in shown.stdout and "secret" not in shown.stdout   # the arguments are not everyone's
    refused = flexiqctl(address, "schedule", "run", "nightly", user=as_user())
    assert refused.returncode == 1 and "root or as a member of the flexiq-admin group" in one_line_error(refused)
    operator = as_user(groups=[operator_group()])
    ran = flexiqctl(address, "schedule", "run", "nightly", user=operator)
    assert ran.returncode == 0, ran.stderr
    job_id = int(ran.stdout.split("enqueued job ")[1].split()[0])
    backend = open_backend(f"sqlite:///{daemon.store}")
    try:
        job = backend.get(job_id)
        assert (job.task, job.queue, job.payload) == ("app.report", "reports", {"args": ["secret"], "kwargs": {}})
    finally:
        backend.close()
    assert "paused on every host" in flexiqctl(address, "schedule", "pause", "nightly", user=operator).stdout
    document = json.loads(flexiqctl(address, "schedules", "--json").stdout)["schedules"]["nightly"]
    assert document["paused"] and document["last_run"]["job_id"] == job_id
    assert "resumed" in flexiqctl(address, "schedule", "resume", "nightly", user=operator).stdout
    unknown = flexiqctl(address, "schedule", "pause", "nosuch")
    assert unknown.returncode == 1 and "no schedule 'nosuch' (schedules: nightly)" in one_line_error(unknown)
