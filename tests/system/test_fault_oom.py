"""Fault: a worker is OOM-killed mid-job (issue 24, fault 4).

How it is injected.  ``MemoryMax=`` cannot be enforced in the sandbox on these machines:
they run cgroup v1 (hybrid), and systemd-nspawn gives the container no memory controller
(a unit with ``MemoryMax=50M`` allocates 300 MB unharmed there).  So the test uses the
kernel's memory cgroup from outside: the worker units' processes are moved, as they
start, into a v1 memory cgroup of this test limited to ``LIMIT_MB``, and a task that
allocates past it (tests/apps/chaos_app.py ``hog``) is killed by the kernel's OOM killer
-- a real OOM kill, mid-job, of a worker under a real systemd, which sees it as a SIGKILL.

Under a steady load of jobs that record their executions, one ``hog`` job (3 attempts)
exhausts memory every time.  What must hold, and what is measured (printed; ``pytest -s``):
- the killed worker's other jobs come back at once (seconds from the kill to their next
  start: measured) and run again at most ``RERUN_BOUND`` per kill; none is lost;
- the hog ends in the dead letters after its attempts, with the reason (how the worker
  ended, as systemd recorded it: here "killed by SIGKILL"; "out of memory: killed by the
  kernel's OOM killer" where systemd enforces ``MemoryMax=`` itself and says ``oom-kill``);
- no crash loop: no start-limit hit, no unit left failed, the pool keeps serving.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

from .executions import judge
from .faults import (RERUN_BOUND, Load, completed_jobs, config, executions, journal_entries,
                     start_limit_hits, wait_all_done)
from .flexiqd_install import BIN, DAEMON, STORE, install, workers
from .sandbox import Sandbox

LIMIT_MB = 300
HOG_ATTEMPTS = 3
BATCH = ((4, 0.5),)


class MemoryCage(threading.Thread):
    """A v1 memory cgroup below this process's own, limited to ``limit_mb``, into which every
    process of the sandbox's worker units is moved as soon as it is seen (every 50 ms)."""

    def __init__(self, sbx: Sandbox, limit_mb: int) -> None:
        super().__init__(name="memory-cage", daemon=True)
        own = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                   if line.split(":", 2)[1] == "memory")
        self.base = Path("/sys/fs/cgroup/memory") / own.lstrip("/")
        self.path = self.base / f"flexiq-oom-{os.getpid()}"
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(limit_mb << 20))
        swap = self.path / "memory.memsw.limit_in_bytes"
        if swap.exists():
            swap.write_text(str(limit_mb << 20))
        self.sandbox_name = sbx.name
        self.caged: set[int] = set()
        self._halt = threading.Event()

    def _worker_pids(self) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                groups = (entry / "cgroup").read_text()
            except OSError:
                continue
            if self.sandbox_name in groups and "flexiq-worker@" in groups:
                found.append(int(entry.name))
        return found

    def run(self) -> None:
        while not self._halt.wait(0.05):
            for pid in self._worker_pids():
                if pid not in self.caged:
                    try:
                        (self.path / "cgroup.procs").write_text(str(pid))
                        self.caged.add(pid)
                    except OSError:
                        pass  # gone meanwhile

    def remove(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join()
        for pid in (self.path / "cgroup.procs").read_text().split():
            try:
                (self.base / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        os.rmdir(self.path)


@pytest.fixture
def cage(sandbox: Sandbox):
    if not Path("/sys/fs/cgroup/memory/cgroup.procs").exists():
        pytest.skip("no cgroup v1 memory hierarchy on this machine")
    made = MemoryCage(sandbox, LIMIT_MB)
    try:
        yield made
    finally:
        sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*' 2>/dev/null; true", timeout=120)
        made.remove()


def _states(sbx: Sandbox) -> dict[str, int]:
    code = ("import json, sqlite3; c = sqlite3.connect('/var/lib/flexiq/queue.db', timeout=30); "
            "print(json.dumps(dict(c.execute('SELECT state, COUNT(*) FROM jobs GROUP BY state').fetchall())))")
    return json.loads(sbx.run(["python3", "-c", code]).stdout)


_KILLED = re.compile(r"(flexiq-worker@[\w-]+\.service): Main process exited, code=killed, status=9/KILL")


def test_a_worker_killed_for_memory_gives_its_jobs_back_at_once_and_the_hog_ends_dead(sandbox: Sandbox,
                                                                                      cage: MemoryCage):
    sbx = sandbox
    began = time.time()
    install(sbx, config(STORE, max_workers=3))
    cage.start()
    sbx.wait_for(lambda: workers(sbx), 30, what="the minimum worker")
    load = Load(sbx, STORE, BATCH, every=0.5)
    load.enqueue(40, 0.5)
    load.start()
    try:
        time.sleep(3)
        hog = sbx.run([str(BIN / "flexiq"), "--url", STORE, "enqueue", "hog", "2048",
                       "--max-attempts", str(HOG_ATTEMPTS)]).stdout.strip()
        sbx.wait_for(lambda: _states(sbx).get("dead", 0) == 1, 120, interval=0.5, what="the hog to be dead-lettered")
        time.sleep(3)
    finally:
        load.stop()
    total = len(load.enqueues.ids)
    states = wait_all_done(sbx, lambda: {k: v for k, v in _states(sbx).items() if k != "dead"}, total, 120)
    runs = executions(sbx)
    hog_runs = [run for run in runs if run.job == int(hog)]
    systemd_lines = journal_entries(sbx, "flexiq-worker@*", since=began)
    kills = [e for e in systemd_lines if _KILLED.search(e.get("MESSAGE", ""))]
    # Each hog attempt's worker is the one killed: the first kill after that attempt began.
    killed = {}
    for run in hog_runs:
        after = [e["at"] for e in kills if e["at"] >= run.started]
        killed[run.pid] = min(after) if after else time.time()
    work_runs = [run for run in runs if run.job != int(hog)]
    verdict = judge(work_runs, killed)
    # Jobs back at once: from a kill to the next start of each job it cut.
    back = []
    for run in work_runs:
        if run.ended is None and run.pid in killed:
            later = [r.started for r in work_runs if r.job == run.job and r.started > run.started]
            if later:
                back.append(round(min(later) - killed[run.pid], 2))
    dead = json.loads(sbx.run([str(BIN / "flexiq"), "--url", STORE, "dead-letter", "list", "--json"]).stdout)
    restarts = sum(1 for e in systemd_lines if "Scheduled restart job" in e.get("MESSAGE", ""))
    report = {
        "jobs": total, "states": states, "executions": verdict.executions, "oom_kills": len(kills),
        "hog_attempts": len(hog_runs), "jobs_cut_and_run_again": verdict.crash_duplicates,
        "reruns_per_kill_max": max(verdict.duplicated_by_crash.values(), default=0),
        "seconds_from_kill_to_restart": sorted(back),
        "unexplained_reruns": len(verdict.duplicated_otherwise), "overlapping": len(verdict.overlapping),
        "worker_restarts": restarts, "dead_letter": [{k: d.get(k) for k in ("id", "task", "attempts", "error")}
                                                    for d in dead],
    }
    print("oom:", json.dumps(report, indent=1))
    assert states == {"done": total}, "a job was lost"
    assert not load.enqueues.ids - completed_jobs(work_runs)
    assert verdict.duplicated_otherwise == [] and verdict.overlapping == []
    assert max(verdict.duplicated_by_crash.values(), default=0) <= RERUN_BOUND
    # The hog: killed at each attempt, then dead with the reason.
    assert len(hog_runs) == HOG_ATTEMPTS and all(run.ended is None for run in hog_runs)
    assert len(kills) == HOG_ATTEMPTS
    assert [d["id"] for d in dead] == [int(hog)] and dead[0]["attempts"] == HOG_ATTEMPTS
    # The reason: the worker died, and how.  (systemd says "oom-kill" only where it enforces
    # MemoryMax= itself; here the kernel's SIGKILL is all it sees.)
    assert "died: killed by SIGKILL" in dead[0]["error"], dead[0]["error"]
    # No crash loop.
    assert start_limit_hits(systemd_lines) == [] and workers(sbx, "failed") == []
    assert restarts <= HOG_ATTEMPTS
