"""flexiqd's journal fields under the real systemd: found with `journalctl POOL=... MESSAGE_ID=...`.

One installed flexiqd goes through a scale-up that max_workers bounds, the SIGKILL
of a busy worker and a reload that is refused; each event is then looked up in
the sandbox's journal by its fields, the way an operator would.
"""

from __future__ import annotations

import json

from flexiqd.logs import MessageId

from .flexiqd_install import CONFIG, DAEMON, enqueue, install, marks, workers
from .sandbox import Sandbox

MAX_WORKERS = 3
JOURNAL_CONFIG = CONFIG.replace("max_workers: 6", f"max_workers: {MAX_WORKERS}")


def entries(sbx: Sandbox, *matches: str) -> list[dict]:
    """This run of the daemon's journal entries that match every ``FIELD=value`` (journalctl -o json).

    The sandbox is shared: the invocation id leaves out what earlier tests' daemons logged.
    """
    invocation = sbx.unit_property(DAEMON, "InvocationID")
    out = sbx.run(["journalctl", "--no-pager", "-o", "json", "-u", DAEMON, *matches,
                   "_SYSTEMD_INVOCATION_ID=" + invocation]).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def wait_for_entries(sbx: Sandbox, *matches: str, what: str) -> list[dict]:
    return sbx.wait_for(lambda: entries(sbx, *matches), 30, interval=0.3, what=what)


def test_scale_ups_caps_recoveries_and_refused_reloads_are_found_by_their_fields(sandbox: Sandbox):
    install(sandbox, JOURNAL_CONFIG)
    try:
        sandbox.wait_for(lambda: len(workers(sandbox)) == 1, 30, what="the minimum worker unit")
        enqueue(sandbox, 3.0, 60)

        # A scale-up, found by pool and id, with its fields and the text it always had.
        ups = wait_for_entries(sandbox, "POOL=default", "MESSAGE_ID=" + MessageId.SCALE_DECISION, "FROM=1",
                               what="a scale decision from 1 worker in the journal")
        up = ups[0]
        assert int(up["TO"]) > 1 and up["REASON"] and up["PRIORITY"] == "6"
        assert up["MESSAGE"].startswith(f"flexiqd.daemon.controller: default 1 -> {up['TO']}: {up['REASON']}: ")
        assert up["_SYSTEMD_UNIT"] == DAEMON and up["SYSLOG_IDENTIFIER"] == "flexiqd"
        assert entries(sandbox, "POOL=other", "MESSAGE_ID=" + MessageId.SCALE_DECISION) == []

        # 60 jobs of 3 s want more than max_workers: the cap that bounds the pool is logged.
        (capped, *_) = wait_for_entries(sandbox, "POOL=default", "MESSAGE_ID=" + MessageId.BINDING_CAP_CHANGED,
                                        "CAP=max", what="max_workers binding the pool")
        assert capped["CAP_WORKERS"] == str(MAX_WORKERS) and capped["PREVIOUS_CAP"] == "none"

        # A busy worker SIGKILLed: its jobs are released at once, under its unit's name.
        sandbox.wait_for(lambda: sum(marks(sandbox)[0].values()) >= 2, 30, what="jobs to start")
        unit = workers(sandbox)[0]
        pid = sandbox.unit_property(unit, "MainPID")
        sandbox.run(["kill", "-9", pid])
        (released,) = wait_for_entries(sandbox, "POOL=default", "UNIT=" + unit,
                                       "MESSAGE_ID=" + MessageId.DEAD_WORKER_JOBS_RELEASED,
                                       what=f"the release of {unit}'s jobs")
        assert released["WORKER_PID"] == pid and int(released["JOBS"]) >= 1
        assert released["PRIORITY"] == "4"
        assert f"released its {released['JOBS']} jobs" in released["MESSAGE"]
        # UNIT= is systemd's own field too: one query shows what both said about the worker.
        about = sandbox.run(["journalctl", "--no-pager", "-o", "json", "UNIT=" + unit]).stdout.splitlines()
        senders = {json.loads(line).get("_PID") for line in about}
        assert "1" in senders and released["_PID"] in senders

        # A reload that changes the store needs a restart: refused, with the file and why.
        sandbox.write_file("/etc/flexiqd/flexiqd.yaml",
                           JOURNAL_CONFIG.replace("/var/lib/flexiq/queue.db", "/var/lib/flexiq/other.db"))
        sandbox.systemctl("reload", DAEMON)
        (refused,) = wait_for_entries(sandbox, "MESSAGE_ID=" + MessageId.RELOAD_REFUSED,
                                      what="the refused reload in the journal")
        assert refused["CONFIG_FILE"] == "/etc/flexiqd/flexiqd.yaml" and "store" in refused["ERROR"]
        assert refused["PRIORITY"] == "3"

        # Each line went one way: no second copy through stderr's stream (which has no fields).
        text = [e["MESSAGE"] for e in entries(sandbox) if "Reload rejected" in e.get("MESSAGE", "")]
        assert len(text) == 1, text
    finally:
        sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*'; true", timeout=120)
