"""flexiqd as a unit under the real systemd: scaling, draining, crashes, restarts, reload, watchdog.

Each test installs and starts flexiqd afresh in the shared sandbox.  Waits poll
for a state with a deadline; counts of executions come from the tasks' own marks.
"""

from __future__ import annotations

import json
import time

import pytest

from .flexiqd_install import (BIN, CONFIG, DAEMON, REPO, STORE, done_count, enqueue, install, main_pids,
                              marks, stats, workers)
from .sandbox import Sandbox

# The daemon's root-only state directory (events, operators' intent), as the package sets it up.
STATE_DROPIN = "[Service]\nStateDirectory=flexiqd\nStateDirectoryMode=0700\n"


def ctl(sbx: Sandbox, *args: str):
    return sbx.run([str(BIN / "flexiqctl"), *args])


def crash(sbx: Sandbox, unit: str) -> None:
    """SIGKILL a worker's main process, as the OOM killer would.

    (Not `systemctl kill --signal=KILL`: on systemd 252 it now and then fails with
    "Failed to send signal SIGKILL to auxiliary processes: Input/output error".)
    """
    sbx.run(["kill", "-9", sbx.unit_property(unit, "MainPID")])


def stop_everything(sbx: Sandbox) -> None:
    sbx.run(f"systemctl stop {DAEMON} 'flexiq-worker@*'; rm -rf /var/lib/flexiqd; true", timeout=120)


@pytest.fixture
def flexiqd(sandbox: Sandbox) -> Sandbox:
    install(sandbox)
    sandbox.wait_for(lambda: len(workers(sandbox)) == 1, 30, what="the minimum worker unit")
    yield sandbox
    sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*'; true", timeout=120)


def test_ready_only_after_the_fleet_is_adopted_and_status_says_so(flexiqd):
    props = flexiqd.unit_properties(DAEMON, "Type", "ActiveState", "StatusText", "NotifyAccess")
    assert props["Type"] == "notify" and props["ActiveState"] == "active"
    flexiqd.wait_for(lambda: flexiqd.unit_property(DAEMON, "StatusText").startswith("default 1/6 age"),
                     10, what="a STATUS= summary line")
    assert workers(flexiqd) == ["flexiq-worker@default-1.service"]
    assert flexiqd.unit_property("flexiq-worker@default-1.service", "User") == "flexiq"


def test_a_burst_scales_up_then_drains_back_with_every_job_run_exactly_once(flexiqd):
    enqueue(flexiqd, 1.0, 60)
    flexiqd.wait_for(lambda: len(workers(flexiqd)) >= 3, 30, what="a scale-up to 3+ worker units")
    flexiqd.wait_for(lambda: done_count(flexiqd) == 60, 120, interval=0.5, what="all 60 jobs to finish")
    flexiqd.wait_for(lambda: len(workers(flexiqd)) == 1, 240, interval=0.5, what="the drain back to 1 worker")
    starts, ends = marks(flexiqd)
    assert len(starts) == 60 and set(starts.values()) == {1} and set(ends.values()) == {1}
    journal = flexiqd.journal(DAEMON)
    assert "default 1 -> " in journal and "-> 1: " in journal  # each change logged with its rationale


def test_scale_in_mid_job_drains_without_duplicates_or_losses(flexiqd):
    enqueue(flexiqd, 3.0, 12)  # long enough that scale-in happens while jobs run
    flexiqd.wait_for(lambda: len(workers(flexiqd)) >= 3, 30, what="a scale-up")
    flexiqd.wait_for(lambda: done_count(flexiqd) == 12, 120, interval=0.5, what="all 12 jobs to finish")
    flexiqd.wait_for(lambda: len(workers(flexiqd)) == 1, 240, interval=0.5, what="the scale-in")
    starts, ends = marks(flexiqd)
    assert len(starts) == 12 and set(starts.values()) == {1} and set(ends.values()) == {1}


def test_a_worker_killed_with_sigkill_has_its_job_released_and_run_again_once(flexiqd):
    enqueue(flexiqd, 2.0, 1)
    flexiqd.wait_for(lambda: sum(marks(flexiqd)[0].values()) == 1, 30, what="the job to start")
    unit = workers(flexiqd)[0]
    crash(flexiqd, unit)
    # Leases last 30 s: a finish well within that proves the daemon released the job on the death.
    flexiqd.wait_for(lambda: done_count(flexiqd) == 1, 20, interval=0.3, what="the job to run again")
    starts, ends = marks(flexiqd)
    (job_id,) = starts
    assert starts[job_id] == 2 and ends[job_id] == 1
    assert "released its 1 jobs" in flexiqd.journal(DAEMON)


@pytest.mark.parametrize("how", ["systemctl restart", "kill -9"])
def test_the_daemon_restarting_leaves_workers_running_and_adopts_them(flexiqd, how):
    enqueue(flexiqd, 4.0, 6)
    flexiqd.wait_for(lambda: len(workers(flexiqd)) >= 2, 30, what="a scale-up")
    before = main_pids(flexiqd, workers(flexiqd))
    daemon_pid = flexiqd.unit_property(DAEMON, "MainPID")
    if how == "kill -9":
        flexiqd.run(["kill", "-9", daemon_pid])
    else:
        flexiqd.systemctl("restart", DAEMON)
    flexiqd.wait_for(lambda: flexiqd.unit_property(DAEMON, "MainPID") not in ("0", daemon_pid)
                     and flexiqd.unit_property(DAEMON, "ActiveState") == "active", 30,
                     what="a new daemon process")
    after = main_pids(flexiqd, list(before))
    # Each worker runs on in the same process; under load one may have finished its jobs and
    # been scaled in by the new daemon meanwhile (pid 0), but none may have a new process.
    restarted = {unit: pid for unit, pid in after.items() if pid not in (before[unit], "0")}
    assert not restarted, f"a worker was restarted along with the daemon: {restarted} (was {before})"
    assert any(after[unit] == before[unit] for unit in before), "no worker outlived the daemon's restart"
    flexiqd.wait_for(lambda: done_count(flexiqd) == 6, 60, interval=0.5, what="all jobs to finish")
    starts, ends = marks(flexiqd)
    assert len(starts) == 6 and set(starts.values()) == {1} and set(ends.values()) == {1}


def test_stopping_the_daemon_drains_and_stops_the_fleet(flexiqd):
    enqueue(flexiqd, 2.0, 4)
    flexiqd.wait_for(lambda: sum(marks(flexiqd)[0].values()) >= 2, 30, what="jobs to start")
    flexiqd.systemctl("stop", DAEMON)
    flexiqd.wait_for(lambda: workers(flexiqd, "active,activating,deactivating") == [], 60,
                     what="every worker unit to stop")
    starts, ends = marks(flexiqd)
    assert starts == ends, "a running job was cut short instead of drained"
    assert all(n == 1 for n in starts.values())
    state = stats(flexiqd)
    assert state["running"] == 0 and state["runnable"] + done_count(flexiqd) == 4  # nothing lost


def test_a_broken_reload_keeps_the_old_config_and_says_why(flexiqd):
    flexiqd.write_file("/etc/flexiqd/flexiqd.yaml", CONFIG + "    max_wrkers: 3\n")
    flexiqd.systemctl("reload", DAEMON)
    flexiqd.wait_for(lambda: "config rejected" in flexiqd.unit_property(DAEMON, "StatusText"), 10,
                     what="STATUS= to report the rejected config")
    status = flexiqd.unit_property(DAEMON, "StatusText")
    assert "did you mean 'max_workers'" in status
    assert flexiqd.unit_property(DAEMON, "ActiveState") == "active"
    assert "Reload rejected" in flexiqd.journal(DAEMON)


def test_a_reload_adding_a_pool_starts_its_workers(flexiqd):
    extra = ("  second:\n    app: counting_app:queue\n    queues: [second]\n    min_workers: 2\n"
             f"    environment: {{PYTHONPATH: {REPO / 'tests' / 'apps'}}}\n")
    flexiqd.write_file("/etc/flexiqd/flexiqd.yaml", CONFIG + extra)
    flexiqd.systemctl("reload", DAEMON)
    flexiqd.wait_for(lambda: [w for w in workers(flexiqd) if "@second-" in w] ==
                     ["flexiq-worker@second-1.service", "flexiq-worker@second-2.service"], 30,
                     what="the new pool's two workers")


def test_the_watchdog_restarts_a_hung_daemon(sandbox: Sandbox):
    install(sandbox, daemon_dropin="[Service]\nWatchdogSec=3s\n")
    sandbox.wait_for(lambda: len(workers(sandbox)) == 1, 30, what="the minimum worker unit")
    pid = sandbox.unit_property(DAEMON, "MainPID")
    sandbox.run(["kill", "-STOP", pid])  # the loop stops pinging: a hang, as systemd sees it
    sandbox.wait_for(lambda: sandbox.unit_property(DAEMON, "NRestarts") != "0", 30,
                     what="systemd to restart the daemon on its watchdog")
    assert "watchdog" in sandbox.journal(DAEMON).lower()
    sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*'; true", timeout=120)


HOSTILE = "x\\nExecStartPre=/bin/sh -c 'touch /run/pwned' %h $HOME \\\"q\\\" \\\\"


def environ_of(sbx: Sandbox, pid: str) -> dict[str, str]:
    raw = sbx.run(f"tr '\\0' '\\36' </proc/{pid}/environ").stdout
    return dict(item.split("=", 1) for item in raw.split("\x1e") if "=" in item)


def test_per_pool_settings_reach_the_worker_units_and_a_reload_reaches_running_ones(sandbox: Sandbox):
    sandbox.write_file("/etc/flexiqd/test.secret", "s3cret\n", mode=0o600)
    config = CONFIG.replace("    drain_timeout: 20s\n",
                            "    drain_timeout: 45s\n    resources: {memory_max: 300M, cpu_weight: 250}\n"
                            "    credentials: {db_password: /etc/flexiqd/test.secret}\n")
    config = config.replace("      FLEXIQ_TEST_MARKS:", f'      EVIL: "{HOSTILE}"\n      FLEXIQ_TEST_MARKS:')
    install(sandbox, config)
    unit = "flexiq-worker@default-1.service"
    sandbox.wait_for(lambda: workers(sandbox) == [unit], 30, what="the minimum worker unit")
    props = sandbox.unit_properties(unit, "TimeoutStopUSec", "MemoryMax", "CPUWeight", "KillMode",
                                    "ExecStartPre", "MainPID")
    assert props["TimeoutStopUSec"] == "55s"          # drain budget + STOP_GRACE, from the runtime drop-in
    assert props["MemoryMax"] == str(300 * 1024 ** 2)  # through SetUnitProperties
    assert props["CPUWeight"] == "250"
    assert props["KillMode"] == "mixed"
    # A hostile value is one variable, exactly as configured: no directive added, no specifier expanded.
    assert props["ExecStartPre"] == ""
    environment = environ_of(sandbox, props["MainPID"])
    assert environment["EVIL"] == "x\nExecStartPre=/bin/sh -c 'touch /run/pwned' %h $HOME \"q\" \\"
    assert environment["FLEXIQ_TEST_MARKS"] == "/var/lib/flexiq/marks"
    assert sandbox.run("test -e /run/pwned", check=False).returncode != 0
    # The secret reaches this unit as a credential, not through its environment.
    assert sandbox.run(f"cat /run/credentials/{unit}/db_password").stdout == "s3cret\n"
    assert "s3cret" not in "".join(environment.values())

    sandbox.write_file("/etc/flexiqd/flexiqd.yaml", config.replace("drain_timeout: 45s", "drain_timeout: 50s")
                       .replace("memory_max: 300M, cpu_weight: 250", "memory_max: 400M"))
    sandbox.systemctl("reload", DAEMON)
    sandbox.wait_for(lambda: sandbox.unit_property(unit, "TimeoutStopUSec") == "1min", 10,
                     what="the running worker's stop timeout to follow the reload")
    after = sandbox.unit_properties(unit, "MemoryMax", "CPUWeight", "MainPID")
    assert after == {"MemoryMax": str(400 * 1024 ** 2), "CPUWeight": "[not set]", "MainPID": props["MainPID"]}
    stop_everything(sandbox)


def test_a_worker_crash_is_seen_from_systemds_signals_not_at_the_next_tick(sandbox: Sandbox):
    # With a 30 s tick only the unit's PropertiesChanged/JobRemoved signals can wake the
    # daemon in time: the job of the killed worker must be released long before the tick.
    install(sandbox, CONFIG.replace("tick: 500ms", "tick: 30s"))
    sandbox.wait_for(lambda: len(workers(sandbox)) == 1, 30, what="the minimum worker unit")
    enqueue(sandbox, 20.0, 1)
    sandbox.wait_for(lambda: sum(marks(sandbox)[0].values()) == 1, 30, what="the job to start")
    crash(sandbox, workers(sandbox)[0])
    sandbox.wait_for(lambda: "released its 1 jobs" in sandbox.journal(DAEMON), 15, interval=0.2,
                     what="the daemon to release the dead worker's job (a tick is 30 s away)")
    sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*'; true", timeout=120)


def test_flexiq_autoscale_drives_worker_units_on_a_systemd_host(sandbox: Sandbox):
    # flexiq's interface on a host without flexiqd running: the same units, sized by flexiq's formula.
    install(sandbox)
    sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*'; true", timeout=120)
    command = [str(REPO / ".venv" / "bin" / "flexiq"), "--url", "sqlite:////var/lib/flexiq/queue.db",
               "autoscale", "--app", "counting_app:queue", "--fleet", "systemd", "--min-workers", "2",
               "--max-workers", "4", "--poll-interval", "0.5", "--pool", "compat"]
    sandbox.run(["systemd-run", "--unit", "flexiq-autoscale", "--property", "KillMode=mixed",
                 "--setenv", f"PYTHONPATH={REPO / 'tests' / 'apps'}", *command])
    try:
        sandbox.wait_for(lambda: workers(sandbox) == ["flexiq-worker@compat-1.service",
                                                      "flexiq-worker@compat-2.service"], 30,
                         what="the autoscaler's two worker units")
    finally:
        sandbox.run(["systemctl", "stop", "flexiq-autoscale"], timeout=120)
    sandbox.wait_for(lambda: workers(sandbox, "active,activating,deactivating") == [], 60,
                     what="the autoscaler to stop its workers when it stops")


def test_an_invalid_config_at_start_fails_once_with_the_reason_and_is_not_restarted(sandbox: Sandbox):
    install(sandbox)
    sandbox.systemctl("stop", DAEMON)
    sandbox.write_file("/etc/flexiqd/flexiqd.yaml", CONFIG + "    max_wrkers: 3\n")
    assert sandbox.systemctl("start", DAEMON, check=False).returncode != 0
    props = sandbox.unit_properties(DAEMON, "ActiveState", "ExecMainStatus", "NRestarts", "StatusText")
    assert props["ActiveState"] == "failed" and props["ExecMainStatus"] == "78"
    assert props["NRestarts"] == "0"
    assert "did you mean 'max_workers'" in sandbox.journal(DAEMON)
    sandbox.run(f"systemctl stop 'flexiq-worker@*'; systemctl reset-failed {DAEMON}; true", timeout=120)


def test_workers_start_with_the_applied_config_not_an_unreloaded_edit(flexiqd):
    unit = workers(flexiqd)[0]
    assert "FLEXIQD_CONFIG=/run/flexiqd/applied.yaml" in flexiqd.unit_property(unit, "Environment")
    flexiqd.write_file("/etc/flexiqd/flexiqd.yaml", CONFIG + "    max_wrkers: 3\n")  # not reloaded
    old_pid = flexiqd.unit_property(unit, "MainPID")
    crash(flexiqd, unit)  # systemd restarts it (Restart=on-failure)
    flexiqd.wait_for(lambda: flexiqd.unit_property(unit, "MainPID") not in ("0", old_pid)
                     and flexiqd.unit_property(unit, "ActiveState") == "active", 30,
                     what="the worker to come back with the config in force")
    enqueue(flexiqd, 0.1, 1)
    flexiqd.wait_for(lambda: done_count(flexiqd) == 1, 30, what="the restarted worker to run a job")


def test_a_tick_longer_than_the_watchdog_period_does_not_get_the_daemon_killed(sandbox: Sandbox):
    install(sandbox, CONFIG.replace("tick: 500ms", "tick: 40s"), daemon_dropin="[Service]\nWatchdogSec=3s\n")
    sandbox.wait_for(lambda: len(workers(sandbox)) == 1, 30, what="the minimum worker unit")
    pid = sandbox.unit_property(DAEMON, "MainPID")
    started = time.monotonic()
    # Four watchdog periods without a tick: a daemon that pinged once per tick is restarted by now.
    sandbox.wait_for(lambda: sandbox.unit_property(DAEMON, "NRestarts") != "0" or time.monotonic() - started > 12,
                     30, what="four watchdog periods to pass")
    assert sandbox.unit_properties(DAEMON, "NRestarts", "MainPID", "ActiveState") == \
        {"NRestarts": "0", "MainPID": pid, "ActiveState": "active"}
    stop_everything(sandbox)


def test_a_tick_blocked_on_a_locked_store_shows_in_status_and_is_not_a_restart(sandbox: Sandbox):
    locked_store = f"{STORE}?busy_timeout=60"
    # A drain of 1 s: the job runs 30 s, and once it runs again the test is done with it;
    # the stop at the end need not wait for it.
    install(sandbox, CONFIG.replace(f"store: {STORE}", f"store: {locked_store}")
            .replace("drain_timeout: 20s", "drain_timeout: 1s"),
            daemon_dropin="[Service]\nWatchdogSec=3s\n")
    sandbox.wait_for(lambda: len(workers(sandbox)) == 1, 30, what="the minimum worker unit")
    pid = sandbox.unit_property(DAEMON, "MainPID")
    enqueue(sandbox, 30.0, 1)
    sandbox.wait_for(lambda: sum(marks(sandbox)[0].values()) == 1, 30, what="the job to start")
    # Another process holds the store's write lock for 12 s (four watchdog periods).
    locker = ("import sqlite3, time; c = sqlite3.connect('/var/lib/flexiq/queue.db', isolation_level=None, "
              "timeout=30); c.execute('BEGIN IMMEDIATE'); open('/run/flexiq-locked', 'w').close(); time.sleep(12)")
    sandbox.run(["rm", "-f", "/run/flexiq-locked"])
    sandbox.run(["systemd-run", "--unit", "flexiq-test-locker", "--collect", "python3", "-c", locker])
    sandbox.wait_for(lambda: sandbox.run("test -e /run/flexiq-locked", check=False).returncode == 0, 10,
                     what="the store to be locked")
    # The worker dies: releasing its job needs the store, and the tick blocks on the lock.
    crash(sandbox, workers(sandbox)[0])
    status = sandbox.wait_for(
        lambda: (lambda text: text if "tick blocked" in text and int(text.split()[2].rstrip("s")) >= 6 else None)(
            sandbox.unit_property(DAEMON, "StatusText")), 20, interval=0.5,
        what="STATUS= to show a tick blocked for two watchdog periods")
    assert "releasing the jobs of dead worker default-1" in status
    sandbox.wait_for(lambda: done_count(sandbox) == 1 or sum(marks(sandbox)[0].values()) == 2, 60,
                     what="the job to run again once the lock is gone")
    assert sandbox.unit_properties(DAEMON, "NRestarts", "MainPID") == {"NRestarts": "0", "MainPID": pid}
    stop_everything(sandbox)


SLOW_APP = "import time\ntime.sleep(4)  # a slow import: the worker is starting for 4 s\nfrom counting_app import queue\n"


def test_pausing_or_stopping_a_starting_worker_does_not_kill_it(sandbox: Sandbox):
    sandbox.write_file("/usr/local/lib/flexiq-test/slow_app.py", SLOW_APP)
    config = (CONFIG.replace("app: counting_app:queue", "app: slow_app:queue")
              .replace(f"PYTHONPATH: {REPO / 'tests' / 'apps'}",
                       f"PYTHONPATH: /usr/local/lib/flexiq-test:{REPO / 'tests' / 'apps'}"))
    install(sandbox, config)
    first = "flexiq-worker@default-1.service"
    sandbox.wait_for(lambda: sandbox.unit_property(first, "ActiveState") == "activating", 10,
                     what="the first worker to be starting")
    ctl(sandbox, "pause", "default")
    sandbox.wait_for(lambda: workers(sandbox) == [first], 30, what="the first worker to become ready")
    sandbox.wait_for(lambda: "paused: claiming no new jobs" in sandbox.journal(first), 10,
                     what="the worker to be paused once ready")
    assert sandbox.unit_property(first, "NRestarts") == "0"
    ctl(sandbox, "resume", "default")

    second = "flexiq-worker@default-2.service"
    ctl(sandbox, "scale", "default", "2")
    sandbox.wait_for(lambda: sandbox.unit_property(second, "ActiveState") == "activating", 10,
                     what="a second worker to be starting")
    ctl(sandbox, "scale", "default", "1")  # the starting one is the first to go
    sandbox.wait_for(lambda: sandbox.unit_property(second, "ActiveState") in ("inactive", "failed"), 30,
                     what="the starting worker to stop")
    assert sandbox.unit_properties(second, "ActiveState", "Result") == {"ActiveState": "inactive", "Result": "success"}
    assert workers(sandbox, "failed") == []
    stop_everything(sandbox)


def test_a_drain_and_a_pause_survive_a_restart_of_the_daemon(sandbox: Sandbox):
    sandbox.run("rm -rf /var/lib/flexiqd")
    install(sandbox, CONFIG + "  mail:\n    app: counting_app:queue\n    queues: [mail]\n    min_workers: 1\n"
                     f"    environment: {{PYTHONPATH: {REPO / 'tests' / 'apps'}}}\n", daemon_dropin=STATE_DROPIN)
    sandbox.wait_for(lambda: len(workers(sandbox)) == 2, 30, what="one worker per pool")
    ctl(sandbox, "drain", "default")
    ctl(sandbox, "pause", "mail")
    sandbox.wait_for(lambda: workers(sandbox) == ["flexiq-worker@mail-1.service"], 60, what="the drain")
    assert sandbox.run("stat -c '%a %U' /run/flexiqd/paused.json /run/flexiqd/applied.yaml "
                       "/var/lib/flexiqd/intent.json /var/lib/flexiqd/history.json").stdout.split("\n")[:4] == [
        "640 root", "640 root", "600 root", "600 root"]
    drained = json.loads(sandbox.run("cat /var/lib/flexiqd/history.json").stdout)["pools"]["default"]
    assert drained["changes"][-1][1] == -1  # the drain entered the pool's history as a change
    assert json.loads(sandbox.run("cat /run/flexiqd/paused.json").stdout) == {"paused": ["mail"]}
    mail = "flexiq-worker@mail-1.service"
    assert "FLEXIQD_PAUSED_FILE=/run/flexiqd/paused.json" in sandbox.unit_property(mail, "Environment")

    old = sandbox.unit_property(DAEMON, "MainPID")
    sandbox.systemctl("restart", DAEMON)
    sandbox.wait_for(lambda: sandbox.unit_property(DAEMON, "MainPID") not in ("0", old)
                     and sandbox.unit_property(DAEMON, "ActiveState") == "active", 30, what="a new daemon")
    # READY=1 comes after the first tick: a forgotten drain would show a starting worker here.
    assert sandbox.unit_property(DAEMON, "StatusText").startswith("default 0/6")
    document = json.loads(ctl(sandbox, "status", "--json").stdout)
    assert document["pools"]["default"]["pinned"] == {"workers": 0, "until": None}
    assert document["pools"]["mail"]["paused"] is True
    assert "keeping the operator's pin at 0 workers" in sandbox.journal(DAEMON)
    assert "Keeping the decision history of pools default, mail from before the restart" in sandbox.journal(DAEMON)
    ctl(sandbox, "unpin", "default")
    ctl(sandbox, "resume", "mail")
    stop_everything(sandbox)


def test_a_reload_that_changes_the_store_is_refused_and_says_it_takes_a_restart(flexiqd):
    flexiqd.write_file("/etc/flexiqd/flexiqd.yaml", CONFIG.replace(STORE, "sqlite:////var/lib/flexiq/other.db"))
    flexiqd.systemctl("reload", DAEMON)
    flexiqd.wait_for(lambda: "config rejected" in flexiqd.unit_property(DAEMON, "StatusText"), 10,
                     what="STATUS= to report the refused reload")
    assert "'store' changed" in flexiqd.unit_property(DAEMON, "StatusText")
    assert "takes a restart" in flexiqd.unit_property(DAEMON, "StatusText")
    enqueue(flexiqd, 0.1, 1)  # still served from the store in force
    flexiqd.wait_for(lambda: done_count(flexiqd) == 1, 30, what="a job on the old store to run")
