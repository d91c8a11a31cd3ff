"""The sandbox works, and the systemd behaviour flexiqd is built on holds.

Each test here records a fact the daemon and the worker rely on, observed on
the real systemd in the sandbox (notes/systemd-lifecycle.md, notes/dbus.md):

- a ``Type=notify`` template instance is "started" only once it sent READY=1;
- ``KillMode=mixed``: SIGTERM reaches only the main process, which may drain
  and exit cleanly within ``TimeoutStopSec``; the rest of the cgroup never sees
  SIGTERM and is SIGKILLed once the main process has exited, or at the timeout
  if the main process is still running then;
- template instances can be started over D-Bus from the host through the
  sandbox's bus socket, with pystemd;
- a per-instance drop-in in /run plus a daemon reload changes one instance's
  stop timeout; a dash-prefix drop-in does not reach template instances.

The probe unit stands in for ``flexiq-worker@.service``: a small Python
program that waits for a gate before READY=1, drains on SIGTERM, can start a
child in its cgroup, and records what happened to it as timestamps.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from .sandbox import Sandbox, SandboxBootError, SandboxTimeout

PROBE_PATH = "/usr/local/libexec/flexiq-probe"
STOP_TIMEOUT_SEC = 3  # the template's TimeoutStopSec

PROBE_SCRIPT = r'''#!/usr/bin/python3
"""flexiq-probe: a stand-in worker for the sandbox tests.

flexiq-probe INSTANCE             the service (ExecStart)
flexiq-probe --stop-post INSTANCE records how it ended (ExecStopPost)

Behaviour comes from /etc/flexiq-probe/INSTANCE.env:
  PROBE_READY_GATE=path   wait until path exists before sending READY=1
  PROBE_DRAIN_SECONDS=s   on SIGTERM send STOPPING=1, "drain" s seconds, exit 0
  PROBE_CHILD=1           start a child in the unit's cgroup that records a
                          SIGTERM if it gets one and writes a heartbeat
Records time.time() stamps in /run/flexiq-probe/INSTANCE/<event>.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CHILD = """
import os, signal, sys, time
def record(name):
    tmp = os.path.join(sys.argv[1], name + ".tmp")
    with open(tmp, "w") as f:
        f.write(repr(time.time()))
    os.replace(tmp, os.path.join(sys.argv[1], name))
signal.signal(signal.SIGTERM, lambda *_: record("child-sigterm"))
while True:
    record("child-heartbeat")
    time.sleep(0.05)
"""


def record(state, name, value=None):
    tmp = state / (name + ".tmp")
    tmp.write_text(repr(time.time()) if value is None else value)
    tmp.replace(state / name)


def stop_post(state):
    # systemd passes how the main process ended to ExecStopPost.
    record(state, "result", " ".join(os.environ.get(k, "-") for k in
                                     ("SERVICE_RESULT", "EXIT_CODE", "EXIT_STATUS")))


def main(state):
    stopping = False

    def on_sigterm(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_sigterm)
    record(state, "started")
    if os.environ.get("PROBE_CHILD") == "1":
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(state)])
        record(state, "child-pid", str(child.pid))
    gate = os.environ.get("PROBE_READY_GATE")
    while gate and not os.path.exists(gate) and not stopping:
        time.sleep(0.05)
    import sdnotify
    notifier = sdnotify.SystemdNotifier()
    record(state, "ready")
    notifier.notify("READY=1")
    while not stopping:
        time.sleep(0.05)
    record(state, "sigterm")
    notifier.notify("STOPPING=1")
    time.sleep(float(os.environ.get("PROBE_DRAIN_SECONDS", "0")))
    record(state, "exit")


if __name__ == "__main__":
    post = sys.argv[1] == "--stop-post"
    state = Path("/run/flexiq-probe") / sys.argv[-1]
    state.mkdir(parents=True, exist_ok=True)
    stop_post(state) if post else main(state)
'''

PROBE_TEMPLATE = f"""\
[Unit]
Description=flexiq sandbox probe %i

[Service]
Type=notify
NotifyAccess=main
EnvironmentFile=-/etc/flexiq-probe/%i.env
ExecStart=/usr/bin/python3 {PROBE_PATH} %i
ExecStopPost=/usr/bin/python3 {PROBE_PATH} --stop-post %i
KillMode=mixed
TimeoutStartSec=60
TimeoutStopSec={STOP_TIMEOUT_SEC}
"""


@pytest.fixture(scope="module")
def probe_installed(sandbox: Sandbox) -> Sandbox:
    sandbox.write_file(PROBE_PATH, PROBE_SCRIPT, 0o755)
    sandbox.install_unit("flexiq-probe@.service", PROBE_TEMPLATE)
    return sandbox


@pytest.fixture
def probe(probe_installed: Sandbox):
    """The sandbox with the probe template installed; stops every probe afterwards."""
    yield probe_installed
    probe_installed.systemctl("stop", "flexiq-probe@*.service", check=False)
    probe_installed.systemctl("reset-failed", "flexiq-probe@*.service", check=False)


def configure(sbx: Sandbox, instance: str, **env: str) -> None:
    sbx.write_file(f"/etc/flexiq-probe/{instance}.env",
                   "".join(f"{key}={value}\n" for key, value in env.items()))


def records(sbx: Sandbox, instance: str) -> dict[str, str]:
    """The probe's records for one instance: event name -> content."""
    out = sbx.run(["bash", "-c", 'cd "$1" 2>/dev/null || exit 0; for f in *; do '
                   '[[ -f $f && $f != *.tmp ]] && printf "%s\\t%s\\n" "$f" "$(cat "$f")"; done',
                   "bash", f"/run/flexiq-probe/{instance}"]).stdout
    return dict(line.split("\t", 1) for line in out.splitlines())


def journal_showing(sbx: Sandbox, unit: str, text: str) -> str:
    """The unit's journal once it contains ``text`` (journald may lag behind)."""
    def journal_if_shown() -> str:
        journal = sbx.journal(unit)
        return journal if text in journal else ""
    return sbx.wait_for(journal_if_shown, what=f"the journal of {unit} to show {text!r}")


def stamp(recs: dict[str, str], event: str) -> float:
    return float(recs[event])


# -- the layer itself -------------------------------------------------------


def test_commands_run_inside_a_throwaway_systemd_machine(sandbox: Sandbox) -> None:
    assert sandbox.run(["cat", "/proc/1/comm"]).stdout.strip() == "systemd"
    assert sandbox.systemctl("is-system-running", check=False).stdout.strip() in (
        "running", "degraded")
    # Writes land in the container's overlay, not on the host.
    sandbox.write_file("/etc/flexiq-sandbox-check", "inside\n", 0o600)
    assert sandbox.run(["stat", "-c", "%a %s", "/etc/flexiq-sandbox-check"]).stdout.split() == [
        "600", "7"]
    assert not os.path.exists("/etc/flexiq-sandbox-check")
    # A script is fed on stdin and stops at its first failing command.
    done = sandbox.script("echo one\nfalse\necho two\n", check=False)
    assert (done.returncode, done.stdout) == (1, "one\n")


def test_run_timeout_kills_the_command(sandbox: Sandbox) -> None:
    begun = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        sandbox.run("sleep 86399", timeout=1)
    assert time.monotonic() - begun < 10
    sandbox.wait_for(
        lambda: "sleep 86399" not in sandbox.run(["ps", "-eo", "args"]).stdout,
        what="the timed-out command to be gone")


def test_wait_for_names_what_it_waited_for(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxTimeout, match="the impossible to happen"):
        sandbox.wait_for(lambda: False, timeout=0.3, interval=0.05,
                         what="the impossible to happen")


# -- facts about systemd that flexiqd relies on -----------------------------


def test_notify_start_returns_only_after_ready(probe: Sandbox) -> None:
    unit = "flexiq-probe@a-1.service"
    gate = "/run/flexiq-probe-gate-a-1"
    configure(probe, "a-1", PROBE_READY_GATE=gate)
    with ThreadPoolExecutor(max_workers=1) as pool:
        start = pool.submit(probe.systemctl, "start", unit)
        try:
            probe.wait_for(lambda: "started" in records(probe, "a-1"),
                           what="the probe's main process to run")
            assert probe.unit_properties(unit, "ActiveState", "SubState") == {
                "ActiveState": "activating", "SubState": "start"}
            assert not start.done(), "systemctl start returned before READY=1"
        finally:
            probe.run(["touch", gate])  # never leave systemctl blocked
        start.result(timeout=60)
    returned_at = time.time()
    assert probe.unit_properties(unit, "ActiveState", "SubState") == {
        "ActiveState": "active", "SubState": "running"}
    recs = records(probe, "a-1")
    assert stamp(recs, "started") <= stamp(recs, "ready") <= returned_at


def test_mixed_kill_lets_main_drain_and_kills_the_rest_when_it_exits(probe: Sandbox) -> None:
    unit = "flexiq-probe@mixed-1.service"
    drain = 1.0
    configure(probe, "mixed-1", PROBE_DRAIN_SECONDS=str(drain), PROBE_CHILD="1")
    probe.systemctl("start", unit)
    child_pid = probe.wait_for(lambda: records(probe, "mixed-1").get("child-pid"),
                               what="the probe to start its child")
    probe.wait_for(lambda: "child-heartbeat" in records(probe, "mixed-1"),
                   what="the child's first heartbeat")

    begun = time.time()
    probe.systemctl("stop", unit)
    stopped = time.time()

    recs = records(probe, "mixed-1")
    assert recs["result"] == "success exited 0"
    # The main process got SIGTERM, drained, exited: well inside the timeout.
    assert stamp(recs, "exit") - stamp(recs, "sigterm") >= drain
    assert drain <= stopped - begun < STOP_TIMEOUT_SEC
    # The child never saw SIGTERM and kept working through the drain...
    assert "child-sigterm" not in recs
    assert stamp(recs, "child-heartbeat") >= stamp(recs, "exit") - 0.5
    # ...and was SIGKILLed once the main process had exited, not at the timeout.
    journal = journal_showing(probe, unit, "Stopped flexiq-probe@mixed-1")
    assert f"Killing process {child_pid} (python3) with signal SIGKILL" in journal
    assert "timed out" not in journal
    assert probe.run(["kill", "-0", child_pid], check=False).returncode != 0


def test_mixed_kill_sigkills_everything_at_the_stop_timeout(probe: Sandbox) -> None:
    unit = "flexiq-probe@mixed-2.service"
    configure(probe, "mixed-2", PROBE_DRAIN_SECONDS="60", PROBE_CHILD="1")
    probe.systemctl("start", unit)
    child_pid = probe.wait_for(lambda: records(probe, "mixed-2").get("child-pid"),
                               what="the probe to start its child")
    probe.wait_for(lambda: "child-heartbeat" in records(probe, "mixed-2"),
                   what="the child's first heartbeat")

    begun = time.time()
    probe.systemctl("stop", unit)
    stopped = time.time()

    recs = records(probe, "mixed-2")
    assert recs["result"] == "timeout killed KILL"
    assert "exit" not in recs  # the drain never finished
    assert STOP_TIMEOUT_SEC - 0.5 <= stopped - begun < STOP_TIMEOUT_SEC + 10
    # The child ran until the timeout, never saw SIGTERM, then got SIGKILL.
    assert "child-sigterm" not in recs
    assert stamp(recs, "child-heartbeat") >= stamp(recs, "sigterm") + STOP_TIMEOUT_SEC - 0.5
    # A failed unit stays loaded, so its properties are the real ones.
    assert probe.unit_properties(unit, "ActiveState", "Result") == {
        "ActiveState": "failed", "Result": "timeout"}
    journal = journal_showing(probe, unit, "Stopped flexiq-probe@mixed-2")
    assert "State 'stop-sigterm' timed out. Killing." in journal
    assert f"Killing process {child_pid} (python3) with signal SIGKILL" in journal


def test_cleanly_stopped_instance_is_unloaded_and_its_result_forgotten(probe: Sandbox) -> None:
    """Reading ``Result`` after a clean stop proves nothing: the unit is gone.

    systemd garbage-collects an inactive instance nobody references; a later
    ``systemctl show`` (or D-Bus read) loads a fresh one whose ``Result`` is
    the default ``success``. How an instance ended must be observed while it
    ends (JobRemoved / PropertiesChanged after ``Subscribe()``, ExecStopPost,
    the journal), not read afterwards.
    """
    unit = "flexiq-probe@gc-1.service"
    probe.systemctl("start", unit)
    assert probe.unit_property(unit, "ExecMainStartTimestamp") != ""
    probe.systemctl("stop", unit)
    assert records(probe, "gc-1")["result"] == "success exited 0"
    probe.wait_for(lambda: probe.unit_properties(unit, "ExecMainStartTimestamp", "ExecMainPID")
                   == {"ExecMainStartTimestamp": "", "ExecMainPID": "0"},
                   what=f"{unit} to be unloaded and reloaded blank")
    assert probe.unit_properties(unit, "ActiveState", "Result") == {
        "ActiveState": "inactive", "Result": "success"}


def test_start_template_instance_over_dbus_from_the_host(probe: Sandbox) -> None:
    # Imported here, not at the top: without root the module must still import to skip.
    from pystemd.dbuslib import DBusAddress
    from pystemd.systemd1 import Manager, Unit

    name = b"flexiq-probe@b-2.service"
    with DBusAddress(probe.bus_address.encode()) as bus:
        manager = Manager(bus=bus)
        manager.load()
        version = probe.run(["systemctl", "--version"]).stdout.split()[1]
        assert manager.Manager.Version.decode().startswith(version)

        job = manager.Manager.StartUnit(name, b"replace")
        assert job.startswith(b"/org/freedesktop/systemd1/job/")
        unit = Unit(name, bus=bus)
        unit.load()
        probe.wait_for(lambda: unit.Unit.ActiveState == b"active", timeout=30,
                       what="flexiq-probe@b-2 to become active over D-Bus")
        assert unit.Unit.SubState == b"running"
        main_pid = unit.Service.MainPID

    # The same state, seen from inside the container.
    assert probe.unit_properties(name.decode(), "ActiveState", "MainPID") == {
        "ActiveState": "active", "MainPID": str(main_pid)}
    assert "started" in records(probe, "b-2")


def test_per_instance_dropin_and_reload_change_stop_timeout(probe: Sandbox) -> None:
    from pystemd.dbuslib import DBusAddress
    from pystemd.systemd1 import Manager

    template_value = f"{STOP_TIMEOUT_SEC}s"
    probe.systemctl("start", "flexiq-probe@d-1.service")
    for instance in ("d-1", "d-2", "d-3"):
        assert probe.unit_property(f"flexiq-probe@{instance}.service",
                                   "TimeoutStopUSec") == template_value

    # A drop-in for one running instance, then `systemctl daemon-reload`.
    dropin = "/run/systemd/system/flexiq-probe@d-1.service.d/50-stop-timeout.conf"
    probe.write_file(dropin, "[Service]\nTimeoutStopSec=42\n")
    # A dash-prefix drop-in, which does not reach template instances.
    probe.write_file("/run/systemd/system/flexiq-probe@d-.service.d/50-stop-timeout.conf",
                     "[Service]\nTimeoutStopSec=77\n")
    probe.systemctl("daemon-reload")
    assert probe.unit_properties("flexiq-probe@d-1.service", "TimeoutStopUSec",
                                 "DropInPaths", "ActiveState") == {
        "TimeoutStopUSec": "42s", "DropInPaths": dropin, "ActiveState": "active"}
    assert probe.unit_property("flexiq-probe@d-2.service", "TimeoutStopUSec") == template_value

    # The same through Manager.Reload() over D-Bus, as the daemon does it.
    probe.write_file("/run/systemd/system/flexiq-probe@d-3.service.d/50-stop-timeout.conf",
                     "[Service]\nTimeoutStopSec=5min\n")
    with DBusAddress(probe.bus_address.encode()) as bus:
        manager = Manager(bus=bus)
        manager.load()
        manager.Manager.Reload()  # replies once the reload is complete
    assert probe.unit_property("flexiq-probe@d-3.service", "TimeoutStopUSec") == "5min"
    assert probe.unit_property("flexiq-probe@d-2.service", "TimeoutStopUSec") == template_value
    probe.run(["rm", "-rf", "/run/systemd/system/flexiq-probe@d-1.service.d",
               "/run/systemd/system/flexiq-probe@d-.service.d",
               "/run/systemd/system/flexiq-probe@d-3.service.d"])
    probe.systemctl("daemon-reload")


# -- teardown, which the session's own sandbox cannot show ------------------


def _leftovers(name: str, pid_ns: str) -> list[str]:
    """Processes, mounts and temporary directories of the sandbox ``name``.

    ``pid_ns`` is the container's pid namespace (``/proc/PID/ns/pid`` link):
    any live process still in it is a leftover, whatever its command line.
    Zombies are dead; the host's PID 1 reaps those orphaned to it.
    """
    found = glob.glob(os.path.join(tempfile.gettempdir(), f"{name}-*"))
    for proc in glob.glob("/proc/[0-9]*"):
        try:
            with open(f"{proc}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                    continue
            with open(f"{proc}/cmdline", "rb") as f:
                if name.encode() in f.read() or os.readlink(f"{proc}/ns/pid") == pid_ns:
                    found.append(f"{proc} ({_read(f'{proc}/comm').decode().strip()})")
        except OSError:
            pass  # gone while we looked
    with open("/proc/self/mountinfo") as mountinfo:
        found += [line for line in mountinfo if name in line]
    return found


@pytest.mark.slow
def test_teardown_leaves_nothing_behind(sandbox: Sandbox) -> None:
    with Sandbox() as second:
        assert second.name != sandbox.name
        assert second.run(["cat", "/proc/1/comm"]).stdout.strip() == "systemd"
        pid_ns = os.readlink(f"/proc/{second.leader}/ns/pid")
        assert _leftovers(second.name, pid_ns)  # the check does see a running one
    assert _leftovers(second.name, pid_ns) == []


@pytest.mark.slow
def test_teardown_of_a_hung_nspawn_kills_the_container_too(sandbox: Sandbox) -> None:
    hung = Sandbox(stop_timeout=0.5)
    hung.start()
    try:
        pid_ns = os.readlink(f"/proc/{hung.leader}/ns/pid")
        # A stopped nspawn ignores both SIGTERMs; only SIGKILL ends it. On its
        # own, that would leave the container running without it.
        os.kill(hung.nspawn_pid, signal.SIGSTOP)
    finally:
        hung.stop()
    assert _leftovers(hung.name, pid_ns) == []


@pytest.mark.slow
def test_failed_boot_reports_the_log_and_cleans_up(sandbox: Sandbox) -> None:
    doomed = Sandbox(boot_timeout=0.2)
    with pytest.raises(SandboxBootError, match="did not boot within 0.2 s") as caught:
        doomed.start()
    assert "tail of the nspawn log" in str(caught.value)
    assert doomed.nspawn_pid is None
    assert glob.glob(os.path.join(tempfile.gettempdir(), f"{doomed.name}-*")) == []
    assert not any(doomed.name.encode() in _read(cmdline)
                   for cmdline in glob.glob("/proc/[0-9]*/cmdline"))


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""
