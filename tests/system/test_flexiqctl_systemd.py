"""flexiqctl against flexiqd under the real systemd, on the real system bus with the installed policy."""

from __future__ import annotations

import json
import select
import subprocess
import time

import pytest

from .flexiqd_install import BIN, DAEMON, done_count, enqueue, install, marks, workers
from .sandbox import Sandbox

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


@pytest.fixture(scope="module")
def flexiqd(sandbox: Sandbox) -> Sandbox:
    install(sandbox)
    sandbox.wait_for(lambda: len(workers(sandbox)) == 1, 30, what="the minimum worker unit")
    sandbox.run("getent passwd operator1 >/dev/null || useradd --no-create-home --groups flexiq-admin operator1")
    yield sandbox
    sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*'; true", timeout=120)


def ctl(sbx: Sandbox, *args: str, as_user: list[str] | None = None):
    return sbx.run([*(as_user or []), str(BIN / "flexiqctl"), *args], check=False)


def test_status_json_for_root_and_for_an_unprivileged_user(flexiqd):
    def active_workers(user):
        result = ctl(flexiqd, "status", "--json", as_user=user)
        assert result.returncode == 0, result.stderr
        pools = json.loads(result.stdout)["pools"]
        pool = pools["default"] if isinstance(pools, dict) else pools[0]
        return pool["workers"]["active"]

    for user in (None, NOBODY):
        # The document is the daemon's last tick: poll until it has seen the worker.
        flexiqd.wait_for(lambda: active_workers(user) >= 1, 10, what="status to show the worker")


def test_only_root_and_the_flexiq_group_may_steer(flexiqd):
    for command in (["scale", "default", "2", "--for", "5s"], ["pause", "default"]):
        denied = ctl(flexiqd, *command, as_user=NOBODY)
        assert denied.returncode == 1 and "flexiq-admin group" in denied.stderr, denied.stderr
    member = ["setpriv", "--reuid=operator1", "--regid=operator1", "--init-groups"]
    allowed = ctl(flexiqd, "scale", "default", "2", "--for", "3s", as_user=member)
    assert allowed.returncode == 0, allowed.stderr
    flexiqd.wait_for(lambda: len(workers(flexiqd)) == 2, 30, what="the pinned second worker")


def test_pause_stops_claiming_without_killing_a_running_job(flexiqd):
    flexiqd.wait_for(lambda: len(workers(flexiqd)) == 1, 60, what="the pool back at one worker")
    enqueue(flexiqd, 3.0, 1)
    flexiqd.wait_for(lambda: sum(marks(flexiqd)[0].values()) >= 1, 30, what="the job to start")
    assert ctl(flexiqd, "pause", "default").returncode == 0
    before = done_count(flexiqd)
    enqueue(flexiqd, 0.1, 3)
    flexiqd.wait_for(lambda: done_count(flexiqd) == before + 1, 30, what="the running job to finish")
    time.sleep(1.5)  # a paused worker must leave these alone; nothing to poll for an absence
    assert done_count(flexiqd) == before + 1
    assert ctl(flexiqd, "resume", "default").returncode == 0
    flexiqd.wait_for(lambda: done_count(flexiqd) == before + 4, 30, what="the queued jobs after resume")


def test_events_follow_sees_a_scale_event_as_it_happens(flexiqd):
    follower = subprocess.Popen(
        ["nsenter", "-t", str(flexiqd.leader), "-a", "--", str(BIN / "flexiqctl"), "events", "--follow",
         "--since", str(2 ** 40)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1)  # let it subscribe before the event it must see
        # A count the pool does not have, so the pin is a change (an event).
        target = 5 if len(workers(flexiqd)) != 5 else 4
        assert ctl(flexiqd, "scale", "default", str(target), "--for", "2s").returncode == 0
        seen, deadline = [], time.monotonic() + 20
        while time.monotonic() < deadline:
            ready, _, _ = select.select([follower.stdout], [], [], 0.5)
            if ready:
                line = follower.stdout.readline()
                seen.append(line)
                if "Pinned" in line and f"-> {target}" in line:
                    break
        else:
            raise AssertionError(f"no Pinned event followed within 20 s; saw {seen}")
    finally:
        follower.terminate()
        follower.wait(10)


def test_status_shows_the_start_cost_measured_on_workers_started_for_a_burst(flexiqd):
    def start_cost():
        result = ctl(flexiqd, "status", "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)["pools"]["default"]["start_cost"]

    before = done_count(flexiqd)
    enqueue(flexiqd, 0.5, 60)  # a backlog the pool scales up for at once
    cost = flexiqd.wait_for(start_cost, 60, interval=0.5, what="a measured start cost in status")
    print(f"measured start cost: {cost}")  # recorded in docs by hand; not asserted on time
    assert 0 < cost["seconds"] < 60 and cost["samples"] >= 1
    assert cost["ready"] is not None and 0 < cost["ready"] < 60  # from systemd's own timestamps
    table = ctl(flexiqd, "status").stdout
    assert "to first claim (ready in " in table and "median of" in table
    starts = [line for line in flexiqd.journal(DAEMON).splitlines() if "claimed its first job" in line]
    print("\n".join(starts))
    assert starts  # each measured start is logged with its parts
    flexiqd.wait_for(lambda: done_count(flexiqd) == before + 60, 120, interval=0.5, what="the burst to finish")


def test_the_installed_policy_file_has_no_errors(flexiqd):
    log = flexiqd.run(["journalctl", "--no-pager", "-u", "dbus.service"]).stdout
    assert "org.flexiq.flexiqd1" not in log or "Encountered error" not in log
    assert "Encountered error" not in log


def test_a_daemon_that_is_not_running_is_exit_code_3_with_a_hint(flexiqd):
    flexiqd.systemctl("stop", DAEMON)
    try:
        result = ctl(flexiqd, "status")
        assert result.returncode == 3 and "systemctl start flexiqd" in result.stderr
    finally:
        flexiqd.systemctl("start", DAEMON)
