#!/usr/bin/env python3
"""Queue benchmark: flexiqd against flexiq 2.1.0 (SQLite) and huey 3.5.4 (SqliteHuey), side by side.

Run it with ``make bench`` (which builds ``bench/.work/venv`` with the peers from
PyPI and this checkout installed editable), or directly with that venv's python::

    bench/.work/venv/bin/python bench/queue_bench.py [--quick] [--reps 3]

It measures, for flexiqd (durable default and ``?synchronous=normal``), flexiq and
huey, each repeated ``--reps`` times with the libraries interleaved so that noise
on this small machine hits them alike; it reports medians:

1. enqueue rate: one by one, and batched where the library has a batch API;
2. end-to-end jobs/s draining a pre-filled backlog of no-op jobs with 1 and with
   4 worker processes, each library's own worker at its default concurrency
   (completions counted from the store; flexiqd's exactly-once is verified);
3. stats latency with 10^6 jobs queued.

Each measurement runs in a fresh subprocess that imports only the library under
test (``phase`` sub-commands below), so one library's background threads never
run during another's measurement.  Results go to ``bench/results-queue.json``
and to the results section of ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import glob
import json
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
APPS = BENCH / "apps"
WORK = BENCH / ".work" / "run"
PY = sys.executable

LIBS = ("flexiqd-durable", "flexiqd-normal", "flexiq", "huey")
LABELS = {
    "flexiqd-durable": "flexiqd (default: WAL, synchronous=FULL)",
    "flexiqd-normal": "flexiqd (?synchronous=normal)",
    "flexiq": "flexiq 2.1.0 (SQLite; WAL, synchronous=NORMAL)",
    "huey": "huey 3.5.4 SqliteHuey (WAL, synchronous=FULL)",
}
BATCH_API = {"flexiqd-durable": "task.map", "flexiqd-normal": "task.map", "flexiq": "task.map",
             "huey": None}
FLEXIQ_MAIN = "import sys; sys.argv[0] = 'flexiq'; from flexiq.cli import main; main()"
# flexiq's own job states (its jobs/archived_jobs.status column): 2 is "completed".
FLEXIQ_COMPLETED = 2


def log(message: str) -> None:
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    print(f"[{stamp}] {message}", file=sys.stderr, flush=True)


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


# ---------------------------------------------------------------------------------------------
# Phases: each runs in its own subprocess and prints one JSON object as its last line.
# ---------------------------------------------------------------------------------------------

def store_location(lib: str, db: str) -> str:
    """What the app module reads from $BENCH_DB: a flexiqd URL, else a file path."""
    if lib == "flexiqd-durable":
        return f"sqlite:///{db}"
    if lib == "flexiqd-normal":
        return f"sqlite:///{db}?synchronous=normal"
    return db


def _import_app(lib: str, db: str, url: str | None = None):
    os.environ["BENCH_DB"] = url or store_location(lib, db)
    os.environ.setdefault("BENCH_OUT", str(Path(db).parent))
    sys.path.insert(0, str(APPS))
    if lib.startswith("flexiqd"):
        import bench_flexiqd as app
    elif lib == "flexiq":
        import bench_flexiq as app
    else:
        import bench_huey as app
    return app


def _close(lib: str, app) -> None:
    with contextlib.suppress(Exception):
        if lib == "huey":
            app.huey.storage.close()
        else:
            app.queue.close()


def phase_enqueue(lib: str, db: str, n: int, mode: str, batch: int, start: int = 0) -> dict:
    """Enqueue ``n`` no-op jobs (args start..start+n-1) one by one or in batches; time it."""
    app = _import_app(lib, db)
    # Open the store (and create its schema) before the clock starts.
    if lib == "huey":
        app.huey.pending_count()
    elif lib == "flexiq":
        app.queue.stats()
    else:
        app.queue.stats("default")
    args = list(range(start, start + n))
    began = time.perf_counter()
    if mode == "one":
        if lib == "huey":
            for i in args:
                app.noop(i)
        elif lib == "flexiq":
            for i in args:
                app.noop.delay(i)
        else:
            for i in args:
                app.noop.enqueue(i)
    else:
        if lib == "huey":
            raise SystemExit("huey has no batch enqueue API")
        for k in range(0, n, batch):
            app.noop.map([(i,) for i in args[k:k + batch]])
    seconds = time.perf_counter() - began
    _close(lib, app)
    return {"n": n, "seconds": seconds, "rate": n / seconds}


def phase_fill(lib: str, db: str, n: int, chunk: int) -> dict:
    """Fill a store with ``n`` queued jobs as fast as the library allows (for the stats test).

    flexiqd: ``task.map`` in chunks under ``?synchronous=normal``.  flexiq: ``task.map`` in
    chunks.  huey has no batch API: its own INSERT statement (``SqliteStorage.enqueue``'s)
    with messages from ``huey.serialize_task``, many rows per transaction.
    """
    url = f"sqlite:///{db}?synchronous=normal" if lib.startswith("flexiqd") else None
    app = _import_app(lib, db, url)
    began = time.perf_counter()
    if lib == "huey":
        storage = app.huey.storage
        for k in range(0, n, chunk):
            rows = [(storage.name, app.huey.serialize_task(app.noop.s(i)), 0)
                    for i in range(k, min(n, k + chunk))]
            with storage.db(commit=True) as cursor:
                cursor.executemany("insert into task (queue, data, priority) values (?, ?, ?)", rows)
    else:
        for k in range(0, n, chunk):
            app.noop.map([(i,) for i in range(k, min(n, k + chunk))])
    seconds = time.perf_counter() - began
    _close(lib, app)
    return {"n": n, "seconds": seconds, "rate": n / seconds,
            "how": "huey's INSERT via executemany" if lib == "huey" else "task.map"}


def phase_stats(lib: str, db: str, calls: int, settle: int) -> dict:
    """Time the library's queue-stats call ``calls`` times after one untimed first call.

    flexiqd: ``queue.backend.stats("default", now=...)`` on the durable URL.  flexiq:
    ``queue.stats()`` (what its autoscaler reads) and ``queue.stats_by_queue("default")``.
    huey: ``huey.pending_count()`` (what ``len(huey)`` returns).  With ``settle`` > 0,
    flexiqd also claims and acks that many jobs and is timed again, so the duration
    percentiles and rates have recent completions to read.
    """
    app = _import_app(lib, db)
    result: dict[str, Any] = {}

    def timed(fn) -> tuple[float, list[float], Any]:
        t = time.perf_counter()
        value = fn()
        first = (time.perf_counter() - t) * 1000
        samples = []
        for _ in range(calls):
            t = time.perf_counter()
            value = fn()
            samples.append((time.perf_counter() - t) * 1000)
        return first, samples, value

    if lib.startswith("flexiqd"):
        backend = app.queue.backend
        first, samples, value = timed(lambda: backend.stats("default", now=time.time()))
        result["stats"] = {"call": "queue.backend.stats('default', now=time.time())", "first_ms": first,
                           "ms": samples, "runnable": value.runnable}
        if settle:
            from flexiqd.queue.types import ClaimRequest, Outcome
            done = 0
            while done < settle:
                jobs = backend.claim(ClaimRequest("bench:stats", ("default",), min(500, settle - done)),
                                     now=time.time())
                backend.settle("bench:stats", [Outcome.ack(j.id) for j in jobs], now=time.time())
                done += len(jobs)
            first, samples, value = timed(lambda: backend.stats("default", now=time.time()))
            result["stats_after_acks"] = {
                "call": f"same, after {done} claims+acks (durations and rates populated)",
                "first_ms": first, "ms": samples, "runnable": value.runnable,
                "completion_rate": value.completion_rate, "duration_p50": value.duration_p50}
    elif lib == "flexiq":
        first, samples, value = timed(app.queue.stats)
        result["stats"] = {"call": "queue.stats()", "first_ms": first, "ms": samples,
                           "runnable": value.get("pending")}
        first, samples, value = timed(lambda: app.queue.stats_by_queue("default"))
        result["stats_by_queue"] = {"call": "queue.stats_by_queue('default')", "first_ms": first,
                                    "ms": samples, "runnable": value.get("pending")}
    else:
        first, samples, value = timed(app.huey.pending_count)
        result["stats"] = {"call": "huey.pending_count()", "first_ms": first, "ms": samples,
                           "runnable": value}
    _close(lib, app)
    return result


PHASES = {"enqueue": phase_enqueue, "fill": phase_fill, "stats": phase_stats}


def run_phase(name: str, timeout: float = 900, **kwargs: Any) -> dict:
    """Run one phase in a fresh interpreter; return its JSON."""
    env = dict(os.environ, PYTHONPATH=str(APPS))
    proc = subprocess.run([PY, str(Path(__file__).resolve()), "phase", name, json.dumps(kwargs)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=str(WORK))
    if proc.returncode != 0:
        raise RuntimeError(f"phase {name} {kwargs} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# Draining a backlog with real worker processes.
# ---------------------------------------------------------------------------------------------

def worker_commands(lib: str, db: str, procs: int) -> list[list[str]]:
    """Each library's own worker, at its default concurrency."""
    if lib.startswith("flexiqd"):
        cmd = [PY, "-m", "flexiqd.cli.flexiq", "--url", store_location(lib, db), "worker",
               "--app", "bench_flexiqd:queue", "--queues", "default", "--concurrency", "4"]
        return [cmd] * procs
    if lib == "flexiq":
        # Its thread pool: Queue(workers=0) -> os.cpu_count() threads per process.
        return [[PY, "-c", FLEXIQ_MAIN, "worker", "--app", "bench_flexiq:queue"]] * procs
    consumer = str(Path(PY).parent / "huey_consumer")
    if procs == 1:
        return [[consumer, "bench_huey.huey"]]  # defaults: -k thread -w 1
    return [[consumer, "bench_huey.huey", "-k", "process", "-w", str(procs)]]


WORKER_SETUP = {
    "flexiqd-durable": "N x `python -m flexiqd.cli.flexiq worker --concurrency 4` (its default)",
    "flexiqd-normal": "N x `python -m flexiqd.cli.flexiq worker --concurrency 4` (its default)",
    "flexiq": "N x `flexiq worker --pool thread` (default; os.cpu_count() = {cpus} threads each)",
    "huey": "1 process: `huey_consumer -k thread -w 1` (default); 4: `huey_consumer -k process -w 4`",
}


class Counter:
    """Completions as the store records them (huey's store keeps none: its task files)."""

    def __init__(self, lib: str, db: str, out: str) -> None:
        self.lib, self.db, self.out = lib, db, out
        self.conn: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        if self.conn is None:
            self.conn = sqlite3.connect(self.db, timeout=5, isolation_level=None)
        return self.conn

    def completed(self) -> int:
        if self.lib.startswith("flexiqd"):
            row = self._connect().execute(
                "SELECT COALESCE(SUM(n), 0) FROM counts WHERE queue = 'default' AND state = 'done'").fetchone()
            return row[0]
        if self.lib == "flexiq":
            row = self._connect().execute(
                "SELECT (SELECT COUNT(*) FROM archived_jobs WHERE status = ?) + "
                "(SELECT COUNT(*) FROM jobs WHERE status = ?)",
                (FLEXIQ_COMPLETED, FLEXIQ_COMPLETED)).fetchone()
            return row[0]
        total = 0
        for path in glob.glob(os.path.join(self.out, "ran-*.txt")):
            with open(path, "rb") as f:
                total += f.read().count(b"\n")
        return total

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def read_runs(out: str) -> tuple[collections.Counter, collections.Counter, list[float]]:
    """Per-process task files: counts by argument, by flexiqd job id, and run times."""
    by_arg: collections.Counter = collections.Counter()
    by_id: collections.Counter = collections.Counter()
    stamps: list[float] = []
    for path in glob.glob(os.path.join(out, "ran-*.txt")):
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) != 3:
                    continue
                by_arg[int(parts[0])] += 1
                if parts[1] != "-":
                    by_id[int(parts[1])] += 1
                stamps.append(float(parts[2]))
    return by_arg, by_id, stamps


def stop_workers(lib: str, procs: list[subprocess.Popen], timeout: float = 60) -> list[int | None]:
    graceful = signal.SIGINT if lib == "huey" else signal.SIGTERM  # huey: INT is its graceful stop
    for p in procs:
        if p.poll() is None:
            p.send_signal(graceful)
    deadline = time.monotonic() + timeout
    codes: list[int | None] = []
    for p in procs:
        try:
            codes.append(p.wait(max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # its own session: the workers it forked
            p.wait()
            codes.append(None)
    return codes


def drain_run(lib: str, procs: int, rep: int, n: int, cap: float, profile: str | None = None) -> dict:
    run_dir = WORK / f"drain-{lib}-{procs}p-{rep}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    db = str(run_dir / "store.db")
    mode = "batch" if BATCH_API[lib] else "one"
    fill = run_phase("enqueue", lib=lib, db=db, n=n, mode=mode, batch=1000)
    env = dict(os.environ, PYTHONPATH=str(APPS), BENCH_DB=store_location(lib, db), BENCH_OUT=str(run_dir))
    counter = Counter(lib, db, str(run_dir))
    commands = worker_commands(lib, db, procs)
    logs = [open(run_dir / f"worker-{k}.log", "wb") for k in range(len(commands))]
    began = time.perf_counter()
    workers = [subprocess.Popen(cmd, env=env, cwd=str(run_dir), stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True) for cmd, log_file in zip(commands, logs)]
    spies = []
    if profile:
        spy = shutil.which("py-spy", path=f"{Path(PY).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        if spy is None:
            raise SystemExit("--profile needs py-spy: bench/.work/venv/bin/pip install py-spy")
        spies = [subprocess.Popen([spy, "record", "--nonblocking", "--idle", "--threads", "-r", "250", "-f", "raw", "-o",
                                   os.path.join(profile, f"{lib}-{procs}p-{k}.txt"), "--pid", str(w.pid)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for k, w in enumerate(workers)]
    samples: list[tuple[float, int]] = []
    crashed = None
    while True:
        try:
            done = counter.completed()
        except sqlite3.OperationalError:
            done = samples[-1][1] if samples else 0
        elapsed = time.perf_counter() - began
        samples.append((elapsed, done))
        if done >= n or elapsed >= cap:
            break
        if any(w.poll() is not None for w in workers):
            crashed = [w.returncode for w in workers]
            break
        time.sleep(0.05)
    codes = stop_workers(lib, workers)
    for spy in spies:
        spy.wait(30)
    for log_file in logs:
        log_file.close()
    counter.close()
    final = Counter(lib, db, str(run_dir))
    completed_after_stop = final.completed()
    by_arg, by_id, stamps = read_runs(str(run_dir))
    diagnostics: dict[str, Any] = {}
    checks: dict[str, Any] = {
        "ran_lines": sum(by_arg.values()), "ran_unique": len(by_arg),
        "duplicate_runs": sum(c - 1 for c in by_arg.values() if c > 1),
    }
    if lib.startswith("flexiqd"):
        conn = final._connect()
        checks["duplicate_acks_in_executions"] = conn.execute(
            "SELECT COUNT(*) FROM (SELECT job_id FROM executions WHERE outcome = 'ack' "
            "GROUP BY job_id HAVING COUNT(*) > 1)").fetchone()[0]
        checks["jobs_with_more_than_one_attempt"] = conn.execute(
            "SELECT COUNT(*) FROM jobs WHERE attempts > 1").fetchone()[0]
        checks["executions"] = conn.execute("SELECT COUNT(*) FROM executions").fetchone()[0]
        checks["duplicate_job_ids_in_files"] = sum(c - 1 for c in by_id.values() if c > 1)
        checks["not_done"] = conn.execute(
            "SELECT COUNT(*) FROM jobs WHERE state != 'done'").fetchone()[0]
        # Acks settled together share the transaction's clock reading: jobs per settle.
        settles = conn.execute("SELECT COUNT(*) FROM (SELECT 1 FROM executions WHERE outcome = 'ack' "
                               "GROUP BY worker, finished_at)").fetchone()[0]
        diagnostics["settle_transactions"] = settles
        diagnostics["jobs_per_settle"] = round(checks["executions"] / settles, 2) if settles else None
    if lib == "huey":
        checks["left_in_store"] = final._connect().execute("SELECT COUNT(*) FROM task").fetchone()[0]
    final.close()
    timeboxed = done < n and crashed is None
    first = next((t for t, c in samples if c > 0), None)
    t10 = next((t for t, c in samples if c >= 0.1 * done), None)
    t90 = next((t for t, c in samples if c >= 0.9 * done), None)
    steady = 0.8 * done / (t90 - t10) if t10 is not None and t90 and t90 > t10 else None
    record = {
        "lib": lib, "procs": procs, "rep": rep, "backlog": n, "completed": done, "seconds": elapsed,
        "rate": done / elapsed if elapsed else None, "steady_rate_10_90": steady,
        "first_completion_s": first, "timeboxed": timeboxed, "cap_s": cap, "crashed": crashed,
        "exit_codes": codes, "completed_after_stop": completed_after_stop, "fill": fill,
        "checks": checks, "diagnostics": diagnostics, "workers": [" ".join(["python" if c == PY else c for c in cmd]) for cmd in commands],
    }
    if crashed is None and all(code == 0 for code in codes):
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        record["kept"] = str(run_dir)
    return record


# ---------------------------------------------------------------------------------------------
# The machine.
# ---------------------------------------------------------------------------------------------

def machine_info(directory: Path = WORK) -> dict:
    """The machine, and how many fsync'd commits a SQLite database in ``directory`` does."""
    directory.mkdir(parents=True, exist_ok=True)
    info: dict[str, Any] = {"cpus": os.cpu_count(), "kernel": platform.release(),
                            "python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError):
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                info["memory_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
    with contextlib.suppress(Exception):
        df = subprocess.run(["df", "-T", str(directory)], capture_output=True, text=True).stdout.splitlines()[-1]
        info["filesystem"] = df.split()[1]
    # How many fsync'd SQLite commits this disk does: the ceiling of a durable queue.
    path = directory / "fsync-probe.db"
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (x)")
    began = time.perf_counter()
    for i in range(500):
        conn.execute("INSERT INTO t VALUES (?)", (i,))
    info["fsync_commits_per_s"] = round(500 / (time.perf_counter() - began))
    conn.close()
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(str(path) + suffix)
    return info


def versions() -> dict:
    from importlib.metadata import version

    out: dict[str, Any] = {}
    for dist in ("flexiqd", "flexiq", "huey"):
        with contextlib.suppress(Exception):
            out[dist] = version(dist)
    with contextlib.suppress(Exception):
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "flexiqd"],
                               capture_output=True, text=True).stdout.strip()
        out["flexiqd_commit"] = head + ("+uncommitted changes in flexiqd/" if dirty else "")
    return out


# ---------------------------------------------------------------------------------------------
# Summary and report.
# ---------------------------------------------------------------------------------------------

def summarise(results: dict) -> dict:
    libs = results["config"]["libs"]
    summary: dict[str, Any] = {"enqueue": {}, "drain": {}, "stats_ms": {}, "ratios": {}, "aims": {}}
    for lib in libs:
        rows = results["enqueue"].get(lib, {})
        summary["enqueue"][lib] = {mode: median([r["rate"] for r in rows.get(mode, [])]) for mode in ("one", "batch")}
        summary["enqueue"][lib]["range"] = {mode: [min(r["rate"] for r in rows[mode]), max(r["rate"] for r in rows[mode])]
                                            for mode in ("one", "batch") if rows.get(mode)}
        runs = [r for r in results["drain"] if r["lib"] == lib]
        summary["drain"][lib] = {}
        for procs in results["config"]["procs"]:
            mine = [r for r in runs if r["procs"] == procs]
            summary["drain"][lib][str(procs)] = {
                "rate": median([r["rate"] for r in mine]),
                "range": [min(r["rate"] for r in mine), max(r["rate"] for r in mine)] if mine else None,
                "steady_rate": median([r["steady_rate_10_90"] for r in mine]),
                "first_completion_s": median([r["first_completion_s"] for r in mine]),
                "timeboxed": any(r["timeboxed"] for r in mine),
                "completed": [r["completed"] for r in mine],
            }
        stats = results["stats"].get("flexiqd-durable" if lib == "flexiqd-normal" else lib)
        if stats:
            all_ms = [ms for s in stats["runs"] for ms in s["stats"]["ms"]]
            summary["stats_ms"][lib] = {"median": median(all_ms), "max": max(all_ms),
                                        "call": stats["runs"][0]["stats"]["call"]}
            extra = [ms for s in stats["runs"] for ms in s.get("stats_after_acks", {}).get("ms", [])]
            if extra:
                summary["stats_ms"][lib]["median_after_acks"] = median(extra)
            extra = [ms for s in stats["runs"] for ms in s.get("stats_by_queue", {}).get("ms", [])]
            if extra:
                summary["stats_ms"][lib]["median_stats_by_queue"] = median(extra)

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    for ours in ("flexiqd-durable", "flexiqd-normal"):
        if ours not in libs:
            continue
        for peer in ("flexiq", "huey"):
            if peer not in libs:
                continue
            key = f"{ours}/{peer}"
            e_o, e_p = summary["enqueue"][ours], summary["enqueue"][peer]
            d_o, d_p = summary["drain"][ours], summary["drain"][peer]
            summary["ratios"][key] = {
                "enqueue_one": ratio(e_o["one"], e_p["one"]),
                "enqueue_batch": ratio(e_o["batch"], e_p["batch"] or e_p["one"]),
                **{f"drain_{p}p": ratio(d_o[p]["rate"], d_p[p]["rate"]) for p in d_o},
                "stats_latency": ratio(summary["stats_ms"].get(ours, {}).get("median"),
                                       summary["stats_ms"].get(peer, {}).get("median")),
            }
    top = str(max(results["config"]["procs"]))
    for ours in ("flexiqd-durable", "flexiqd-normal"):
        if ours not in libs:
            continue
        mine = summary["drain"][ours][top]["rate"]
        aims = {}
        if "flexiq" in libs:
            theirs = summary["drain"]["flexiq"][top]["rate"]
            aims["a_throughput_ge_flexiq"] = {"ours": mine, "theirs": theirs,
                                              "met": bool(mine and theirs and mine >= theirs)}
        if "huey" in libs:
            theirs = summary["drain"]["huey"][top]["rate"]
            aims["b_throughput_ge_2x_huey"] = {"ours": mine, "theirs": theirs, "target": 2 * theirs if theirs else None,
                                               "met": bool(mine and theirs and mine >= 2 * theirs)}
        stats_ms = summary["stats_ms"].get(ours, {}).get("median")
        aims["c_stats_under_5ms_at_1e6"] = {"median_ms": stats_ms, "met": bool(stats_ms is not None and stats_ms < 5.0)}
        summary["aims"][ours] = aims
    all_flexiqd = [r for r in results["drain"] if r["lib"].startswith("flexiqd")]
    summary["flexiqd_duplicates"] = sum(r["checks"].get("duplicate_runs", 0) +
                                        r["checks"].get("duplicate_acks_in_executions", 0) for r in all_flexiqd)
    summary["flexiqd_lost"] = sum(r["checks"].get("not_done", 0) for r in all_flexiqd)
    summary["flexiqd_jobs_per_settle"] = {
        f"{lib} {procs}p": median([r.get("diagnostics", {}).get("jobs_per_settle") for r in all_flexiqd
                                   if r["lib"] == lib and r["procs"] == procs])
        for lib in libs if lib.startswith("flexiqd") for procs in results["config"]["procs"]}
    return summary


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def fmt_ratio(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value < 0.01:
        return f"1/{1 / value:,.0f}"
    return f"{value:.2f}x" if value < 100 else f"{value:,.0f}x"


def render(results: dict) -> str:
    s = results["summary"]
    c = results["config"]
    m = results["machine"]
    v = results["versions"]
    libs = c["libs"]
    top = str(max(c["procs"]))
    lines = [
        f"Recorded {results['started'][:16].replace('T', ' ')} UTC; the benchmark took "
        f"{results['wall_seconds'] / 60:.1f} min. Medians of {c['reps']} runs; raw numbers in "
        f"`results-queue.json`.",
        "",
        f"Machine: {m.get('cpu', '?')}, {m['cpus']} cores, {m.get('memory_gib', '?')} GiB, "
        f"{m.get('filesystem', '?')}, Linux {m['kernel']}, Python {m['python']}, SQLite {m['sqlite']}; "
        f"this disk did {m['fsync_commits_per_s']:,} fsync'd SQLite commits/s.",
        f"Versions: flexiqd {v.get('flexiqd')} ({v.get('flexiqd_commit', '?')}), flexiq {v.get('flexiq')}, "
        f"huey {v.get('huey')}.",
        "",
        *[f"- {l}: {LABELS[l]}" for l in libs],
        "",
        "| | " + " | ".join(libs) + " |",
        "|---|" + "---:|" * len(libs),
    ]
    row = lambda name, cells: lines.append(f"| {name} | " + " | ".join(cells) + " |")  # noqa: E731
    def spread(value: float | None, bounds: list[float] | None) -> str:
        if value is None:
            return "n/a"
        return f"{fmt(value)} <sub>{fmt(bounds[0])}–{fmt(bounds[1])}</sub>" if bounds else fmt(value)

    row(f"enqueue one by one, jobs/s ({c['enqueue_one']:,} jobs)",
        [spread(s["enqueue"][l]["one"], s["enqueue"][l].get("range", {}).get("one")) for l in libs])
    row(f"enqueue batched, jobs/s ({c['enqueue_batch']:,} jobs, `task.map` of {c['batch']:,})",
        [spread(s["enqueue"][l]["batch"], s["enqueue"][l].get("range", {}).get("batch"))
         if s["enqueue"][l]["batch"] else "no batch API" for l in libs])
    boxed = []
    for procs in c["procs"]:
        cells = []
        for l in libs:
            d = s["drain"][l][str(procs)]
            cell = spread(d["rate"], d.get("range"))
            if d["timeboxed"]:
                cell += " †"
                boxed.append(f"{l} with {procs} process{'es' if procs > 1 else ''} completed "
                             f"{min(d['completed']):,}–{max(d['completed']):,}")
            cells.append(cell)
        row(f"drain {c['drain_jobs']:,} no-op jobs, {procs} worker process{'es' if procs > 1 else ''}, jobs/s",
            cells)
    for procs in c["procs"]:
        row(f"drain, steady state, {procs} process{'es' if procs > 1 else ''}, jobs/s",
            [fmt(s["drain"][l][str(procs)]["steady_rate"]) for l in libs])
    row(f"stats call at {c['stats_jobs']:,} queued, median ms",
        [fmt(s["stats_ms"].get(l, {}).get("median"), 3) for l in libs])
    lines += ["", "Small figures: lowest–highest of the runs. Drain rates count from the workers' spawn "
              "(start-up included); the steady rows time 10 %→90 % of the completions."]
    if boxed:
        lines.append(f"† Time-boxed: still draining after {c['drain_cap']:.0f} s, so the rate is the "
                     f"completions recorded in that time, out of {c['drain_jobs']:,} queued (" +
                     "; ".join(boxed) + ").")
    lines += ["", "Ratios, flexiqd ÷ peer, of the medians (rates: above 1 means flexiqd is faster; stats "
              "latency: below 1 means flexiqd's call is faster; huey has no batch API, so its batched "
              "column compares with huey's one-by-one rate):", "",
              "| | enqueue one by one | enqueue batched | " +
              " | ".join(f"drain {p} proc." for p in c["procs"]) + " | stats latency |",
              "|---|---:|---:|" + "---:|" * len(c["procs"]) + "---:|"]
    for key, r in s["ratios"].items():
        lines.append(f"| {key} | {fmt_ratio(r['enqueue_one'])} | {fmt_ratio(r['enqueue_batch'])} | " +
                     " | ".join(fmt_ratio(r[f'drain_{p}p']) for p in c["procs"]) +
                     f" | {fmt_ratio(r['stats_latency'])} |")
    lines += ["", "Aims:", ""]
    for ours, aims in s["aims"].items():
        parts = []
        if "a_throughput_ge_flexiq" in aims:
            a = aims["a_throughput_ge_flexiq"]
            parts.append(f"(a) {top}-process throughput ≥ flexiq's: **{'met' if a['met'] else 'NOT met'}** "
                         f"({fmt(a['ours'])} vs {fmt(a['theirs'])} jobs/s)")
        if "b_throughput_ge_2x_huey" in aims:
            b = aims["b_throughput_ge_2x_huey"]
            parts.append(f"(b) ≥ 2× huey's: **{'met' if b['met'] else 'NOT met'}** "
                         f"({fmt(b['ours'])} vs 2 × {fmt(b['theirs'])} = {fmt(b['target'])} jobs/s)")
        cc = aims["c_stats_under_5ms_at_1e6"]
        parts.append(f"(c) stats < 5 ms at {c['stats_jobs']:,} jobs: **{'met' if cc['met'] else 'NOT met'}** "
                     f"({fmt(cc['median_ms'], 3)} ms)")
        lines.append(f"- {ours}: " + "; ".join(parts) + ".")
    lines += ["", f"Exactly-once (flexiqd, all {len([r for r in results['drain'] if r['lib'].startswith('flexiqd')])} "
              f"drain runs): {s['flexiqd_duplicates']} duplicate executions, {s['flexiqd_lost']} jobs not done."]
    per_settle = {k: v for k, v in s.get("flexiqd_jobs_per_settle", {}).items() if v}
    if per_settle:
        lines.append("flexiqd jobs settled per write transaction (median): " +
                     ", ".join(f"{k} {v:.2f}" for k, v in per_settle.items()) + ".")
    peers_dup = {l: sum(r["checks"]["duplicate_runs"] for r in results["drain"] if r["lib"] == l)
                 for l in libs if not l.startswith("flexiqd")}
    if peers_dup:
        lines.append("Peers, from the same task files: " +
                     ", ".join(f"{l} {n} duplicate runs" for l, n in peers_dup.items()) + ".")
    lines += ["", "Worker set-up (each library's own defaults):", ""]
    for l in libs:
        lines.append(f"- {l}: {WORKER_SETUP[l].format(cpus=m['cpus'])}")
    lines += ["", "Stats calls and how the 10^6 stores were filled:", ""]
    for l in libs:
        st = results["stats"].get(l)
        if l == "flexiqd-normal":
            lines.append("- flexiqd-normal: the same store and call as flexiqd-durable (a read does not "
                         "depend on the synchronous setting), measured once.")
            continue
        if not st:
            continue
        fill = st["fill"]
        extra = ""
        sm = s["stats_ms"][l]
        if "median_after_acks" in sm:
            extra = f"; after {c['stats_settle']:,} claims+acks (durations populated) {fmt(sm['median_after_acks'], 3)} ms"
        if "median_stats_by_queue" in sm:
            extra = f"; `stats_by_queue('default')` {fmt(sm['median_stats_by_queue'], 3)} ms"
        lines.append(f"- {l}: `{sm['call']}` median {fmt(sm['median'], 3)} ms, max {fmt(sm['max'], 3)} ms{extra}. "
                     f"Filled with {fill['how']} at {fmt(fill['rate'])} jobs/s"
                     f"{' (synchronous=normal for the fill)' if l.startswith('flexiqd') else ''}.")
    return "\n".join(lines)


def update_readme(path: Path, section: str, marker: str = "results") -> None:
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    text = path.read_text() if path.exists() else f"# Benchmarks\n\n{start}\n{end}\n"
    if start not in text or end not in text:
        text = text.rstrip() + f"\n\n## Results\n\n{start}\n{end}\n"
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{start}\n{section}\n{end}{tail}")


# ---------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["phase"]:
        print(json.dumps(PHASES[argv[1]](**json.loads(argv[2]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repetition: a smoke test")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--libs", default=",".join(LIBS))
    parser.add_argument("--drain-jobs", type=int, default=20_000)
    parser.add_argument("--drain-cap", type=float, default=20.0,
                        help="seconds a drain may take; slower libraries are time-boxed")
    parser.add_argument("--stats-jobs", type=int, default=1_000_000)
    parser.add_argument("--stats-calls", type=int, default=20)
    parser.add_argument("--enqueue-one", type=int, default=5_000)
    parser.add_argument("--enqueue-batch", type=int, default=20_000)
    parser.add_argument("--skip", default="", help="comma-separated: enqueue,drain,stats")
    parser.add_argument("--profile", metavar="DIR", default=None,
                        help="py-spy record each flexiqd worker in the first drain repetition")
    parser.add_argument("--out", default=str(BENCH / "results-queue.json"))
    parser.add_argument("--readme", default=str(BENCH / "README.md"))
    parser.add_argument("--render", metavar="JSON", default=None,
                        help="only re-render the README's results section from a saved results file")
    args = parser.parse_args(argv)
    if args.render:
        results = json.loads(Path(args.render).read_text())
        results["summary"] = summarise(results)
        section = render(results)
        update_readme(Path(args.readme), section)
        print(section)
        return 0
    if args.quick:
        args.reps, args.drain_jobs, args.drain_cap = 1, 2_000, 10.0
        args.stats_jobs, args.enqueue_one, args.enqueue_batch = 20_000, 500, 2_000
    libs = [l for l in args.libs.split(",") if l]
    skip = set(filter(None, args.skip.split(",")))
    WORK.mkdir(parents=True, exist_ok=True)
    wall = time.perf_counter()
    results: dict[str, Any] = {
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": {"libs": libs, "reps": args.reps, "procs": [1, 4], "drain_jobs": args.drain_jobs,
                   "drain_cap": args.drain_cap, "stats_jobs": args.stats_jobs, "stats_calls": args.stats_calls,
                   "stats_settle": 5_000, "enqueue_one": args.enqueue_one, "enqueue_batch": args.enqueue_batch,
                   "batch": 1_000, "quick": args.quick},
        "machine": machine_info(), "versions": versions(), "labels": LABELS,
        "enqueue": {}, "drain": [], "stats": {},
    }
    log(f"machine: {results['machine']}")
    log(f"versions: {results['versions']}")
    if "enqueue" not in skip:
        for rep in range(args.reps):
            for lib in libs:
                for mode, n in (("one", args.enqueue_one), ("batch", args.enqueue_batch)):
                    if mode == "batch" and not BATCH_API[lib]:
                        continue
                    run_dir = WORK / f"enqueue-{lib}-{mode}-{rep}"
                    shutil.rmtree(run_dir, ignore_errors=True)
                    run_dir.mkdir(parents=True)
                    r = run_phase("enqueue", lib=lib, db=str(run_dir / "store.db"), n=n, mode=mode, batch=1000)
                    shutil.rmtree(run_dir, ignore_errors=True)
                    results["enqueue"].setdefault(lib, {}).setdefault(mode, []).append(r)
                    log(f"enqueue {mode:5} {lib:16} rep {rep}: {r['rate']:,.0f} jobs/s")
    if "drain" not in skip:
        for rep in range(args.reps):
            for procs in (1, 4):
                for lib in libs:
                    profile = None
                    if args.profile and rep == 0 and lib.startswith("flexiqd"):
                        profile = args.profile
                        os.makedirs(profile, exist_ok=True)
                    r = drain_run(lib, procs, rep, args.drain_jobs, args.drain_cap, profile)
                    results["drain"].append(r)
                    note = " (time-boxed)" if r["timeboxed"] else ""
                    log(f"drain {procs}p {lib:16} rep {rep}: {r['completed']:,} in {r['seconds']:.2f}s = "
                        f"{r['rate']:,.0f} jobs/s{note}; steady {fmt(r['steady_rate_10_90'])}; "
                        f"exit {r['exit_codes']}; checks {r['checks']} {r['diagnostics']}")
    if "stats" not in skip:
        # The stats call reads the same way whatever the synchronous setting: flexiqd once.
        for lib in [l for l in libs if l != "flexiqd-normal"]:
            run_dir = WORK / f"stats-{lib}"
            shutil.rmtree(run_dir, ignore_errors=True)
            run_dir.mkdir(parents=True)
            db = str(run_dir / "store.db")
            fill = run_phase("fill", lib=lib, db=db, n=args.stats_jobs, chunk=10_000 if lib != "huey" else 100_000)
            log(f"stats  fill {lib:16}: {fill['n']:,} jobs in {fill['seconds']:.1f}s ({fill['rate']:,.0f}/s)")
            runs = []
            for rep in range(args.reps):
                # flexiqd-durable also claims and acks, in the last repetition only (it changes the store).
                settle = 5_000 if lib == "flexiqd-durable" and rep == args.reps - 1 else 0
                r = run_phase("stats", lib=lib, db=db, calls=args.stats_calls, settle=settle)
                runs.append(r)
                log(f"stats       {lib:16} rep {rep}: median {median(r['stats']['ms']):.3f} ms "
                    f"(first {r['stats']['first_ms']:.3f} ms, runnable {r['stats']['runnable']})")
            results["stats"][lib] = {"fill": fill, "runs": runs}
            shutil.rmtree(run_dir, ignore_errors=True)
    results["wall_seconds"] = time.perf_counter() - wall
    if not skip:
        results["summary"] = summarise(results)
        section = render(results)
        print(section)
        if not args.quick:
            update_readme(Path(args.readme), section)
    if args.quick and args.out == str(BENCH / "results-queue.json"):
        args.out = str(WORK / "results-quick.json")
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    log(f"done in {results['wall_seconds'] / 60:.1f} min; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
