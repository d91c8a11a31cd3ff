"""Chaos under a real systemd: 10^4 jobs while workers are SIGKILLed, the daemon is restarted,
SIGKILLed and reloaded, and the pool scales in and out throughout.

What must hold: no job lost; no job run twice except those a SIGKILLed worker had
started (and at most a bounded number per kill); no two executions of a job at
the same time.  The figures are printed (``pytest -s``) and recorded in
docs/guarantees.md.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time

from .executions import Execution, judge, parse
from .flexiqd_install import BIN, DAEMON, MARKS, REPO, STORE, install, workers
from .sandbox import Sandbox

CONCURRENCY = 4
# Started-but-unsettled jobs of one worker at any instant: its running jobs, plus those that
# finished in the last settle batch (at most half the prefetch allowance, PREFETCH_MAX // 2).
CRASH_BOUND = CONCURRENCY + 16

CONFIG = f"""
store: {STORE}
tick: 500ms
pools:
  default:
    app: chaos_app:queue
    concurrency: {CONCURRENCY}
    min_workers: 1
    max_workers: 6
    drain_timeout: DRAIN
    environment:
      PYTHONPATH: {REPO / "tests" / "apps"}
      FLEXIQ_TEST_MARKS: {MARKS}
    targets: {{age: 2s, lead_time: 1s}}
    behavior:
      down_window: 2s
      up_limit: {{workers: 6, percent: 100, period: 1s}}
      down_limit: {{workers: 6, percent: 100, period: 1s}}
"""

# (count, seconds) per wave: short jobs for volume, longer ones so scale-in meets running work.
WAVE = ((1800, 0.01), (180, 0.3), (20, 2.0))
WAVES = 5
# A crash uses an attempt (a job that kills its worker every time must end up dead-lettered),
# and a recovered job keeps its place, so with a kill a second one long job can be cut again
# and again.  The chaos is the test's, not the job's: attempts enough that none runs out.
MAX_ATTEMPTS = 1000


def _config(drain: str) -> str:
    return CONFIG.replace("DRAIN", drain)


def _job_states(sbx: Sandbox) -> dict[str, int]:
    code = ("import json, sqlite3; c = sqlite3.connect('/var/lib/flexiq/queue.db', timeout=30); "
            "print(json.dumps(dict(c.execute('SELECT state, COUNT(*) FROM jobs GROUP BY state').fetchall())))")
    return json.loads(sbx.run(["python3", "-c", code]).stdout)


def _enqueue_wave(sbx: Sandbox) -> None:
    for count, seconds in WAVE:
        sbx.run([str(BIN / "flexiq"), "--url", STORE, "enqueue", "work", str(seconds), "--count", str(count),
                 "--max-attempts", str(MAX_ATTEMPTS)])


class Chaos:
    """Disruptions on a thread of their own, one a second, until stopped."""

    def __init__(self, sbx: Sandbox) -> None:
        self.sbx = sbx
        self.killed: dict[int, float] = {}     # worker pid -> when SIGKILL was sent
        self.done: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos")
        self._random = random.Random(10)
        self._drain = "10s"

    def __enter__(self) -> "Chaos":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        # The daemon is disrupted about every 7 s: long enough between for the pool to scale in.
        # Scale-in comes from the policy and from an operator's pin to 2 workers for 2 s, which
        # drains busy workers through the same path.
        kill, shrink = self.kill_worker, self.scale_in
        actions = [kill, shrink, kill, kill, self.reload, kill, shrink, kill, self.restart_daemon,
                   kill, shrink, kill, kill, kill, self.kill_daemon]
        step = 0
        while not self._stop.wait(1.0):
            action = actions[step % len(actions)]
            step += 1
            try:
                action()
            except Exception as exc:  # noqa: BLE001 - a disruption that failed is reported, not fatal
                self.errors.append(f"{action.__name__}: {exc}")

    def kill_worker(self) -> None:
        active = workers(self.sbx)
        if not active:
            return
        unit = self._random.choice(active)
        pid = int(self.sbx.unit_property(unit, "MainPID"))
        if pid == 0:
            return
        self.sbx.run(["kill", "-KILL", str(pid)])  # the worker process alone: a crash
        self.killed[pid] = time.time()
        self.done.append(f"SIGKILL {unit}")

    def scale_in(self) -> None:
        self.sbx.run([str(BIN / "flexiqctl"), "scale", "default", "2", "--for", "2s"])
        self.done.append("scale in")

    def reload(self) -> None:
        self._drain = "12s" if self._drain == "10s" else "10s"
        self.sbx.write_file("/etc/flexiqd/flexiqd.yaml", _config(self._drain))
        self.sbx.systemctl("reload", DAEMON)
        self.done.append("reload")

    def restart_daemon(self) -> None:
        self.sbx.systemctl("restart", DAEMON, timeout=120)
        self.done.append("restart flexiqd")

    def kill_daemon(self) -> None:
        pid = self.sbx.unit_property(DAEMON, "MainPID")
        if pid != "0":
            self.sbx.run(["kill", "-9", pid])
            self.done.append("SIGKILL flexiqd")


def _scale_ins(journal: str) -> int:
    return sum(1 for before, after in re.findall(r"default (\d+) -> (\d+):", journal) if int(after) < int(before))


def test_judging_executions_tells_crash_reruns_from_duplicates():
    text = ("start 1 1 10 1.0\nstart 2 1 10 1.0\nend 2 1 10 1.5\n"   # 1 cut by the kill of 10
            "start 1 2 11 3.0\nend 1 2 11 3.5\n"                        # ... and run again: a crash's
            "start 3 1 11 4.0\nend 3 1 11 5.0\nstart 3 2 12 4.5\nend 3 2 12 5.5\n")  # twice at once
    verdict = judge(parse(text), killed={10: 2.0})
    assert verdict.duplicated_by_crash == {10: 1}
    assert verdict.duplicated_otherwise == [3] and verdict.overlapping == [3]
    assert parse("start 4 1 10 1.0\n") == [Execution(4, 10, 1.0, None)]


def test_ten_thousand_jobs_through_kills_restarts_reloads_and_scale_in(sandbox: Sandbox):
    install(sandbox, _config("10s"))
    sandbox.wait_for(lambda: len(workers(sandbox)) == 1, 30, what="the minimum worker unit")
    total = WAVES * sum(count for count, _ in WAVE)
    started = time.monotonic()
    with Chaos(sandbox) as chaos:
        for _ in range(WAVES):
            _enqueue_wave(sandbox)
            sandbox.wait_for(lambda: _job_states(sandbox).get("queued", 0) == 0, 120, interval=0.5,
                             what="the wave to be claimed")
            time.sleep(3)  # an idle gap: the pool scales in while the long jobs still run
        seen: list[dict[str, int]] = [{}]

        def all_done() -> bool:
            seen[0] = _job_states(sandbox)
            return seen[0].get("done", 0) == total

        try:
            sandbox.wait_for(all_done, 180, interval=1, what=f"all {total} jobs to be done")
        except Exception:
            print("chaos: stuck at", seen[0], "after", chaos.done[-12:], chaos.errors[-5:])
            print(sandbox.run([str(BIN / "flexiq"), "--url", STORE, "dead-letter", "list"], check=False).stdout)
            print(sandbox.run("systemctl list-units --no-pager 'flexiq*'; journalctl -u flexiqd --no-pager "
                              "-n 40", check=False).stdout)
            raise
    elapsed = time.monotonic() - started
    states = _job_states(sandbox)
    verdict = judge(parse(sandbox.run(f"cat {MARKS}/*.log").stdout), chaos.killed)
    journal = sandbox.journal(DAEMON)
    per_kill = [verdict.duplicated_by_crash.get(pid, 0) for pid in chaos.killed]
    report = {"jobs": total, "seconds": round(elapsed, 1), "states": states,
              "worker_kills": len(chaos.killed), "disruptions": len(chaos.done),
              "daemon_restarts": chaos.done.count("restart flexiqd"),
              "daemon_kills": chaos.done.count("SIGKILL flexiqd"), "reloads": chaos.done.count("reload"),
              "pinned_scale_ins": chaos.done.count("scale in"),
              "scale_ins": _scale_ins(journal), "executions": verdict.executions,
              "crash_duplicates": verdict.crash_duplicates,
              "crash_duplicates_per_kill_max": max(per_kill, default=0),
              "crash_duplicates_per_kill_mean": round(sum(per_kill) / len(per_kill), 2) if per_kill else 0,
              "other_duplicates": len(verdict.duplicated_otherwise), "overlapping": len(verdict.overlapping),
              "disruption_errors": chaos.errors[:5]}
    print("chaos:", json.dumps(report))
    assert states == {"done": total}, "a job was lost or dead-lettered"
    assert verdict.jobs == total
    assert verdict.duplicated_otherwise == [], "a job ran twice with no SIGKILL to explain it"
    assert verdict.overlapping == [], "two executions of one job ran at the same time"
    assert max(per_kill, default=0) <= CRASH_BOUND
    assert len(chaos.killed) >= 10 and report["scale_ins"] >= 3, "too little chaos to prove anything"
    sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*'; true", timeout=120)
