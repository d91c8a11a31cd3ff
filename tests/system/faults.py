"""What the fault tests share: a steady load that records its own executions, the journal's
view of what workers and the daemon did, and the judgement of one fault's figures.

A fault test runs a real flexiqd with real worker units in the sandbox, keeps jobs
(tests/apps/chaos_app.py: each execution writes start/end marks, its work one
``time.sleep``, blocking in C) arriving through ``flexiq enqueue`` while it injects
the fault, and then counts: jobs lost, jobs run twice against the bound, the time
until jobs complete again, and what an operator saw.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from typing import Callable

from .executions import Execution, parse
from .flexiqd_install import BIN, DAEMON, MARKS, REPO, workers
from .sandbox import Sandbox

CONCURRENCY = 4
# What one affected worker may make run twice: its running jobs, plus those that finished
# but whose results were not committed yet (runtime.UNSETTLED_MAX) -- the chaos test's bound.
RERUN_BOUND = CONCURRENCY + 16



def config(store: str, *, max_workers: int, marks: str = MARKS, pool_extra: str = "") -> str:
    """A pool of the chaos app's workers (``concurrency`` CONCURRENCY) on ``store``, quick to
    scale both ways; ``pool_extra``: more keys of the pool, as YAML lines indented 4."""
    return f"""
store: '{store}'
tick: 500ms
pools:
  default:
    app: chaos_app:queue
    concurrency: {CONCURRENCY}
    min_workers: 1
    max_workers: {max_workers}
    drain_timeout: 20s
    environment:
      PYTHONPATH: {REPO / "tests" / "apps"}
      FLEXIQ_TEST_MARKS: {marks}
    targets: {{age: 2s, lead_time: 1s}}
    behavior:
      down_window: 2s
      up_limit: {{workers: {max_workers}, percent: 100, period: 1s}}
      down_limit: {{workers: {max_workers}, percent: 100, period: 1s}}
{pool_extra}"""


_IDS = re.compile(r"^(?:enqueued \d+ jobs, ids (\d+)\.\.(\d+)|(\d+))$")


@dataclasses.dataclass
class Enqueues:
    """What ``flexiq enqueue`` answered: the ids it reported, and its failures' messages."""

    ids: set[int] = dataclasses.field(default_factory=set)
    failed: list[tuple[float, str]] = dataclasses.field(default_factory=list)  # (when, stderr)
    tracebacks: list[str] = dataclasses.field(default_factory=list)


class Load(threading.Thread):
    """``batch`` jobs (``(count, seconds)`` pairs) enqueued every ``every`` seconds until stopped,
    by ``program`` (this checkout's ``flexiq``, or another release's)."""

    def __init__(self, sbx: Sandbox, url: str, batch: tuple[tuple[int, float], ...], every: float,
                 program: str = str(BIN / "flexiq")) -> None:
        super().__init__(name="load", daemon=True)
        self.sbx, self.url, self.batch, self.every = sbx, url, batch, every
        self.program = program
        self.enqueues = Enqueues()
        self._halt = threading.Event()

    def enqueue(self, count: int, seconds: float) -> bool:
        done = self.sbx.run([self.program, "--url", self.url, "enqueue", "work", str(seconds),
                             "--count", str(count), "--max-attempts", "1000"], check=False, timeout=120)
        found = _IDS.match(done.stdout.strip())
        if done.returncode == 0 and found:
            first, last = (found.group(1), found.group(2)) if found.group(1) else (found.group(3), found.group(3))
            self.enqueues.ids.update(range(int(first), int(last) + 1))
            return True
        self.enqueues.failed.append((time.time(), done.stderr.strip()))
        if "Traceback" in done.stderr:
            self.enqueues.tracebacks.append(done.stderr)
        return False

    def run(self) -> None:
        while not self._halt.is_set():
            for count, seconds in self.batch:
                self.enqueue(count, seconds)
            self._halt.wait(self.every)

    def stop(self) -> None:
        self._halt.set()
        self.join()


class Watch(threading.Thread):
    """What an operator sees, sampled while a fault lasts: STATUS=, ``flexiqctl status``, the units."""

    def __init__(self, sbx: Sandbox) -> None:
        super().__init__(name="watch", daemon=True)
        self.sbx = sbx
        self.status: list[str] = []
        self.flexiqctl: list[str] = []
        self.workers: list[int] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.5):
            status = self.sbx.unit_property(DAEMON, "StatusText")
            if not self.status or self.status[-1] != status:
                self.status.append(status)
            shown = self.sbx.run([str(BIN / "flexiqctl"), "status"], check=False, timeout=30)
            text = (shown.stdout + shown.stderr).strip()
            if not self.flexiqctl or self.flexiqctl[-1] != text:
                self.flexiqctl.append(text)
            self.workers.append(len(workers(self.sbx)))

    def stop(self) -> None:
        self._halt.set()
        self.join()


def executions(sbx: Sandbox, marks: str = MARKS) -> list[Execution]:
    return parse(sbx.run(f"cat {marks}/*.log 2>/dev/null || true").stdout)


def journal_entries(sbx: Sandbox, *units: str, since: float | None = None) -> list[dict]:
    """The units' journal entries as JSON objects (``at``: epoch seconds), oldest first."""
    args = ["journalctl", "--no-pager", "-o", "json"]
    for unit in units:
        args += ["-u", unit]
    if since is not None:
        args += ["--since", f"@{since:.6f}"]
    entries = []
    for line in sbx.run(args).stdout.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        message = entry.get("MESSAGE")
        if isinstance(message, list):  # journald sends non-UTF-8 messages as bytes
            entry["MESSAGE"] = bytes(message).decode(errors="replace")
        entry["at"] = int(entry["__REALTIME_TIMESTAMP"]) / 1e6
        entries.append(entry)
    return entries


# A worker process that ended with jobs it had started not settled: the fence (its leases
# unconfirmed on a store shared by hosts), or an exit with results the store never took.
_WORKER_CUT = re.compile(r"could not renew the leases|exits with \d+ results not settled|"
                         r"could not mark the jobs it gives up")


def cut_workers(entries: list[dict]) -> dict[int, float]:
    """Worker pid -> when it said it ends with started jobs unsettled (an upper bound is the
    fence's exit grace later: those jobs may run again once it is gone)."""
    return {int(e["_PID"]): e["at"] + 0.5 for e in entries
            if "_PID" in e and _WORKER_CUT.search(e.get("MESSAGE", ""))}


def completed_jobs(runs: list[Execution]) -> set[int]:
    return {run.job for run in runs if run.ended is not None}


def wait_all_done(sbx: Sandbox, states: Callable[[], dict[str, int]], total: int, timeout: float) -> dict:
    seen = [{}]

    def done() -> bool:
        seen[0] = states()
        return seen[0].get("done", 0) >= total and set(seen[0]) == {"done"}

    try:
        sbx.wait_for(done, timeout, interval=1, what=f"all {total} jobs to be done")
    except Exception:
        print("stuck at", seen[0])
        print(sbx.run(f"systemctl list-units --no-pager --all 'flexiq*'; journalctl -u {DAEMON} --no-pager "
                      "-n 60", check=False).stdout)
        raise
    return seen[0]


def worker_restarts(entries: list[dict]) -> int:
    """Restarts systemd made of worker units on its own (a unit stopped since keeps no NRestarts)."""
    return sum(1 for e in entries if "Scheduled restart job" in e.get("MESSAGE", ""))


def start_limit_hits(entries: list[dict]) -> list[str]:
    return [e["MESSAGE"] for e in entries if "Start request repeated too quickly" in e.get("MESSAGE", "")
            or "start-limit-hit" in e.get("MESSAGE", "")]
