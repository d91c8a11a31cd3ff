"""Fault: the PostgreSQL server restarts in the middle of a drain (issue 24, fault 1).

A real flexiqd with real worker units on the sandbox's PostgreSQL, under a steady
load of jobs that record their own executions.  A scale-in (an operator's pin to
one worker, for a few seconds) is under way -- busy workers paused, retiring --
when the server goes down: a fast shutdown (``pg_ctl stop -m fast``) or a crash
(``-m immediate``), for 1 s and then for 15 s, in one run per mode.

What must hold, and what is measured (printed; ``pytest -s``):
- no job lost: every job an enqueue reported ends done, having run to its end;
- re-runs only by workers whose execution was cut (the lease fence ends a worker
  whose leases go unconfirmed), at most ``RERUN_BOUND`` each, never two at once;
- the daemon holds the pool while it cannot read the queue: no scale decision
  while the server is down; it never restarts, and says what is wrong in STATUS=
  and ``flexiqctl status``;
- no worker crash-loops into systemd's start limit, none ends failed;
- an enqueue during the outage fails with one line naming the database, no traceback;
- the time from the server's return to the first job completed again (measured).
"""

from __future__ import annotations

import json
import time

import pytest

from .faults import (RERUN_BOUND, Load, Watch, config, completed_jobs, cut_workers, executions,
                     journal_entries, start_limit_hits, wait_all_done, worker_restarts)
from .executions import judge
from .flexiqd_install import BIN, DAEMON, install, workers
from .sandbox import Sandbox
from .sandbox_postgres import DATABASE, PASSWORD, start_postgres

SECRET = "/etc/flexiqd/db.password"
STORE_URL = f"postgresql://flexiq@127.0.0.1:5432/{DATABASE}?password_credential=flexiq-db"
CLI_URL = f"postgresql://flexiq@127.0.0.1:5432/{DATABASE}?password_file={SECRET}"
PG_UNIT = "postgresql@15-main"
PG_DATA = "/var/lib/postgresql/15/main"

CONFIG = config(STORE_URL, max_workers=4, pool_extra=f"    credentials: {{flexiq-db: {SECRET}}}\n")

# Every 0.5 s: short jobs for volume, and a long one so the retiring workers still run work
# when the server goes.
BATCH = ((6, 0.2), (1, 5.0))
# The long outage outlasts all a worker's restart could run into: the fence (one heartbeat,
# 2 s), a host taken for dead (two), and systemd's start limit (5 starts in 10 s, RestartSec=1s)
# that a worker exiting on a down server used to hit.
OUTAGES = (1.0, 15.0)


def _sql(sbx: Sandbox, query: str) -> str:
    return sbx.run(["runuser", "-u", "postgres", "--", "psql", "-d", DATABASE, "-At", "-c", query]).stdout.strip()


def _states(sbx: Sandbox) -> dict[str, int]:
    rows = _sql(sbx, "SELECT state, count(*) FROM flexiq_jobs GROUP BY state")
    return {state: int(n) for state, n in (line.split("|") for line in rows.splitlines() if line)}


def _first_completion_after(sbx: Sandbox, back: float) -> float:
    """Seconds from ``back`` to the first job the store records done after it."""
    def found():
        value = _sql(sbx, f"SELECT min(finished_at) FROM flexiq_jobs WHERE state = 'done' AND finished_at >= {back}")
        return float(value) if value else None
    return sbx.wait_for(found, 120, interval=0.05, what="a job completed after the server's return") - back


def _outage(sbx: Sandbox, mode: str, seconds: float) -> dict:
    """Pin the pool down (a drain under way), then stop the server for ``seconds`` and start it."""
    pinned_at = time.time()
    sbx.run([str(BIN / "flexiqctl"), "scale", "default", "1", "--for", "3s"])
    sbx.wait_for(lambda: any(e.get("REASON") == "Pinned" for e in journal_entries(sbx, DAEMON, since=pinned_at)),
                 10, interval=0.1, what="the scale-in to begin: busy workers paused, retiring")
    watch = Watch(sbx)
    watch.start()
    stop_at = time.time()
    sbx.run(["runuser", "-u", "postgres", "--", "/usr/lib/postgresql/15/bin/pg_ctl", "-D", PG_DATA,
             "stop", "-m", mode, "-w", "-t", "60"], timeout=90)
    down_at = time.time()
    time.sleep(seconds)
    start_at = time.time()
    sbx.run(f"systemctl reset-failed {PG_UNIT} 2>/dev/null; systemctl start {PG_UNIT}", timeout=120)
    back_at = time.time()
    again = _first_completion_after(sbx, back_at)
    time.sleep(2)
    watch.stop()
    return {"mode": mode, "down_for": seconds, "stop_at": stop_at, "down_at": down_at, "start_at": start_at, "back_at": back_at,
            "seconds_to_complete_again": round(again, 2), "status_seen": watch.status,
            "flexiqctl_seen": watch.flexiqctl, "workers_seen": watch.workers}


@pytest.fixture
def postgres(sandbox: Sandbox):
    start_postgres(sandbox)
    sandbox.write_file(SECRET, PASSWORD + "\n", mode=0o600)
    yield sandbox
    sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*' 2>/dev/null; true", timeout=120)
    sandbox.run(f"systemctl start {PG_UNIT}", check=False, timeout=120)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_postgresql_restart_mid_drain_loses_nothing_and_the_pool_holds(postgres: Sandbox, mode: str):
    sbx = postgres
    began = time.time()  # the session's journal holds other tests' workers too
    install(sbx, CONFIG, daemon_dropin=f"[Service]\nLoadCredential=flexiq-db:{SECRET}\n")
    sbx.wait_for(lambda: workers(sbx), 30, what="the minimum worker")
    daemon_pid = sbx.unit_property(DAEMON, "MainPID")
    load = Load(sbx, CLI_URL, BATCH, every=0.5)
    load.enqueue(200, 0.2)  # a backlog: the pool grows before the first scale-in
    load.start()
    outages = []
    try:
        for seconds in OUTAGES:
            sbx.wait_for(lambda: len(workers(sbx)) >= 3, 60, interval=0.5, what="the pool to grow to 3 or more")
            outages.append(_outage(sbx, mode, seconds))
    finally:
        load.stop()
    total = len(load.enqueues.ids)
    states = wait_all_done(sbx, lambda: _states(sbx), total, 240)
    runs = executions(sbx)
    workers_journal = journal_entries(sbx, "flexiq-worker@*", since=began)
    affected = cut_workers(workers_journal)
    reruns = judge(runs, affected)
    daemon_journal = journal_entries(sbx, DAEMON, since=began)
    decisions = [e for e in daemon_journal if "FROM" in e and "TO" in e]
    held = {}
    for outage in outages:
        # An operator's pin steers the pool whatever the figures; the policy's own decisions must hold.
        during = [f'{e["FROM"]}->{e["TO"]} {e.get("REASON")}' for e in decisions
                  if outage["down_at"] <= e["at"] <= outage["start_at"] and e.get("REASON") != "Pinned"]
        held[outage["down_for"]] = during
        # A worker cut by this outage: its fence fired after this stop and before the next one.
        later = [o["stop_at"] for o in outages if o["stop_at"] > outage["stop_at"]]
        cut = [pid for pid, at in affected.items() if outage["stop_at"] <= at < min(later, default=float("inf"))]
        outage["workers_cut"] = len(cut)
        outage["jobs_run_twice"] = sum(reruns.duplicated_by_crash.get(pid, 0) for pid in cut)
    report = {
        "mode": mode, "jobs": total, "states": states, "executions": len(runs),
        "jobs_run_twice": reruns.crash_duplicates, "affected_workers": len(affected),
        "reruns_per_affected_worker_max": max(reruns.duplicated_by_crash.values(), default=0),
        "unexplained_reruns": len(reruns.duplicated_otherwise), "overlapping": len(reruns.overlapping),
        "enqueues_failed": len(load.enqueues.failed),
        "enqueue_errors": sorted({text for _, text in load.enqueues.failed}),
        "worker_restarts": worker_restarts(workers_journal),
        "daemon_restarts": int(sbx.unit_property(DAEMON, "NRestarts") or 0),
        "outages": [{k: v for k, v in o.items() if not k.endswith("_at") and not k.endswith("_seen")}
                    | {"decisions_while_down": held[o["down_for"]],
                       "status": o["status_seen"][:6], "workers": o["workers_seen"]}
                    for o in outages],
    }
    print("postgres restart:", json.dumps(report, indent=1))
    exits = [e["MESSAGE"] for e in workers_journal if "Main process exited" in e.get("MESSAGE", "")
             or "Start request repeated" in e.get("MESSAGE", "") or "cannot start" in e.get("MESSAGE", "")]
    print("worker exits:", len(exits), exits[:8])
    t0 = outages[0]["stop_at"]
    print("workers cut, seconds from the first stop:", sorted(round(at - t0, 1) for at in affected.values()),
          "stops at", [round(o["stop_at"] - t0, 1) for o in outages])
    print("flexiqctl status while down:", outages[-1]["flexiqctl_seen"][:3])
    # Nothing lost: every job enqueued ends done, and ran to its end at least once.
    assert states == {"done": total}, "a job was lost or dead-lettered"
    missing = load.enqueues.ids - completed_jobs(runs)
    assert not missing, f"jobs done in the store that never ran to their end: {sorted(missing)[:10]}"
    assert reruns.duplicated_otherwise == [], "a job ran twice with no cut worker to explain it"
    assert reruns.overlapping == [], "two executions of one job ran at the same time"
    assert max(reruns.duplicated_by_crash.values(), default=0) <= RERUN_BOUND
    # The pool held: no decision on stale figures while the server was down.
    for seconds, during in held.items():
        assert during == [], f"the daemon resized the pool while the server was down ({seconds:g}s): {during}"
    # The daemon never went down, and said what was wrong.
    assert sbx.unit_property(DAEMON, "MainPID") == daemon_pid and report["daemon_restarts"] == 0
    long_outage = outages[-1]
    assert any("unavailable" in s and DATABASE in s for s in long_outage["status_seen"]), long_outage["status_seen"]
    assert any("unavailable" in s and DATABASE in s for s in long_outage["flexiqctl_seen"]), \
        long_outage["flexiqctl_seen"]
    # No crash loop into the start limit; no worker ends failed.  A worker exits once, by its
    # fence (its jobs' leases unconfirmed), and its restart waits for the server: it does not exit again.
    assert len(exits) <= len(affected), exits
    assert start_limit_hits(workers_journal) == []
    assert workers(sbx, "failed") == []
    # An enqueue that met the outage failed in one line naming the database.
    assert load.enqueues.tracebacks == []
    unclear = sorted({text for _, text in load.enqueues.failed if DATABASE not in text or "\n" in text})
    assert load.enqueues.failed and unclear == [], unclear
    assert PASSWORD not in json.dumps(report) + "".join(long_outage["flexiqctl_seen"])
