#!/usr/bin/env python3
"""Where a no-op job's CPU goes in flexiqd's store hot path, and what the machine allows.

    PYTHONPATH=/work/before .venv/bin/python bench/hotpath_profile.py --json bench/results-hotpath-before.json
    .venv/bin/python bench/hotpath_profile.py --json bench/results-hotpath-after.json
    .venv/bin/python bench/hotpath_profile.py --compare bench/results-hotpath-before.json bench/results-hotpath-after.json
    .venv/bin/python bench/hotpath_profile.py --quick          # a smoke run (~20 s)

The code measured is whatever ``import flexiqd`` finds: this script, its fill and its
worker processes all run with the caller's PYTHONPATH and from a directory that holds
no ``flexiqd`` package (bench/.work/hotpath/app), and it checks that the workers import
the same copy as this process.  Run it from the project's ``.venv`` (psutil and psycopg
from Debian); py-spy comes from ``bench/.work/venv/bin/py-spy``
(``bench/.work/venv/bin/pip install py-spy``).  About 3 minutes on 2 cores.

Three measurements, each on a fresh store:

(a) Per-job CPU.  ``--jobs`` no-op jobs are enqueued up front (``task.map`` in calls
    of 1,000, in this process: the enqueueing side's CPU is timed apart and never
    counted in the worker's), then ONE ``flexiq worker --concurrency 4`` process drains
    them: on durable SQLite (WAL, synchronous=FULL: the default URL options) and on
    PostgreSQL 15 (a private server with PostgreSQL's durability defaults, started as
    ``pg_throughput_bench.py`` starts its own).  The worker's user+sys CPU (psutil) and
    each of its threads' CPU and run-queue wait (/proc/<pid>/task/*/schedstat) are read
    at the first poll that sees a completion and at the poll that sees them all, so
    start-up and shutdown are left out; per-job figures are the differences over the
    jobs completed in between.  Threads are told apart by name (the app module names
    them after their Python names): main (asyncio loop), store thread, task threads.
    For PostgreSQL the server's CPU in the same window (every server process but the
    poller's backend) is given beside it.  The rate is the jobs over the store's own
    first-claim-to-last-completion span.  ``--reps`` rounds, the stores interleaved;
    the summary gives medians.

(b) Profile.  One more drain per store (``--profile-jobs``) with ``py-spy record
    --threads --nonblocking`` (raw format, idle threads left out) attached to the worker
    from its first completion to its last.  py-spy counts a thread whenever it is
    runnable, waiting for a core included, so each thread's samples are weighted by
    that thread's measured CPU over the same window: every figure is then CPU time,
    split inside a thread by where py-spy saw it.  Summarised as the split by area (SQL
    in C, BEGIN/COMMIT, driver, rows -> Job, JSON, worker loop, asyncio, thread
    hand-offs, logging, ...), by thread, the top functions and lines by self time and
    the store's functions inclusive of callees, each as % and as µs per job.  Should
    py-spy fail to attach, the profiled drain is run once more, and if it fails again
    the results say so and carry no profile.  (No cProfile fallback: with cProfile
    enabled, even in the main thread only, this worker hangs on Python 3.11.2 -- its
    main thread stays in ``Thread.start()`` holding the GIL -- so it would measure
    nothing.)

(c) The raw limit.  The same claim/settle pattern written directly against each
    store's tables (created by flexiqd, so its indexes and triggers are there), one
    process: per transaction, claim ``--raw-batch`` jobs with one UPDATE ... RETURNING
    along the claim index (PostgreSQL: FOR UPDATE SKIP LOCKED), mark them done, insert
    their executions rows, COMMIT.  sqlite3 on the same durable settings; psycopg with
    an autocommit connection and one transaction per exchange.  Jobs/s and CPU per job
    of this process (and of the PostgreSQL server): what the machine allows for the
    pattern, with no worker, no task and no Job objects.

Results (every run, medians, the profiles) go to ``--json``; a plain-text report goes to
stdout; ``--compare`` prints the medians of two results files side by side.  No timing
is asserted.  The machine is a small shared VM, and CPU time itself is not a fixed unit
there: the same work costs more of it while the host is busy.  So every run also
records the other load in the VM (CPU used by everything but the measured processes),
the steal (the host's other work on our virtual CPUs) and a Python speed probe (the CPU
a fixed loop takes); compare runs made back to back, and the worker's CPU against the
raw limit's of the same run.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime
import json
import linecache
import os
import platform
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import psutil

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / ".work" / "hotpath"
APP_DIR = WORK / "app"  # the worker's app module; also the workers' current directory
PY = sys.executable
PY_SPY = BENCH / ".work" / "venv" / "bin" / "py-spy"
sys.path.insert(0, str(BENCH))  # pg_throughput_bench's private server

STORES = ("sqlite", "postgresql")
CHUNK = 1_000  # jobs per enqueue call
POLL = 0.05  # seconds between progress polls
DRAIN_CAP = 300.0  # seconds a drain may take before the run is abandoned
RAW_OWNER = "hotpath:raw:0"

APP_SOURCE = '''"""hotpath_profile.py's no-op task (written by bench/hotpath_profile.py; not part of the repo).

It also gives every thread the worker starts its Python name as its OS name (prctl
PR_SET_NAME, once per thread), so the benchmark can read each thread's CPU by role
from /proc/<pid>/task/<tid>/comm.
"""
import ctypes
import os
import threading

from flexiqd import Queue

_prctl = ctypes.CDLL(None, use_errno=True).prctl
_bootstrap_inner = threading.Thread._bootstrap_inner


def _named_bootstrap_inner(self):
    _prctl(15, self.name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    _bootstrap_inner(self)


threading.Thread._bootstrap_inner = _named_bootstrap_inner

queue = Queue(os.environ["HOTPATH_URL"])


@queue.task("noop")
def noop(i):
    return None
'''

JOB_COLUMNS = ("id, queue, task, payload, priority, state, run_at, attempts, max_attempts, timeout, "
               "idempotency_key, tenant, lease_owner, lease_expires, enqueued_at, started_at, finished_at, "
               "result, error")
UNLEASED = "lease_owner = NULL, lease_expires = NULL, lease_outcome = NULL"
RAW_SQL = {
    "sqlite": {
        "claim": ("UPDATE jobs SET state = 'running', lease_owner = ?, lease_expires = ?, attempts = attempts + 1, "
                  "started_at = ? WHERE id IN (SELECT id FROM jobs WHERE state = 'queued' AND delayed = 0 "
                  "AND queue = ? AND run_at <= ? ORDER BY priority DESC, run_at, id LIMIT ?) "
                  f"RETURNING {JOB_COLUMNS}"),
        "done": (f"UPDATE jobs SET state = 'done', finished_at = ?, result = 'null', error = NULL, {UNLEASED} "
                 f"WHERE id = ?"),
        "record": ("INSERT INTO executions (job_id, attempt, worker, started_at, finished_at, outcome, error) "
                   "VALUES (?, ?, ?, ?, ?, 'ack', NULL)"),
    },
    "postgresql": {
        "claim": ("UPDATE flexiq_jobs SET state = 'running', lease_owner = %s, lease_expires = %s, "
                  "attempts = attempts + 1, started_at = %s WHERE id IN (SELECT id FROM flexiq_jobs "
                  "WHERE state = 'queued' AND NOT delayed AND queue = %s AND run_at <= %s "
                  "ORDER BY priority DESC, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED) "
                  f"RETURNING {JOB_COLUMNS}"),
        "done": (f"UPDATE flexiq_jobs SET state = 'done', finished_at = %s, result = 'null', error = NULL, "
                 f"{UNLEASED} WHERE id = ANY(%s)"),
        "record": ("INSERT INTO flexiq_executions (job_id, attempt, worker, started_at, finished_at, outcome, error) "
                   "SELECT j, a, %s, %s, %s, 'ack', NULL FROM unnest(%s::bigint[], %s::integer[]) AS v(j, a)"),
    },
}
TABLES = {"sqlite": ("jobs", "executions"), "postgresql": ("flexiq_jobs", "flexiq_executions")}


def log(message: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def median(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def spread(values: Iterable[float | None]) -> list[float] | None:
    kept = [v for v in values if v is not None]
    return [min(kept), max(kept)] if kept else None


# ---------------------------------------------------------------------------------------------
# The code under test and the machine.
# ---------------------------------------------------------------------------------------------

def worker_env(url: str) -> dict:
    """The caller's environment (its PYTHONPATH picks the flexiqd measured) plus the app's directory."""
    env = dict(os.environ, HOTPATH_URL=url)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(APP_DIR)) if p)
    return env


def code_identity() -> dict:
    """Which flexiqd this process imported, its commit, and that the workers import the same one."""
    import flexiqd

    package = Path(flexiqd.__file__).resolve().parent
    seen = subprocess.run([PY, "-c", "import flexiqd; print(flexiqd.__file__)"], env=worker_env(""),
                          cwd=str(APP_DIR), capture_output=True, text=True, check=True).stdout.strip()
    if Path(seen).resolve().parent != package:
        raise SystemExit(f"the workers would import {seen}, this process {package}: check PYTHONPATH")

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(package.parent), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else "?"

    return {"flexiqd_package": str(package), "commit": git("rev-parse", "--short", "HEAD"),
            "uncommitted_changes_in_flexiqd": bool(git("status", "--porcelain", "--", "flexiqd")),
            "pythonpath": os.environ.get("PYTHONPATH", "")}


def machine_info() -> dict:
    import psycopg

    info: dict[str, Any] = {"cpus": os.cpu_count(), "kernel": platform.release(),
                            "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
                            "psycopg": psycopg.__version__, "psycopg_impl": psycopg.pq.__impl__,
                            "loadavg_at_start": os.getloadavg()}
    with contextlib.suppress(OSError):
        info["cpu"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                           if line.startswith("model name"))
    return info


# ---------------------------------------------------------------------------------------------
# Stores: a fresh one per run, filled through flexiqd.
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Store:
    """One fresh store: its flexiqd URL and how to reach its tables directly."""

    kind: str
    name: str
    url: str
    path: str | None = None  # SQLite file
    dsn: str | None = None  # libpq conninfo
    server: Any = None

    def connect(self) -> Any:
        if self.kind == "sqlite":
            return sqlite3.connect(self.path, timeout=30, isolation_level=None)
        import psycopg
        return psycopg.connect(self.dsn, autocommit=True)

    def query(self, conn: Any, sql: str) -> tuple:
        return conn.execute(sql).fetchone()

    def drop(self) -> None:
        if self.kind == "sqlite":
            shutil.rmtree(Path(self.path).parent, ignore_errors=True)
        else:
            self.server.admin(f"DROP DATABASE IF EXISTS {self.name}")


def fresh_store(kind: str, name: str, server: Any) -> Store:
    if kind == "sqlite":
        directory = WORK / "run" / name
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        path = str(directory / "store.db")
        return Store(kind, name, f"sqlite:///{path}", path=path)
    from pg_throughput_bench import dsn
    server.admin(f"DROP DATABASE IF EXISTS {name}")
    server.admin(f"CREATE DATABASE {name}")
    return Store(kind, name, server.socket_url(name), dsn=dsn(server, name), server=server)


def fill(store: Store, n: int) -> dict:
    """Create the store through flexiqd and enqueue ``n`` no-op jobs in calls of CHUNK; time it."""
    from flexiqd import Queue

    queue = Queue(store.url)
    noop = queue.task("noop")(lambda i: None)
    queue.stats("default")  # opens the store and creates its schema before the clock starts
    cpu, began = time.process_time(), time.perf_counter()
    for start in range(0, n, CHUNK):
        noop.map([(i,) for i in range(start, min(n, start + CHUNK))])
    seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
    queue.close()
    return {"jobs": n, "seconds": seconds, "rate": n / seconds, "client_cpu_us_per_job": cpu / n * 1e6}


def server_cpu(server: Any, exclude: Iterable[int] = ()) -> float:
    """User+sys seconds of the PostgreSQL server's processes (0 without a server)."""
    if server is None:
        return 0.0
    skip, total = set(exclude), 0.0
    root = psutil.Process(server.pid)
    for proc in [root, *root.children()]:
        if proc.pid in skip:
            continue
        with contextlib.suppress(psutil.NoSuchProcess):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


def machine_busy() -> tuple[float, float]:
    """CPU seconds the whole machine spent busy in this VM (not idle, not waiting for I/O) since
    boot, and seconds of steal (the host running something else on its virtual CPUs)."""
    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0)
    return busy, getattr(t, "steal", 0.0)


def speed_probe() -> float:
    """Milliseconds of CPU a fixed pure-Python loop takes here and now: on a shared VM the
    same work costs more CPU time while the host is busy, so CPU figures read with it."""
    began, total = time.process_time(), 0
    for i in range(1_000_000):
        total += i
    return (time.process_time() - began) * 1e3


# ---------------------------------------------------------------------------------------------
# (a) and (b): one worker process draining the backlog.
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Snapshot:
    """The worker, the server and the machine at one poll."""

    t: float
    done: int
    user: float
    system: float
    ctx_voluntary: int
    ctx_involuntary: int
    server: float
    busy: tuple[float, float]
    own: float
    threads: dict[int, tuple[float, float]]  # per thread id: seconds on a CPU, seconds waiting for one

    @classmethod
    def take(cls, done: int, worker: psutil.Process, server: Any, poller_pid: int | None) -> "Snapshot":
        times, ctx = worker.cpu_times(), worker.num_ctx_switches()
        threads = thread_times(worker.pid)
        return cls(time.perf_counter(), done, times.user, times.system, ctx.voluntary, ctx.involuntary,
                   server_cpu(server, [poller_pid] if poller_pid else []), machine_busy(), time.process_time(),
                   threads)


def thread_times(pid: int) -> dict[int, tuple[float, float]]:
    """Per thread of ``pid``: seconds on a CPU and seconds runnable but waiting for one (schedstat, ns)."""
    times = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError):
            on_cpu, waiting, _ = (task / "schedstat").read_text().split()
            times[int(task.name)] = (int(on_cpu) / 1e9, int(waiting) / 1e9)
    return times


def role_of(thread: str) -> str:
    """The worker's threads by their names (flexiqd names its own)."""
    if thread == "MainThread":
        return "main thread (asyncio loop)"
    if thread.startswith("flexiq-store"):
        return "store thread"
    if thread.startswith("flexiq-task"):
        return "task threads"
    return thread.split(" ")[0] or "?"


def thread_roles(pid: int) -> dict[int, str]:
    """Each thread's role, from the OS name the app module gave it (the main thread: its pid)."""
    roles = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            name = "MainThread" if int(task.name) == pid else (task / "comm").read_text().strip()
            roles[int(task.name)] = role_of(name)
    return roles


def by_role(first: Snapshot, last: Snapshot, roles: dict[int, str], jobs: int) -> dict[str, dict[str, float]]:
    """Microseconds per job on a CPU and waiting for one, per thread role."""
    out: dict[str, dict[str, float]] = {}
    for tid, (cpu, wait) in last.threads.items():
        cpu0, wait0 = first.threads.get(tid, (0.0, 0.0))
        row = out.setdefault(roles.get(tid, "exited or unnamed"),
                             {"cpu_us_per_job": 0.0, "wait_us_per_job": 0.0})
        row["cpu_us_per_job"] += (cpu - cpu0) / jobs * 1e6
        row["wait_us_per_job"] += (wait - wait0) / jobs * 1e6
    return out


def window(first: Snapshot, last: Snapshot, roles: dict[int, str]) -> dict:
    """Per-job figures between two snapshots."""
    jobs, seconds = last.done - first.done, last.t - first.t
    if jobs <= 0 or seconds <= 0:
        return {"jobs": jobs, "seconds": seconds}
    user, system = last.user - first.user, last.system - first.system
    server = last.server - first.server
    other = (last.busy[0] - first.busy[0]) - (user + system) - server - (last.own - first.own)
    return {"jobs": jobs, "seconds": seconds, "rate": jobs / seconds,
            "cpu_us_per_job": (user + system) / jobs * 1e6, "user_us_per_job": user / jobs * 1e6,
            "sys_us_per_job": system / jobs * 1e6, "worker_cores": (user + system) / seconds,
            "server_cpu_us_per_job": server / jobs * 1e6 if first.server or last.server else None,
            "ctx_voluntary_per_job": (last.ctx_voluntary - first.ctx_voluntary) / jobs,
            "ctx_involuntary_per_job": (last.ctx_involuntary - first.ctx_involuntary) / jobs,
            "other_load_cores": max(0.0, other / seconds), "steal_cores": (last.busy[1] - first.busy[1]) / seconds,
            "threads": by_role(first, last, roles, jobs)}


def worker_command(url: str) -> list[str]:
    return [PY, "-m", "flexiqd.cli.flexiq", "--url", url, "worker", "--app", "hotpath_app:queue",
            "--queues", "default", "--concurrency", "4"]


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
    """Stop one process this script started, by its pid; kill its session if it does not end."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


class PySpy:
    """py-spy recording one process from now until ``stop`` (SIGINT: it writes its file then)."""

    def __init__(self, pid: int, out: Path, rate: int) -> None:
        self.out, self.log = out, out.with_suffix(".log")
        with open(self.log, "wb") as log_file:
            self.proc = subprocess.Popen(
                [str(PY_SPY), "record", "--nonblocking", "--threads", "--full-filenames", "--format", "raw",
                 "-r", str(rate), "-o", str(out), "--pid", str(pid)], stdout=log_file, stderr=subprocess.STDOUT)

    def failed(self) -> bool:
        return self.proc.poll() is not None  # it exits at once when it cannot attach

    def stop(self) -> dict:
        stop(self.proc, signal.SIGINT)
        text = self.log.read_text(errors="replace")
        found = re.search(r"Samples: (\d+) Errors: (\d+)", text)
        ok = self.out.exists() and found is not None
        return {"ok": ok, "samples": int(found[1]) if found else 0, "errors": int(found[2]) if found else None,
                "log_tail": None if ok else text[-1500:]}


def drain_run(kind: str, name: str, server: Any, n: int, *, profile: bool = False, rate: int = 250) -> dict:
    """Fill a fresh store with ``n`` jobs, drain it with one worker process, measure it
    (``profile``: with py-spy recording the worker from its first completion to its last)."""
    store = fresh_store(kind, name, server)
    enqueue = fill(store, n)
    probe = speed_probe()
    run_dir = WORK / "run" / f"{name}-worker"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    conn = store.connect()
    poller_pid = store.query(conn, "SELECT pg_backend_pid()")[0] if kind == "postgresql" else None
    progress = f"SELECT COALESCE(MAX(id), 0) FROM {TABLES[kind][1]}"  # one execution row per ack, ids in order
    with open(run_dir / "worker.log", "wb") as worker_log:
        spawned = time.perf_counter()
        proc = subprocess.Popen(worker_command(store.url), env=worker_env(store.url),
                                cwd=str(APP_DIR), stdout=worker_log, stderr=subprocess.STDOUT, start_new_session=True)
    worker = psutil.Process(proc.pid)
    first = last = None
    spy: PySpy | None = None
    spy_result: dict | None = None
    try:
        while True:
            done = store.query(conn, progress)[0]
            if first is None and done > 0:
                first = Snapshot.take(done, worker, server, poller_pid)
                if profile:
                    spy = PySpy(proc.pid, run_dir / "py-spy.txt", rate)
            if done >= n:
                last = Snapshot.take(done, worker, server, poller_pid)
                break
            if proc.poll() is not None or time.perf_counter() - spawned > DRAIN_CAP:
                raise RuntimeError(f"{name}: the worker exited or stalled at {done}/{n} (see {run_dir})")
            if spy is not None and spy.failed() and spy_result is None:
                spy_result = spy.stop()
            time.sleep(POLL)
        if spy is not None and spy_result is None:
            spy_result = spy.stop()
        whole, roles = worker.cpu_times(), thread_roles(proc.pid)
    finally:
        if spy is not None and spy.proc.poll() is None:
            stop(spy.proc, signal.SIGINT)
        code = stop(proc)
    record = {"kind": "worker", "store": kind, "name": name, "jobs": n, "enqueue": enqueue, "probe_ms": probe,
              "spawn_to_all_done_s": last.t - spawned, "window": window(first, last, roles),
              "whole_process_cpu_us_per_job": (whole.user + whole.system) / n * 1e6, "exit_code": code}
    record.update(store_checks(store, conn))
    conn.close()
    if profile:
        record["profiler"] = {"tool": "py-spy", "rate": rate, **(spy_result or {"ok": False}),
                              "file": str(run_dir / "py-spy.txt"),
                              "thread_times_s": {tid: [cpu - first.threads.get(tid, (0.0, 0.0))[0],
                                                       wait - first.threads.get(tid, (0.0, 0.0))[1]]
                                                 for tid, (cpu, wait) in last.threads.items()}}
    if not profile and code == 0:
        shutil.rmtree(run_dir, ignore_errors=True)
    store.drop()
    return record


def store_checks(store: Store, conn: Any) -> dict:
    """The store's own record of the drain: rate over its stamps, exchanges, exactly-once."""
    jobs, executions = TABLES[store.kind]
    first, last, done = store.query(
        conn, f"SELECT MIN(started_at), MAX(finished_at), COUNT(*) FROM {jobs} WHERE state = 'done'")
    exchanges = store.query(conn, f"SELECT COUNT(*) FROM (SELECT 1 FROM {executions} "
                                  f"WHERE outcome = 'ack' GROUP BY worker, finished_at) AS settles")[0]
    rows, distinct = store.query(conn, f"SELECT COUNT(*), COUNT(DISTINCT job_id) FROM {executions}")
    span = float(last) - float(first) if first is not None and last is not None else None
    return {"rate": done / span if span else None, "claim_to_last_completion_s": span,
            "jobs_per_settle": rows / exchanges if exchanges else None,
            "checks": {"done": done, "executions": rows, "duplicate_executions": rows - distinct,
                       "not_done": store.query(conn, f"SELECT COUNT(*) FROM {jobs} WHERE state <> 'done'")[0]}}


# ---------------------------------------------------------------------------------------------
# (c): the raw limit, the same pattern straight against the tables.
# ---------------------------------------------------------------------------------------------

def raw_sqlite(store: Store, batch: int) -> int:
    sql = RAW_SQL["sqlite"]
    conn = sqlite3.connect(store.path, timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    done = 0
    while True:
        now = time.time()
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(sql["claim"], (RAW_OWNER, now + 30, now, "default", now, batch)).fetchall()
        conn.executemany(sql["done"], [(now, row[0]) for row in rows])
        conn.executemany(sql["record"], [(row[0], row[7], RAW_OWNER, now, now) for row in rows])
        conn.execute("COMMIT")
        done += len(rows)
        if len(rows) < batch:
            conn.close()
            return done


def raw_postgres(store: Store, batch: int) -> int:
    import psycopg

    sql = RAW_SQL["postgresql"]
    done = 0
    with psycopg.connect(store.dsn, autocommit=True) as conn:
        while True:
            now = time.time()
            with conn.transaction():
                rows = conn.execute(sql["claim"], (RAW_OWNER, now + 30, now, "default", now, batch)).fetchall()
                ids = [row[0] for row in rows]
                if ids:
                    conn.execute(sql["done"], (now, ids))
                    conn.execute(sql["record"], (RAW_OWNER, now, now, ids, [row[7] for row in rows]))
            done += len(rows)
            if len(rows) < batch:
                return done


def raw_run(kind: str, name: str, server: Any, n: int, batch: int) -> dict:
    store = fresh_store(kind, name, server)
    fill(store, n)
    probe = speed_probe()
    loop: Callable[[Store, int], int] = raw_sqlite if kind == "sqlite" else raw_postgres
    cpu, (busy, steal), srv, began = time.process_time(), machine_busy(), server_cpu(server), time.perf_counter()
    done = loop(store, batch)
    seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
    srv, busy, steal = server_cpu(server) - srv, machine_busy()[0] - busy, machine_busy()[1] - steal
    conn = store.connect()
    checks = store_checks(store, conn)["checks"]
    conn.close()
    store.drop()
    return {"kind": "raw", "store": kind, "name": name, "jobs": done, "batch": batch, "seconds": seconds,
            "rate": done / seconds, "cpu_us_per_job": cpu / done * 1e6,
            "server_cpu_us_per_job": srv / done * 1e6 if server is not None else None,
            "other_load_cores": max(0.0, (busy - cpu - srv) / seconds), "steal_cores": steal / seconds,
            "probe_ms": probe, "checks": checks}


# ---------------------------------------------------------------------------------------------
# Profiles: areas, threads, functions.
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Frame:
    func: str
    path: str
    line: int

    @property
    def file(self) -> str:
        """Short name: flexiqd/..., psycopg/..., or the stdlib module's path (json/encoder.py)."""
        for marker in ("/flexiqd/", "-packages/", "/python3.11/", "/python3/"):
            if marker in self.path:
                rest = self.path.rsplit(marker, 1)[1]
                return f"flexiqd/{rest}" if marker == "/flexiqd/" else rest
        return self.path

    @property
    def source(self) -> str:
        return linecache.getline(self.path, self.line).strip() if self.line else ""

    def label(self, with_line: bool = False) -> str:
        return f"{self.func} ({self.file}{f':{self.line}' if with_line else ''})"


AREAS = {
    "sql": "db: SQL statements in C (sqlite3 module + SQLite: prepare, step, fetch)",
    "txn": "db: BEGIN / COMMIT (SQLite: with the WAL write and fsync's CPU; PostgreSQL: their round trips)",
    "libpq": "db: libpq calls through ctypes (send, results, values: psycopg/pq)",
    "dbwait": "db: waiting for the server's answer (psycopg wait_select: select() and the wake-up)",
    "adapt": "db: psycopg adapting parameters / loading rows",
    "driver": "db: psycopg Python (cursor, query, connection)",
    "store": "store Python (flexiqd/queue: statements, settle and claim logic)",
    "rows": "rows -> Job (_row_to_job, Job dataclass, JobState enum)",
    "json": "JSON encode/decode",
    "exec": "worker: running tasks (execution.py: start, execute, report; the no-op itself)",
    "loop": "worker: claim loop and bookkeeping (runtime.py)",
    "asyncio": "asyncio loop: epoll wait and wake-up, callbacks, futures",
    "selfpipe": "asyncio cross-thread wake-ups (call_soon_threadsafe's self-pipe send/recv)",
    "threads": "thread hand-offs: queue get/put waking task threads and the store thread, locks",
    "logging": "logging",
    "flexiqd": "flexiqd, other modules",
    "other": "other",
}
# Helpers whose time belongs to their caller's area (a dataclass __init__, an enum lookup, a with).
GENERIC = ("<string>", "enum.py", "dataclasses.py", "contextlib.py", "functools.py", "abc.py", "typing.py",
           "ctypes/__init__.py")
STORE_FILES = ("flexiqd/queue/sqlite/sql.py", "flexiqd/queue/sqlite/database.py", "flexiqd/queue/postgres/sql.py",
               "flexiqd/queue/postgres/database.py", "flexiqd/queue/store/lifecycle.py",
               "flexiqd/queue/store/admission.py", "flexiqd/queue/postgres/listen.py")
SQL_CALL = re.compile(r"\.(execute|executemany|fetchall|fetchone)\(|\bfor .* in conn\.")
FRAME = re.compile(r"^(?P<func>.*) \((?P<path>[^()]*?)(?::(?P<line>\d+))?\)$")


def area_of(frames: tuple[Frame, ...]) -> str:
    """The area a sample's CPU belongs to, from its leaf frame (and callers, for helpers)."""
    leaf = frames[-1]
    if leaf.file.startswith("json/") or "_json" in leaf.func:
        return "json"
    if leaf.file.startswith("logging/"):
        return "logging"
    if any(f.func == "_row_to_job" for f in frames):
        return "rows"
    if any(f.file == "psycopg/transaction.py" for f in frames):
        return "txn"
    frame = next((f for f in reversed(frames) if f.file not in GENERIC), leaf)
    file = frame.file
    if file == "flexiqd/queue/sqlite/database.py" and frame.func == "_transaction":
        return "txn"
    if file in STORE_FILES:
        return "sql" if file.startswith("flexiqd/queue/sqlite/") and SQL_CALL.search(frame.source) else "store"
    if file.startswith("psycopg/"):
        if file == "psycopg/waiting.py":
            return "dbwait"
        if file.startswith("psycopg/pq/"):
            return "libpq"
        if file in ("psycopg/_transform.py", "psycopg/adapt.py") or file.startswith("psycopg/types/"):
            return "adapt"
        return "driver"
    if file == "flexiqd/worker/execution.py" and "._work.get()" in frame.source:
        return "threads"  # a task thread waiting for its next run
    if file == "flexiqd/worker/execution.py" or file.endswith("hotpath_app.py"):
        return "exec"
    if file.startswith("flexiqd/worker/"):
        return "loop"
    if file.startswith("flexiqd/"):
        return "flexiqd"
    if frame.func.rpartition(".")[2] in ("_write_to_self", "_read_from_self", "call_soon_threadsafe"):
        return "selfpipe"
    if file.startswith("asyncio/") or file == "selectors.py":
        return "asyncio"
    if file in ("threading.py", "queue.py") or file.startswith("concurrent/"):
        return "threads"
    return "other"


def read_pyspy(path: Path) -> list[tuple[int, str, tuple[Frame, ...], int]]:
    """py-spy's raw output with --threads: (thread id, thread name, frames root first, samples)."""
    samples = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        head, _, rest = stack.partition(";")
        thread = re.match(r"thread \((\d+)\): ?(.*)$", head)
        if not thread or not rest or not count.isdigit():
            continue
        frames = []
        for text in rest.split(";"):
            m = FRAME.match(text)
            frames.append(Frame(m["func"], m["path"], int(m["line"] or 0)) if m else Frame(text, "?", 0))
        samples.append((int(thread[1]), thread[2], tuple(frames), int(count)))
    return samples


def weigh_pyspy(samples: list[tuple[int, str, tuple[Frame, ...], int]], thread_times: dict[int, list[float]],
                rate: int, jobs: int) -> tuple[list[tuple[tuple[Frame, ...], str, float]], list[dict]]:
    """Give each sample its thread's CPU seconds per sample (measured over the same window).

    py-spy counts a thread whenever it is runnable, waiting for a core included, so
    raw sample shares overstate threads that queue for the 2 cores; weighting by each
    thread's measured CPU makes every figure CPU time.  A thread's samples still split
    its CPU by where it was seen runnable: the lines where it wakes up (epoll, a queue's
    get) also carry up to its time waiting for a core, given per thread (schedstat).
    """
    per_thread = collections.Counter()
    names: dict[int, str] = {}
    for tid, name, _, count in samples:
        per_thread[tid] += count
        names[tid] = name
    thread_times = {int(tid): times for tid, times in thread_times.items()}  # JSON keys are text
    weighted = [(frames, role_of(names[tid]), count * thread_times.get(tid, (0.0, 0.0))[0] / per_thread[tid])
                for tid, _, frames, count in samples]
    threads = [{"thread": names.get(tid, "(no samples)"), "tid": tid, "cpu_us_per_job": cpu / jobs * 1e6,
                "runqueue_wait_us_per_job": wait / jobs * 1e6,
                "sampled_us_per_job": per_thread.get(tid, 0) / rate / jobs * 1e6}
               for tid, (cpu, wait) in sorted(thread_times.items(), key=lambda item: -item[1][0])
               if per_thread.get(tid) or cpu > 0]
    return weighted, threads


def summarise_profile(weighted: list[tuple[tuple[Frame, ...], str, float]], jobs: int, top: int = 15) -> dict:
    """CPU by area, thread, function (self), line (self) and flexiqd function (inclusive):
    each as a share of the profiled CPU and as microseconds per job."""
    total = sum(seconds for _, _, seconds in weighted) or 1.0
    areas: collections.Counter = collections.Counter()
    threads: collections.Counter = collections.Counter()
    functions: collections.Counter = collections.Counter()
    lines: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    function_areas: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for frames, thread, seconds in weighted:
        area = area_of(frames)
        areas[area] += seconds
        threads[thread] += seconds
        leaf = frames[-1]
        functions[leaf.label()] += seconds
        function_areas[leaf.label()][area] += seconds
        lines[f"{leaf.label(True)}: {leaf.source[:90]}"] += seconds
        for label in {f.label() for f in frames if f.file.startswith("flexiqd/queue/")}:
            inclusive[label] += seconds

    def rows(counter: collections.Counter, n: int | None = None, **extra: Callable[[Any], Any]) -> list[dict]:
        return [{"name": key, "share": value / total, "us_per_job": value / jobs * 1e6,
                 **{field: fn(key) for field, fn in extra.items()}} for key, value in counter.most_common(n)]

    return {"cpu_s": total, "jobs": jobs, "us_per_job": total / jobs * 1e6,
            "areas": rows(areas, label=lambda key: AREAS[key]),
            "threads": rows(threads),
            "top_self": rows(functions, top, area=lambda key: function_areas[key].most_common(1)[0][0]),
            "top_lines": rows(lines, top),
            "top_inclusive_store": rows(inclusive, top) if any(len(f) > 1 for f, _, _ in weighted) else []}


# ---------------------------------------------------------------------------------------------
# Summary and report.
# ---------------------------------------------------------------------------------------------

WORKER_FIGURES = ("rate", "cpu_us_per_job", "user_us_per_job", "sys_us_per_job", "server_cpu_us_per_job",
                  "worker_cores", "ctx_voluntary_per_job", "ctx_involuntary_per_job", "other_load_cores",
                  "steal_cores")


def summarise(results: dict) -> dict:
    summary: dict[str, Any] = {}
    for kind in results["config"]["stores"]:
        workers = [r for r in results["runs"] if r["kind"] == "worker" and r["store"] == kind]
        raws = [r for r in results["runs"] if r["kind"] == "raw" and r["store"] == kind]
        s: dict[str, Any] = {
            "worker": {
                "rate_store_span": median(r["rate"] for r in workers),
                "rate_store_span_range": spread(r["rate"] for r in workers),
                **{f"window_{key}": median(r["window"].get(key) for r in workers) for key in WORKER_FIGURES},
                "cpu_us_per_job_range": spread(r["window"].get("cpu_us_per_job") for r in workers),
                "threads": {role: {key: median(r["window"]["threads"].get(role, {}).get(key) for r in workers)
                                   for key in ("cpu_us_per_job", "wait_us_per_job")}
                            for role in sorted({role for r in workers for role in r["window"].get("threads", {})})},
                "whole_process_cpu_us_per_job": median(r["whole_process_cpu_us_per_job"] for r in workers),
                "jobs_per_settle": median(r["jobs_per_settle"] for r in workers),
                "probe_ms": median(r["probe_ms"] for r in workers),
                "enqueue_client_cpu_us_per_job": median(r["enqueue"]["client_cpu_us_per_job"] for r in workers),
                "enqueue_rate": median(r["enqueue"]["rate"] for r in workers),
                "duplicates": sum(r["checks"]["duplicate_executions"] for r in workers),
                "not_done": sum(r["checks"]["not_done"] for r in workers),
            },
            "raw": {
                "rate": median(r["rate"] for r in raws), "rate_range": spread(r["rate"] for r in raws),
                "cpu_us_per_job": median(r["cpu_us_per_job"] for r in raws),
                "cpu_us_per_job_range": spread(r["cpu_us_per_job"] for r in raws),
                "server_cpu_us_per_job": median(r["server_cpu_us_per_job"] for r in raws),
                "other_load_cores": median(r["other_load_cores"] for r in raws),
                "steal_cores": median(r["steal_cores"] for r in raws),
                "probe_ms": median(r["probe_ms"] for r in raws),
            },
        }
        cpu = s["worker"]["window_cpu_us_per_job"]
        if s["raw"]["cpu_us_per_job"] and cpu:
            s["worker_over_raw_cpu"] = cpu / s["raw"]["cpu_us_per_job"]
        summary[kind] = s
    return summary


def fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def report(results: dict) -> str:
    code, machine, config = results["code"], results["machine"], results["config"]
    lines = [f"flexiqd from {code['flexiqd_package']} ({code['commit']}"
             f"{', with uncommitted changes' if code['uncommitted_changes_in_flexiqd'] else ''}); "
             f"{machine['cpus']} CPUs, Python {machine['python']}, SQLite {machine['sqlite']}, "
             f"psycopg {machine['psycopg']} ({machine['psycopg_impl']}).",
             f"Medians of {config['reps']} rounds; {config['jobs']:,} no-op jobs per drain, one worker "
             f"process (--concurrency 4); raw batches of {config['raw_batch']}.", ""]
    for kind in config["stores"]:
        s = results["summary"][kind]
        w, r = s["worker"], s["raw"]
        lines += [f"== {kind}",
                  f"worker: {fmt(w['rate_store_span'])} jobs/s (store stamps; rounds "
                  f"{' - '.join(fmt(x) for x in w['rate_store_span_range'] or [])}), "
                  f"{fmt(w['window_cpu_us_per_job'], 1)} us CPU/job in the worker "
                  f"(user {fmt(w['window_user_us_per_job'], 1)}, sys {fmt(w['window_sys_us_per_job'], 1)}; rounds "
                  f"{' - '.join(fmt(x, 1) for x in w['cpu_us_per_job_range'] or [])})"
                  + (f", server {fmt(w['window_server_cpu_us_per_job'], 1)} us/job"
                     if w["window_server_cpu_us_per_job"] is not None else ""),
                  f"        {fmt(w['window_worker_cores'], 2)} cores busy in the worker, "
                  f"{fmt(w['window_ctx_voluntary_per_job'], 2)} voluntary context switches/job, "
                  f"{fmt(w['jobs_per_settle'], 1)} jobs per settle; enqueue (excluded) "
                  f"{fmt(w['enqueue_client_cpu_us_per_job'], 1)} us CPU/job; duplicates {w['duplicates']}, "
                  f"not done {w['not_done']}",
                  f"        machine: other load {fmt(w['window_other_load_cores'], 2)} cores, steal "
                  f"{fmt(w['window_steal_cores'], 2)} cores, Python speed probe {fmt(w['probe_ms'], 0)} ms CPU",
                  "        threads, us/job on a CPU (waiting for a core): " + ", ".join(
                      f"{role} {fmt(t['cpu_us_per_job'], 1)} ({fmt(t['wait_us_per_job'], 1)})"
                      for role, t in sorted(w["threads"].items(), key=lambda item: -(item[1]["cpu_us_per_job"] or 0))
                      if (t["cpu_us_per_job"] or 0) >= 0.05),
                  f"raw:    {fmt(r['rate'])} jobs/s, {fmt(r['cpu_us_per_job'], 1)} us CPU/job"
                  + (f", server {fmt(r['server_cpu_us_per_job'], 1)} us/job" if r["server_cpu_us_per_job"] else "")
                  + (f"; worker/raw CPU {s['worker_over_raw_cpu']:.1f}x" if "worker_over_raw_cpu" in s else "")]
        profile = results["profiles"].get(kind) or {}
        summary = profile.get("summary")
        if not summary:
            lines += [f"profile: none ({profile.get('note', 'not run')})", ""]
            continue
        lines.append(f"profile: {profile['note']}; {fmt(summary['us_per_job'], 1)} us CPU/job in that run")
        for title, key, name in (("by area", "areas", "label"), ("by thread", "threads", "name"),
                                 ("top functions, self time", "top_self", "name"),
                                 ("top lines, self time", "top_lines", "name"),
                                 ("store functions (flexiqd/queue), inclusive of callees", "top_inclusive_store",
                                  "name")):
            lines.append(f"  {title}:")
            for row in summary[key]:
                extra = f"  [{row['area']}]" if "area" in row else ""
                lines.append(f"  {row['share'] * 100:5.1f} %  {row['us_per_job']:6.1f} us/job  {row[name]}{extra}")
        if profile.get("threads"):
            lines.append("  each thread, us/job: on a CPU / waiting for a core / seen runnable by py-spy:")
            for row in profile["threads"]:
                lines.append(f"    {row['thread']:24} {row['cpu_us_per_job']:6.1f} / "
                             f"{row['runqueue_wait_us_per_job']:6.1f} / {row['sampled_us_per_job']:6.1f}")
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------

def profile_store(kind: str, server: Any, n: int, rate: int, attempts: int = 2) -> dict:
    """One drain with py-spy recording the worker (run again should py-spy fail to attach)."""
    if not PY_SPY.exists():
        return {"tool": None, "note": f"no py-spy at {PY_SPY} (bench/.work/venv/bin/pip install py-spy)",
                "summary": None}
    failures = []
    for _ in range(attempts):
        run = drain_run(kind, f"hp_{kind[:2]}_profile", server, n, profile=True, rate=rate)
        profiler = run["profiler"]
        if not profiler["ok"]:
            failures.append(f"py-spy failed: {(profiler.get('log_tail') or '').strip()[-300:]}")
            log(failures[-1])
            continue
        jobs = run["window"]["jobs"]
        samples = read_pyspy(Path(profiler["file"]))
        weighted, threads = weigh_pyspy(samples, profiler["thread_times_s"], rate, jobs)
        note = (f"py-spy --threads --nonblocking at {rate} Hz from the first completion to the last "
                f"({jobs:,} jobs, {profiler['samples']:,} samples, idle threads left out); each thread's "
                f"samples weighted by its measured CPU over the same window")
        return {"tool": "py-spy", "run": run, "note": "; ".join([*failures, note]), "threads": threads,
                "summary": summarise_profile(weighted, jobs)}
    return {"tool": None, "note": "; ".join(failures), "summary": None}


def compare(before_path: str, after_path: str) -> str:
    """Medians of two results files side by side (e.g. before and after a change)."""
    runs = [json.loads(Path(path).read_text()) for path in (before_path, after_path)]
    lines = [f"before: {runs[0]['code']['flexiqd_package']} ({runs[0]['code']['commit']}), {runs[0]['started']}",
             f"after:  {runs[1]['code']['flexiqd_package']} ({runs[1]['code']['commit']}), {runs[1]['started']}",
             f"{'':44} {'before':>12} {'after':>12} {'after/before':>12}"]

    def row(label: str, values: list[float | None], digits: int = 1) -> None:
        ratio = f"{values[1] / values[0]:.2f}x" if values[0] and values[1] else "-"
        lines.append(f"{label:44} {fmt(values[0], digits):>12} {fmt(values[1], digits):>12} {ratio:>12}")

    for kind in STORES:
        if not all(kind in r["summary"] for r in runs):
            continue
        lines.append(f"-- {kind}")
        w = [r["summary"][kind]["worker"] for r in runs]
        raw = [r["summary"][kind]["raw"] for r in runs]
        row("worker jobs/s", [x["rate_store_span"] for x in w], 0)
        row("worker CPU us/job", [x["window_cpu_us_per_job"] for x in w])
        for role in sorted(set(w[0].get("threads", {})) | set(w[1].get("threads", {}))):
            row(f"  {role}", [x.get("threads", {}).get(role, {}).get("cpu_us_per_job") for x in w])
        row("server CPU us/job", [x["window_server_cpu_us_per_job"] for x in w])
        row("raw jobs/s (machine yardstick)", [x["rate"] for x in raw], 0)
        row("raw CPU us/job (machine yardstick)", [x["cpu_us_per_job"] for x in raw])
        row("worker CPU / raw CPU", [r["summary"][kind].get("worker_over_raw_cpu") for r in runs], 2)
        row("other load during the drains, cores", [x["window_other_load_cores"] for x in w], 2)
        row("steal during the drains, cores", [x.get("window_steal_cores") for x in w], 2)
        row("Python speed probe, ms CPU (lower: faster)", [x.get("probe_ms") for x in w], 0)
        summaries = [(r["profiles"].get(kind) or {}).get("summary") or {} for r in runs]
        areas = [{a["name"]: a["us_per_job"] for a in summary.get("areas", [])} for summary in summaries]
        for name in sorted(set(areas[0]) | set(areas[1]), key=lambda n: -(areas[0].get(n) or 0)):
            row(f"  profile: {name}", [areas[0].get(name), areas[1].get(name)])
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, one round: a smoke run")
    parser.add_argument("--json", metavar="PATH", help="write every run, the medians and the profiles here")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20_000, help="no-op jobs per timed drain")
    parser.add_argument("--raw-jobs", type=int, default=None, help="jobs per raw run (default: --jobs)")
    parser.add_argument("--raw-batch", type=int, default=16,
                        help="jobs per raw transaction (default 16: a busy worker's settle batch, UNSETTLED_MAX)")
    parser.add_argument("--profile-jobs", type=int, default=60_000, help="jobs in the profiled drain")
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy profiles")
    parser.add_argument("--profile-rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--stores", default=",".join(STORES), help="comma-separated, of: " + ", ".join(STORES))
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                        help="measure nothing: print the medians of two results files side by side")
    args = parser.parse_args(argv)
    args.stores = [s for s in args.stores.split(",") if s]
    if not args.stores or set(args.stores) - set(STORES):
        parser.error(f"--stores: choose from {', '.join(STORES)}")
    if args.quick:
        args.reps, args.jobs, args.profile_jobs = 1, 2_000, 5_000
    args.raw_jobs = args.raw_jobs or args.jobs
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.compare:
        print(compare(*args.compare))
        return 0
    APP_DIR.mkdir(parents=True, exist_ok=True)
    (APP_DIR / "hotpath_app.py").write_text(APP_SOURCE)
    results: dict[str, Any] = {
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": {"stores": args.stores, "reps": args.reps, "jobs": args.jobs, "raw_jobs": args.raw_jobs,
                   "raw_batch": args.raw_batch, "profile_jobs": args.profile_jobs, "profile": not args.no_profile,
                   "profile_rate": args.profile_rate, "concurrency": 4, "quick": args.quick,
                   "sqlite_url_options": "none (WAL, synchronous=FULL)",
                   "postgresql_server": "pg_throughput_bench.start_server: fsync, synchronous_commit, "
                                        "full_page_writes on; unix socket"},
        "code": code_identity(), "machine": machine_info(), "runs": [], "profiles": {}}
    log(f"measuring {results['code']}")
    wall = time.perf_counter()
    server = None
    try:
        if "postgresql" in args.stores:
            from pg_throughput_bench import start_server
            server = start_server()
            results["machine"]["postgresql"] = server.admin("SHOW server_version")[0][0]
        for rep in range(args.reps):
            for kind in args.stores:
                run = drain_run(kind, f"hp_{kind[:2]}_w{rep}", server if kind == "postgresql" else None, args.jobs)
                results["runs"].append(run)
                w = run["window"]
                log(f"{kind:10} worker round {rep}: {fmt(run['rate'])} jobs/s, {fmt(w.get('cpu_us_per_job'), 1)} us "
                    f"CPU/job (server {fmt(w.get('server_cpu_us_per_job'), 1)}), {fmt(run['jobs_per_settle'], 1)} "
                    f"jobs/settle, other load {fmt(w.get('other_load_cores'), 2)} cores, exit {run['exit_code']}")
            for kind in args.stores:
                run = raw_run(kind, f"hp_{kind[:2]}_r{rep}", server if kind == "postgresql" else None,
                              args.raw_jobs, args.raw_batch)
                results["runs"].append(run)
                log(f"{kind:10} raw    round {rep}: {fmt(run['rate'])} jobs/s, {fmt(run['cpu_us_per_job'], 1)} us "
                    f"CPU/job (server {fmt(run['server_cpu_us_per_job'], 1)}), other load "
                    f"{fmt(run['other_load_cores'], 2)} cores")
        if not args.no_profile:
            for kind in args.stores:
                profile = profile_store(kind, server if kind == "postgresql" else None, args.profile_jobs,
                                        args.profile_rate)
                results["profiles"][kind] = profile
                log(f"{kind:10} profile: {profile['tool']}: {profile['note']}")
    finally:
        if server is not None:
            server.stop()
    results["wall_seconds"] = time.perf_counter() - wall
    results["summary"] = summarise(results)
    print(report(results))
    out = Path(args.json) if args.json else WORK / ("results-quick.json" if args.quick else "results-latest.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    log(f"done in {results['wall_seconds'] / 60:.1f} min; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
