"""A schedule under flexiqd.service and the real systemd: it fires every second, the daemon is
SIGKILLed and systemd restarts it, and every slot's job is in the store exactly once;
flexiqctl shows the schedule, and the journal has its slots by their fields."""

from __future__ import annotations

import json
import math
import time
from datetime import datetime, timezone

from flexiqd.config.model import slot_key
from flexiqd.logs import MessageId

from .flexiqd_install import BIN, CONFIG, DAEMON, STORE, install
from .sandbox import Sandbox

SCHEDULE_CONFIG = CONFIG + """schedules:
  tick: {task: count, args: [0.01], cron: "* * * * * *"}
  nightly: {task: count, args: [0], cron: "30 2 * * *", timezone: America/New_York, queue: reports}
"""
KILLS = 3

COUNT_SLOTS = (
    "import collections, json\n"
    "from flexiqd.queue import open_backend\n"
    f"backend = open_backend({STORE!r})\n"
    "keys = [job.idempotency_key for job in backend.list_jobs(task='count', limit=100000) if job.idempotency_key]\n"
    "print(json.dumps(collections.Counter(keys)))\n")


def jobs_per_slot(sbx: Sandbox) -> dict[str, int]:
    return json.loads(sbx.run([str(BIN / "python"), "-c", COUNT_SLOTS]).stdout)


def ctl(sbx: Sandbox, *args: str):
    return sbx.run([str(BIN / "flexiqctl"), *args], check=False)


def test_a_schedule_fires_once_per_slot_under_systemd_through_daemon_kills(sandbox: Sandbox):
    install(sandbox, SCHEDULE_CONFIG)
    try:
        sandbox.wait_for(lambda: len(jobs_per_slot(sandbox)) >= 3, 60, what="the schedule's first slots")
        for _ in range(KILLS):
            before = sandbox.unit_property(DAEMON, "MainPID")
            sandbox.run(["systemctl", "kill", "--kill-who=main", "--signal=KILL", DAEMON])
            sandbox.wait_for(lambda: sandbox.unit_property(DAEMON, "MainPID") not in ("0", before)
                             and sandbox.unit_property(DAEMON, "ActiveState") == "active", 60,
                             what="systemd to restart the killed flexiqd")
        end = math.ceil(time.time()) + 1
        sandbox.wait_for(lambda: slot_key("tick", end) in jobs_per_slot(sandbox), 60, what="the slot after the kills")

        listed = ctl(sandbox, "schedules")
        assert listed.returncode == 0, listed.stderr
        assert "schedule tick" in listed.stdout and "schedule nightly" in listed.stdout
        assert "'30 2 * * *' in America/New_York" in listed.stdout and "fired, job" in listed.stdout
        status = ctl(sandbox, "status")
        assert "next fire" in status.stdout and "tick to queue default" in status.stdout, status.stdout
        invocation = sandbox.unit_property(DAEMON, "InvocationID")
        fired = sandbox.run(["journalctl", "--no-pager", "-o", "json", "-u", DAEMON, "SCHEDULE=tick",
                             "MESSAGE_ID=" + MessageId.SCHEDULE_FIRED, "_SYSTEMD_INVOCATION_ID=" + invocation]).stdout
        entry = json.loads(fired.splitlines()[0])
        assert entry["KIND"] == "slot" and entry["QUEUE"] == "default" and int(entry["JOB_ID"]) > 0
    finally:
        sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*'; true", timeout=120)
    counts = {key: n for key, n in jobs_per_slot(sandbox).items() if key.startswith("schedule:tick:")}
    stamps = sorted(counts)
    start = int(datetime.strptime(stamps[0].split(":", 2)[2], "%Y-%m-%dT%H:%M:%SZ")
                .replace(tzinfo=timezone.utc).timestamp())
    expected = [slot_key("tick", t) for t in range(start, end + 1)]
    print(f"\n{KILLS} SIGKILLs of flexiqd.service over {len(expected)} slots: {sum(counts.values())} jobs, "
          f"{sum(1 for n in counts.values() if n > 1)} slots twice, {len(set(expected) - set(counts))} missing")
    assert stamps[: len(expected)] == expected and set(counts.values()) == {1}
