#!/usr/bin/env python3
"""Crash recovery, flexiqd against flexiq 2.1.0: SIGKILL a busy worker, time until its jobs run again.

    .venv/bin/python bench/recovery_bench.py [--runs 10] [--flexiq-runs 3] [--backlog 300] [--timeout 120]

Needs root (it boots the systemd sandbox of tests/system/sandbox.py), this checkout's
``.venv`` (``make venv``) and flexiq 2.1.0 in ``bench/.work/venv`` (``make bench`` builds
it; the error message says how when it is missing).  About 2.5 minutes.

Both queues run the same scenario: 4 worker processes of 4 slots each, a backlog of
1-second jobs (one ``time.sleep``) that record ``start``/``end`` marks per execution, at
least ``--backlog`` runnable jobs behind the running ones at each kill.  Each run waits
until every worker runs 4 jobs (none of them cut by an earlier kill), waits a random
fraction of a job's length, SIGKILLs one worker's main process and notes the time right
after the kill.  The jobs that process had started and not ended are read from its
marks; for each, the delay is the time from the kill to its next start mark.  ORDER: a
cut job must start again before any job enqueued after it that had not started at the
kill; every later job that starts first is counted, and separately those that started
after the queue had the cut job back (they took its place, the others came before it
could be claimed at all).  "Back in the queue" is each queue's own record of it:

1. flexiqd under a real systemd: the checkout installed with the shipped units
   (tests/system/flexiqd_install.py), one pool pinned at 4 workers (``min_workers =
   max_workers = 4``, concurrency 4), the task app tests/apps/chaos_app.py.  systemd
   restarts the killed unit; the daemon's journal line "... (pid P) is gone: released its
   N jobs" is when the jobs were back.
2. flexiq 2.1.0: 4 plain ``flexiq worker`` processes (it has no systemd integration) of
   4 threads each on a fresh database per run, the task app bench/apps/recovery_flexiq.py;
   its reaper's "worker ... died; recovering in-flight job" rows in ``job_errors``.

Every sample goes to ``bench/results-recovery.json``; the summary table replaces the
part of bench/README.md between ``<!-- recovery:start -->`` and ``<!-- recovery:end -->``.
``--runs 0`` or ``--flexiq-runs 0`` leaves a side out (and the README alone).
Not a test: nothing under tests/ depends on it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from system import flexiqd_install as fi  # noqa: E402
from system.executions import Execution, parse  # noqa: E402
from system.sandbox import Sandbox, SandboxError, SandboxTimeout, unavailable_reason  # noqa: E402

WORKERS = 4
CONCURRENCY = 4
JOB_SECONDS = 1.0
README = REPO / "bench" / "README.md"
RESULTS = REPO / "bench" / "results-recovery.json"
FLEXIQ_VENV = REPO / "bench" / ".work" / "venv"
FLEXIQ_WORK = REPO / "bench" / ".work" / "recovery"
FLEXIQ_MAIN = "import sys; sys.argv[0] = 'flexiq'; from flexiq.cli import main; main()"
MARKERS = ("<!-- recovery:start -->", "<!-- recovery:end -->")

FLEXIQD_CONFIG = f"""
store: {fi.STORE}
pools:
  default:
    app: chaos_app:queue
    concurrency: {CONCURRENCY}
    min_workers: {WORKERS}
    max_workers: {WORKERS}
    environment:
      PYTHONPATH: {REPO / "tests" / "apps"}
      FLEXIQ_TEST_MARKS: {fi.MARKS}
"""
# Runnable jobs behind the running ones at each kill, at least (--backlog): flexiqd's queue is
# topped up before each kill; flexiq gets a fresh queue of this many plus one job per slot each run.
BACKLOG = 300


class BenchError(Exception):
    """The benchmark cannot run or cannot go on; the message says why."""


def log(message: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S}] {message}", flush=True)


# ---------------------------------------------------------------------------------------------
# Judging one kill: pure functions over the executions the task marks describe.
# ---------------------------------------------------------------------------------------------

def open_by_pid(executions: Iterable[Execution]) -> dict[int, list[int]]:
    """Jobs each process has started and not ended (for a live process: running now)."""
    running: dict[int, list[int]] = {}
    for e in executions:
        if e.ended is None:
            running.setdefault(e.pid, []).append(e.job)
    return running


def cut_jobs(executions: Iterable[Execution], pid: int) -> list[int]:
    """The jobs the killed process ``pid`` had started and never ended."""
    return sorted({e.job for e in executions if e.pid == pid and e.ended is None})


def judge_kill(executions: list[Execution], pid: int, killed_at: float,
               released_at: float | None = None) -> dict:
    """The jobs cut by the kill: each one's delay to its next start; and the later jobs that
    started first.

    A later job "overtakes" a cut job when it was enqueued after it (a higher id or
    sequence number), had not started at the kill, and started before the cut job's
    restart.  Those that started after ``released_at`` (when the queue had the cut jobs
    back) took their place; the others started before the cut jobs could be claimed at all.
    """
    first_start: dict[int, float] = {}
    for e in executions:
        first_start[e.job] = min(e.started, first_start.get(e.job, math.inf))
    not_started = {job: at for job, at in first_start.items() if at > killed_at}
    jobs, overtakers = [], {}
    for job in cut_jobs(executions, pid):
        restarts = [e for e in executions if e.job == job and e.started > killed_at]
        restart = min(restarts, key=lambda e: e.started) if restarts else None
        until = restart.started if restart else math.inf
        overtaking = {other: at for other, at in not_started.items() if other > job and at < until}
        overtakers.update(overtaking)
        jobs.append({
            "job": job,
            "delay_s": round(restart.started - killed_at, 6) if restart else None,
            "restarted_by_pid": restart.pid if restart else None,
            "overtaken_by": len(overtaking),
            "overtaken_after_release": (None if released_at is None
                                        else sum(1 for at in overtaking.values() if at > released_at)),
        })
    return {"jobs": jobs, "overtaking_jobs": len(overtakers),
            "overtaking_jobs_after_release": (None if released_at is None
                                              else sum(1 for at in overtakers.values() if at > released_at))}


def settled_reruns(executions: list[Execution], pid: int, killed_at: float) -> int:
    """Jobs the killed process had run to their end that ran again after the kill."""
    ended = {e.job for e in executions if e.pid == pid and e.ended is not None}
    return len({e.job for e in executions if e.job in ended and e.started > killed_at})


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile (so p95 of 40 samples is the 38th smallest)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def summarise(kills: list[dict]) -> dict:
    """One side's figures over all its kills (delays pooled over every cut job)."""
    jobs = [job for kill in kills for job in kill["jobs"]]
    delays = [j["delay_s"] for j in jobs if j["delay_s"] is not None]
    releases = [k["release_s"] for k in kills if k.get("release_s") is not None]
    after_release = [j["overtaken_after_release"] for j in jobs if j["overtaken_after_release"] is not None]

    def spread(values: list[float]) -> dict:
        return {"n": len(values), "median": statistics.median(values) if values else None,
                "p95": percentile(values, 0.95), "max": max(values, default=None),
                "min": min(values, default=None)}

    return {
        "kills": len(kills), "jobs_cut": len(jobs),
        "not_restarted": sum(1 for j in jobs if j["delay_s"] is None),
        "delay_s": spread(delays),
        "release_s": spread(releases),
        "jobs_released": sum(k["released_jobs"] or 0 for k in kills),
        # ORDER: cut jobs some later job overtook, and the later jobs that started first.
        "order_violations": sum(1 for j in jobs if j["overtaken_by"]),
        "later_jobs_started_first": sum(k["overtaking_jobs"] for k in kills),
        "order_violations_after_release": (sum(1 for n in after_release if n) if after_release else None),
        "settled_reruns": sum(k["settled_reruns"] for k in kills),
    }


# ---------------------------------------------------------------------------------------------
# flexiqd under systemd
# ---------------------------------------------------------------------------------------------

def _unit_pids(sbx: Sandbox) -> dict[str, int]:
    """Active worker units and their main pids, in one ``systemctl show``."""
    units = fi.workers(sbx)
    if not units:
        return {}
    out = sbx.run(["systemctl", "show", "-p", "Id", "-p", "MainPID", *units]).stdout
    pids = {}
    # One block per unit, blank-line separated; systemctl orders the properties its own way.
    for block in out.split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if props.get("Id") and props.get("MainPID", "0") != "0":
            pids[props["Id"]] = int(props["MainPID"])
    return pids


def _sandbox_marks(sbx: Sandbox) -> list[Execution]:
    return parse(sbx.run(f"cat {fi.MARKS}/*.log 2>/dev/null || true").stdout)


def fresh_busy_workers(workers: dict[str, int], executions: list[Execution], cut_before: set[int]) -> list[str]:
    """Workers running a full CONCURRENCY jobs none of which an earlier kill cut (so no job
    is cut twice and no sample measures a retry's retry); empty unless the whole pool is busy."""
    running = open_by_pid(executions)
    if len(workers) != WORKERS or any(len(running.get(pid, [])) < CONCURRENCY for pid in workers.values()):
        return []
    return sorted(name for name, pid in workers.items() if not cut_before.intersection(running[pid]))


def _wait_busy(read: Callable[[], tuple[dict, list[Execution]]], cut_before: set[int],
               timeout: float, what: str) -> tuple[dict[str, int], list[str]]:
    """Poll until every worker runs CONCURRENCY jobs; return (workers, those fit to be killed)."""
    deadline = time.monotonic() + timeout
    last = "nothing read yet"
    while time.monotonic() < deadline:
        workers, executions = read()
        candidates = fresh_busy_workers(workers, executions, cut_before)
        if candidates:
            return workers, candidates
        running = open_by_pid(executions)
        last = f"{len(workers)} workers, jobs running per worker: " + \
            ", ".join(f"{name} {len(running.get(pid, []))}" for name, pid in sorted(workers.items()))
        time.sleep(0.1)
    raise BenchError(f"{what}: the pool was not busy within {timeout:g} s ({last})")


def _wait_restarted(read: Callable[[], list[Execution]], pid: int, killed_at: float,
                    timeout: float, poll: float) -> list[Execution]:
    """Poll the marks until every job ``pid`` was cut from has started again (or timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        executions = read()
        cut = set(cut_jobs(executions, pid))
        restarted = {e.job for e in executions if e.job in cut and e.started > killed_at}
        if cut <= restarted or time.monotonic() >= deadline:
            return executions
        time.sleep(poll)


_RELEASED = r"\(pid {pid}\) is gone: released its (\d+) jobs"


def daemon_release(journal_unix: str, pid: int) -> tuple[float, int] | None:
    """(epoch, jobs) of the daemon's "released its N jobs" line for ``pid``, from
    ``journalctl -o short-unix`` output."""
    pattern = re.compile(_RELEASED.format(pid=pid))
    for line in journal_unix.splitlines():
        match = pattern.search(line)
        if match:
            return float(line.split()[0]), int(match.group(1))
    return None


def _top_up(sbx: Sandbox, backlog: int) -> int:
    """Keep ``backlog`` runnable jobs or more queued; return how many there are."""
    runnable = fi.stats(sbx)["runnable"]
    if runnable < backlog:
        fi.flexiq(sbx, "enqueue", "work", json.dumps(JOB_SECONDS), "--count", str(backlog))
        runnable += backlog
    return runnable


def bench_flexiqd(runs: int, backlog: int, timeout: float, seed: int) -> dict:
    """``runs`` kills in one sandbox, one after the other; the sandbox is always torn down."""
    rng = random.Random(seed)
    kills: list[dict] = []
    cut: set[int] = set()
    with Sandbox() as sbx:
        systemd = sbx.run(["systemctl", "--version"]).stdout.split("\n")[0]
        log(f"flexiqd: sandbox up ({systemd}); installing, pool pinned at {WORKERS} workers x {CONCURRENCY}")
        fi.install(sbx, FLEXIQD_CONFIG)
        sbx.wait_for(lambda: len(_unit_pids(sbx)) == WORKERS, 60, what=f"{WORKERS} active worker units")
        _top_up(sbx, backlog + WORKERS * CONCURRENCY)
        for run in range(1, runs + 1):
            workers, candidates = _wait_busy(lambda: (_unit_pids(sbx), _sandbox_marks(sbx)), cut, 60,
                                             f"flexiqd run {run}")
            unit = rng.choice(candidates)
            pid = workers[unit]
            runnable = _top_up(sbx, backlog)
            time.sleep(rng.uniform(0, JOB_SECONDS))  # the kill lands at a random point of the jobs' run
            killed_at = float(sbx.run(["python3", "-c", "import os, sys, time; os.kill(int(sys.argv[1]), 9); "
                                       "print(repr(time.time()))", str(pid)]).stdout)
            executions = _wait_restarted(lambda: _sandbox_marks(sbx), pid, killed_at, timeout, 0.1)
            release = _daemon_release(sbx, pid)
            released_at = release[0] if release else None
            kill = {"run": run, "unit": unit, "pid": pid, "killed_at": killed_at, "runnable_before": runnable,
                    "release_s": round(released_at - killed_at, 6) if release else None,
                    "released_jobs": release[1] if release else None,
                    **judge_kill(executions, pid, killed_at, released_at),
                    "settled_reruns": settled_reruns(executions, pid, killed_at)}
            cut.update(job["job"] for job in kill["jobs"])
            kills.append(kill)
            _print_kill("flexiqd", kill)
        sbx.run(f"systemctl stop {fi.DAEMON} 'flexiq-worker@*'; true", timeout=180)
    return {"systemd": systemd, "kills": kills, "summary": summarise(kills)}


def _daemon_release(sbx: Sandbox, pid: int) -> tuple[float, int] | None:
    """The daemon's release line for ``pid``, waiting a little for journald; None if absent."""
    def read() -> tuple[float, int] | None:
        journal = sbx.run(["journalctl", "--no-pager", "-o", "short-unix", "-u", fi.DAEMON]).stdout
        return daemon_release(journal, pid)
    try:
        return sbx.wait_for(read, 10, interval=0.2, what=f"flexiqd's release line for pid {pid}")
    except SandboxTimeout:
        log(f"flexiqd logged no 'released its N jobs' line for pid {pid}: no release time for this kill")
        return None


# ---------------------------------------------------------------------------------------------
# flexiq 2.1.0: plain processes on this machine
# ---------------------------------------------------------------------------------------------

def _die_with_parent() -> None:
    """In a worker before exec: SIGKILL when this benchmark dies, however it dies."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


class FlexiqWorkers:
    """4 ``flexiq worker`` processes on one database; each in its own process group,
    all SIGKILLed by their pids (groups) on exit."""

    def __init__(self, python: Path, workdir: Path) -> None:
        self.python, self.workdir = python, workdir
        self.procs: dict[int, subprocess.Popen] = {}
        self.enqueued = 0
        self.env = {**os.environ, "BENCH_DB": str(workdir / "flexiq.db"), "BENCH_OUT": str(workdir / "marks"),
                    "PYTHONPATH": str(REPO / "bench" / "apps")}

    def enqueue(self, count: int) -> None:
        """Enqueue ``count`` more jobs, numbered on from the last (the number is the job in the marks)."""
        first, self.enqueued = self.enqueued, self.enqueued + count
        code = (f"import recovery_flexiq as app; "
                f"app.work.map([(i, {JOB_SECONDS!r}) for i in range({first}, {self.enqueued})]); app.queue.close()")
        subprocess.run([str(self.python), "-c", code], env=self.env, cwd=self.workdir, check=True,
                       capture_output=True, text=True, timeout=120)

    def top_up(self, backlog: int) -> int:
        """Enqueue what it takes for ``backlog`` runnable jobs (flexiq's workers hold some of the
        queue before they start it); return how many there are."""
        runnable = self.runnable()
        if runnable < backlog:
            self.enqueue(backlog - runnable)
        return max(runnable, backlog)

    def __enter__(self) -> "FlexiqWorkers":
        for n in range(WORKERS):
            out = open(self.workdir / f"worker-{n + 1}.out", "wb")
            proc = subprocess.Popen([str(self.python), "-c", FLEXIQ_MAIN, "worker", "--app", "recovery_flexiq:queue"],
                                    env=self.env, cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
            out.close()
            self.procs[proc.pid] = proc
        return self

    def __exit__(self, *exc: object) -> None:
        for pid, proc in self.procs.items():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            proc.wait()

    def live(self) -> dict[str, int]:
        for pid, proc in self.procs.items():
            if proc.poll() is not None and proc.returncode != -signal.SIGKILL:
                raise BenchError(f"flexiq worker pid {pid} exited with status {proc.returncode}; "
                                 f"its output: {self.workdir}/worker-*.out")
        return {f"pid {pid}": pid for pid, proc in self.procs.items() if proc.poll() is None}

    def kill(self, pid: int) -> float:
        os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
        self.procs[pid].wait()
        return killed_at

    def _db(self) -> sqlite3.Connection:
        return sqlite3.connect(f"file:{self.workdir / 'flexiq.db'}?mode=ro", uri=True, timeout=30)

    def runnable(self) -> int:
        """Jobs waiting in flexiq's queue (its status 0, pending) that are due."""
        with contextlib.closing(self._db()) as db:
            return db.execute("SELECT COUNT(*) FROM jobs WHERE status = 0 AND scheduled_at <= ?",
                              (int(time.time() * 1000),)).fetchone()[0]

    def released(self, killed_at: float) -> tuple[float, int] | None:
        """(epoch, jobs) of flexiq's own recovery of a dead worker's jobs: its reaper records
        "worker ... died; recovering in-flight job" in job_errors for each job it re-queues."""
        with contextlib.closing(self._db()) as db:
            first, count = db.execute(
                "SELECT MIN(failed_at), COUNT(*) FROM job_errors WHERE error LIKE '%died%' AND failed_at >= ?",
                (int(killed_at * 1000),)).fetchone()
        return (first / 1000, count) if count else None

    def marks(self) -> list[Execution]:
        text = "".join(p.read_text() for p in sorted((self.workdir / "marks").glob("*.log")))
        return parse(text)


def flexiq_python() -> Path:
    python = FLEXIQ_VENV / "bin" / "python"
    probe = "import importlib.metadata as m; print(m.version('flexiq'))"
    found = None
    if python.exists():
        found = subprocess.run([str(python), "-c", probe], capture_output=True, text=True).stdout.strip()
    if found != "2.1.0":
        raise BenchError(
            f"flexiq 2.1.0 is not installed in {FLEXIQ_VENV} (found: {found or 'nothing'}); create it as "
            f"`make bench` does:\n  /usr/bin/python3 -m venv --system-site-packages {FLEXIQ_VENV}\n"
            f"  {python} -m pip install -q flexiq==2.1.0 huey==3.5.4")
    return python


def bench_flexiq(runs: int, backlog: int, timeout: float, seed: int) -> dict:
    """``runs`` kills, each on a fresh database and fresh workers (a killed one is not replaced)."""
    python = flexiq_python()
    rng = random.Random(seed)
    kills: list[dict] = []
    for run in range(1, runs + 1):
        workdir = FLEXIQ_WORK / f"flexiq-{run}"
        shutil.rmtree(workdir, ignore_errors=True)
        (workdir / "marks").mkdir(parents=True)
        with FlexiqWorkers(python, workdir) as flexiq:
            flexiq.enqueue(backlog + WORKERS * CONCURRENCY)
            workers, candidates = _wait_busy(lambda: (flexiq.live(), flexiq.marks()), set(), 60, f"flexiq run {run}")
            pid = workers[rng.choice(candidates)]
            runnable = flexiq.top_up(backlog)
            time.sleep(rng.uniform(0, JOB_SECONDS))  # the kill lands at a random point of the jobs' run
            killed_at = flexiq.kill(pid)
            log(f"flexiq run {run}: SIGKILLed pid {pid}; waiting for its jobs (up to {timeout:g} s)")
            executions = _wait_restarted(flexiq.marks, pid, killed_at, timeout, 0.5)
            flexiq.live()  # the others must still be up, or the run proves nothing
            release = flexiq.released(killed_at)
        released_at = release[0] if release else None
        kill = {"run": run, "pid": pid, "killed_at": killed_at, "runnable_before": runnable,
                "release_s": round(released_at - killed_at, 6) if release else None,
                "released_jobs": release[1] if release else None,
                **judge_kill(executions, pid, killed_at, released_at),
                "settled_reruns": settled_reruns(executions, pid, killed_at)}
        kills.append(kill)
        _print_kill("flexiq", kill)
    shutil.rmtree(FLEXIQ_WORK, ignore_errors=True)
    return {"kills": kills, "summary": summarise(kills)}


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------

def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _print_kill(name: str, kill: dict) -> None:
    delays = ", ".join(_fmt(j["delay_s"]) for j in kill["jobs"]) or "no job was cut"
    order = kill["overtaking_jobs"]
    release = f"; {kill['released_jobs']} jobs back in the queue after {_fmt(kill['release_s'])} s" \
        if kill["release_s"] is not None else "; no release recorded"
    log(f"{name} run {kill['run']}: pid {kill['pid']} killed; its jobs started again after {delays} s"
        f"{release}; later jobs that started first: {order}")


def ratio(flexiq: float | None, flexiqd: float | None) -> str:
    if flexiq is None or not flexiqd:
        return "-"
    return f"{flexiq / flexiqd:,.0f}x" if flexiq / flexiqd >= 10 else f"{flexiq / flexiqd:.1f}x"


def readme_table(results: dict) -> str:
    d, q = results["flexiqd"]["summary"], results["flexiq"]["summary"]
    dd, qd, dr, qr = d["delay_s"], q["delay_s"], d["release_s"], q["release_s"]
    rows = [
        ("kills (jobs cut: started, not ended)", f"{d['kills']} ({d['jobs_cut']})",
         f"{q['kills']} ({q['jobs_cut']})", ""),
        ("**kill -> cut job starts again, median s**", f"**{_fmt(dd['median'])}**", f"**{_fmt(qd['median'], 1)}**",
         f"**{ratio(qd['median'], dd['median'])}**"),
        ("... p95 s", _fmt(dd["p95"]), _fmt(qd["p95"], 1), ratio(qd["p95"], dd["p95"])),
        ("... max s", _fmt(dd["max"]), _fmt(qd["max"], 1), ratio(qd["max"], dd["max"])),
        (f"cut jobs not started again within {results['timeout_s']:g} s", str(d["not_restarted"]),
         str(q["not_restarted"]), ""),
        ("kill -> jobs back in the queue, median (max) s", f"{_fmt(dr['median'])} ({_fmt(dr['max'])})",
         f"{_fmt(qr['median'], 1)} ({_fmt(qr['max'], 1)})", ratio(qr["median"], dr["median"])),
        ("jobs the dead worker held, put back", str(d["jobs_released"]), str(q["jobs_released"]), ""),
        ("ORDER: cut jobs overtaken by later jobs", f"{d['order_violations']} of {d['jobs_cut']}",
         f"{q['order_violations']} of {q['jobs_cut']}", ""),
        ("... later jobs that started first, all kills", str(d["later_jobs_started_first"]),
         str(q["later_jobs_started_first"]), ""),
        ("... cut jobs overtaken once back in the queue", str(d["order_violations_after_release"]),
         str(q["order_violations_after_release"]), ""),
        ("jobs run to their end by the killed worker that ran again", str(d["settled_reruns"]),
         str(q["settled_reruns"]), ""),
    ]
    lines = [
        f"Recorded {results['recorded']}; the run took {results['minutes']:.1f} min. flexiqd "
        f"{results['flexiqd_version']} under {results['flexiqd']['systemd']} in the sandbox; flexiq 2.1.0 "
        f"as plain processes; {results['machine']}. Every sample is in `results-recovery.json`.",
        "",
        "| SIGKILL of a busy worker | flexiqd | flexiq 2.1.0 | flexiq / flexiqd |",
        "|---|---:|---:|---:|",
        *(f"| {' | '.join(row)} |" for row in rows),
    ]
    return "\n".join(lines)


def update_readme(results: dict) -> None:
    text = README.read_text()
    start, end = (text.find(m) for m in MARKERS)
    if start < 0 or end < start:
        log(f"{README} has no {MARKERS[0]} ... {MARKERS[1]} section: left as it is")
        return
    README.write_text(text[:start + len(MARKERS[0])] + "\n" + readme_table(results) + "\n" + text[end:])


def machine() -> str:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} cores, {memory:.1f} GiB, Linux {platform.release()}, "
            f"Python {platform.python_version()}")


def flexiqd_version() -> str:
    from importlib.metadata import version
    commit = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip()
    return f"{version('flexiqd')} ({commit or 'no git'})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="SIGKILLs of a flexiqd worker (0: skip flexiqd)")
    parser.add_argument("--flexiq-runs", type=int, default=3, help="SIGKILLs of a flexiq worker (0: skip flexiq)")
    parser.add_argument("--backlog", type=int, default=BACKLOG,
                        help="runnable jobs queued behind the running ones at each kill, at least")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each cut job to start again")
    parser.add_argument("--seed", type=int, default=10, help="chooses which worker to kill")
    parser.add_argument("--json", type=Path,
                        help="where the samples go (default, when both sides run: bench/results-recovery.json)")
    parser.add_argument("--no-readme", action="store_true", help="do not rewrite the results in bench/README.md")
    args = parser.parse_args(argv)
    if not args.runs and not args.flexiq_runs:
        parser.error("--runs 0 and --flexiq-runs 0 leave nothing to measure")
    if args.backlog < 1:
        parser.error(f"--backlog must be 1 or more, not {args.backlog}")
    for name in ("runs", "flexiq_runs"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be 0 or more, not {getattr(args, name)}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be more than 0 seconds, not {args.timeout:g}")
    # SIGTERM (a time-out, Ctrl-C's cousin) unwinds like Ctrl-C: the sandbox and workers are torn down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if args.runs:
            reason = unavailable_reason()
            if reason:
                raise BenchError(f"cannot boot the systemd sandbox: {reason}")
            if not (fi.BIN / "flexiqd").exists():
                raise BenchError(f"{fi.BIN / 'flexiqd'} is missing: run `make venv` first")
        if args.flexiq_runs:
            flexiq_python()  # fail before the long part, not after it
        began = time.monotonic()
        results = {"recorded": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
                   "machine": machine(), "flexiqd_version": flexiqd_version(),
                   "timeout_s": args.timeout, "backlog": args.backlog,
                   "workers": WORKERS, "concurrency": CONCURRENCY, "job_seconds": JOB_SECONDS}
        if args.runs:
            results["flexiqd"] = bench_flexiqd(args.runs, args.backlog, args.timeout, args.seed)
        if args.flexiq_runs:
            results["flexiq"] = bench_flexiq(args.flexiq_runs, args.backlog, args.timeout, args.seed)
        results["minutes"] = (time.monotonic() - began) / 60
    except (BenchError, SandboxError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        print(f"recovery_bench: {exc}", file=sys.stderr)
        return 1
    both = "flexiqd" in results and "flexiq" in results
    path = args.json or (RESULTS if both else None)  # a one-sided run never replaces the recorded results
    if path:
        path.write_text(json.dumps(results, indent=2) + "\n")
        log(f"samples written to {path}")
    if both:
        print(readme_table(results))
        if not args.no_readme:
            update_readme(results)
    else:
        for side in ("flexiqd", "flexiq"):
            if side in results:
                print(side, json.dumps(results[side]["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
