#!/usr/bin/env python3
"""PostgreSQL throughput: flexiqd against procrastinate and pgqueuer, side by side in one run.

    make bench-pg                          # about 7 minutes on 2 cores
    make bench-pg BENCH_PG_ARGS=--quick    # small backlogs, one round: a smoke test

(``make bench-pg`` builds ``bench/.work/venv`` with the peers from PyPI; flexiqd's
workers run from the project's ``.venv``.)  One private PostgreSQL 15 server, started
here with PostgreSQL's own durability defaults (fsync, synchronous_commit and
full_page_writes on), serves every run.  For each library, each workload (no-op jobs;
jobs that block 10 ms in ``time.sleep``) and 1, 4 and 16 worker processes, a fresh
database gets its backlog enqueued up front, then the worker processes drain it.
The rate is the jobs completed divided by the time from the first claim to the last
completion, both read from the store's own records afterwards (timestamps of each
library's tables); a drain still going ``--cap`` seconds after the workers' spawn is
stopped there (time-boxed).  The tables show the median of ``--rounds`` rounds, with
the libraries interleaved so noise on this small machine hits them alike.

Each worker process gets 4 job slots: flexiqd ``--concurrency 4`` (its default),
procrastinate ``--concurrency 4``; pgqueuer sleeps on a 4-thread pool, and its async
no-op entrypoint runs on its event loop, not limited to 4 (bench/apps/pg_pgqueuer.py
says why not its ``concurrency_limit``).  Results go to
``bench/results-pg-throughput.json`` and the section between the ``pg-throughput``
markers of ``bench/README.md``.  No test depends on them.
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
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
APPS = BENCH / "apps"
WORK = BENCH / ".work" / "pg-run"
sys.path[:0] = [str(ROOT / "tests"), str(BENCH)]

LIBS = ("flexiqd", "flexiqd-capped", "procrastinate", "pgqueuer")
# flexiqd again, its tasks using a dependency with a fleet-wide concurrency limit set above
# every slot (so it never binds): what the admission itself costs.
CAPPED = "flexiqd-capped"
CAP_LIMIT = 100_000  # above every job the workers can hold, prefetched ones included
CAP_CONFIG = f"dependencies:\n  bench_dep:\n    capacity: 100000\n    limit: {{concurrency: {CAP_LIMIT}}}\n"
SHAPES = ("noop", "sleep10")
SHAPE_LABELS = {"noop": "no-op jobs", "sleep10": "10 ms jobs (`time.sleep`)"}
WORKERS = (1, 4, 16)
SLOTS = 4  # job slots per worker process, for every library
CHUNK = 1_000  # jobs per enqueue call
# The server's settings beyond initdb's defaults: where it listens, and room for 16
# processes of each library (a procrastinate worker's pool may hold several connections).
SERVER_SETTINGS = {"max_connections": "300"}
SHOWN_SETTINGS = ("fsync", "synchronous_commit", "full_page_writes", "wal_level", "shared_buffers",
                  "max_connections", "server_version")


def log(message: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def python_for(lib: str) -> str:
    """flexiqd runs from the project's venv (Debian's psycopg); the peers from the bench venv."""
    if lib.startswith("flexiqd"):
        venv = ROOT / ".venv" / "bin" / "python"
        return str(venv) if venv.exists() else sys.executable
    return sys.executable


# ---------------------------------------------------------------------------------------------
# The server: tests/pg_server.py's, with PostgreSQL's durability defaults instead of the tests'.
# ---------------------------------------------------------------------------------------------

def start_server():
    from pg_server import BIN, PostgresServer

    class DurableServer(PostgresServer):
        def start(self) -> "DurableServer":
            if os.geteuid() == 0:
                import pwd
                owner = pwd.getpwnam("postgres")
                os.chown(self.directory, owner.pw_uid, owner.pw_gid)
            self._run(str(BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-E", "UTF8",
                      "--locale=C", "--auth-local=trust", "--auth-host=trust")
            extra = " ".join(f"-c {key}={value}" for key, value in SERVER_SETTINGS.items())
            settings = f"-k {self.directory} -p {self.port} -c listen_addresses=127.0.0.1 {extra}"
            self._run(str(BIN / "pg_ctl"), "start", "-w", "-t", "60", "-D", str(self.data),
                      "-l", str(self.directory / "server.log"), "-o", settings)
            self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
            return self

    return DurableServer().start()


def dsn(server, database: str) -> str:
    """libpq key/value form, over the unix socket: every library accepts it."""
    return f"host={server.directory} port={server.port} user=postgres dbname={database}"


def flexiqd_url(server, database: str) -> str:
    return server.socket_url(database)


def asyncpg_dsn(server, database: str) -> str:
    from urllib.parse import quote
    return f"postgresql://postgres@/{database}?host={quote(str(server.directory), safe='')}&port={server.port}"


def worker_env(lib: str, server, database: str, out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(APPS), BENCH_OUT=str(out), BENCH_CONCURRENCY=str(SLOTS))
    env["BENCH_DB"] = flexiqd_url(server, database)
    env["BENCH_DSN"] = asyncpg_dsn(server, database) if lib == "pgqueuer" else dsn(server, database)
    return env


# ---------------------------------------------------------------------------------------------
# Phases that import a library: each runs in its own interpreter and prints one JSON line.
# ---------------------------------------------------------------------------------------------

def phase_enqueue(lib: str, shape: str, n: int) -> dict:
    """Create the library's schema, then enqueue ``n`` jobs in calls of CHUNK; time the enqueue."""
    chunks = [range(k, min(n, k + CHUNK)) for k in range(0, n, CHUNK)]
    if lib.startswith("flexiqd"):
        import pg_flexiqd as app
        app.queue.stats("default")  # opens the store and creates its tables
        task = getattr(app, shape + ("_capped" if lib == CAPPED else ""))
        began = time.perf_counter()
        for chunk in chunks:
            task.map([(i,) for i in chunk])
        seconds = time.perf_counter() - began
        app.queue.close()
    elif lib == "procrastinate":
        import pg_procrastinate as app
        with app.app.open():
            app.app.schema_manager.apply_schema()
            task = getattr(app, shape)
            began = time.perf_counter()
            for chunk in chunks:
                task.batch_defer(*({"i": i} for i in chunk))
            seconds = time.perf_counter() - began
    else:
        import asyncio

        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries

        async def fill() -> float:
            connection = await asyncpg.connect(os.environ["BENCH_DSN"])
            queries = Queries(AsyncpgDriver(connection))
            await queries.install()
            began = time.perf_counter()
            for chunk in chunks:
                await queries.enqueue([shape] * len(chunk), [str(i).encode() for i in chunk], [0] * len(chunk))
            elapsed = time.perf_counter() - began
            await connection.close()
            return elapsed

        seconds = asyncio.run(fill())
    return {"n": n, "seconds": seconds, "rate": n / seconds}


def phase_limit_probe() -> dict:
    """Does this checkout's PostgreSQL store enforce dependency limits (``Backend.admit``)?"""
    from flexiqd.queue import open_backend
    from flexiqd.queue.store.backend import QueueError
    from flexiqd.queue.limits import DependencyLimit

    store = open_backend(os.environ["BENCH_DB"])
    try:
        store.admit("bench:probe:1", 1, [DependencyLimit("db", concurrency=16)], now=time.time())
    except QueueError as exc:
        if "does not enforce" in str(exc):
            return {"enforced": False, "message": str(exc).split(": ", 1)[-1]}
        raise
    finally:
        store.close()
    return {"enforced": True, "message": "Backend.admit answered"}


PHASES = {"enqueue": phase_enqueue, "limit_probe": phase_limit_probe}


def run_phase(interpreter_of: str, env: dict, name: str, **kwargs: Any) -> dict:
    """Run phase ``name`` in a fresh interpreter of the library ``interpreter_of``; return its JSON."""
    proc = subprocess.run([python_for(interpreter_of), str(Path(__file__).resolve()), "phase", name, json.dumps(kwargs)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=str(WORK))
    if proc.returncode != 0:
        raise RuntimeError(f"{interpreter_of}: phase {name} {kwargs} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# Reading each store: completions so far, and the first claim and last completion.
# ---------------------------------------------------------------------------------------------

# Each returns (completed, first claim, last completion), times as seconds since the epoch.
STORE_QUERIES: dict[str, str] = {
    # flexiqd stamps started_at when it claims a job and finished_at when it settles it.
    "flexiqd": "SELECT count(*) FILTER (WHERE state = 'done'), min(started_at), "
               "max(finished_at) FILTER (WHERE state = 'done') FROM flexiq_jobs",
    # procrastinate records an event per state change: 'started' when a worker fetches a job.
    "procrastinate": "SELECT (SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'), "
                     "extract(epoch FROM min(at) FILTER (WHERE type = 'started')), "
                     "extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')) FROM procrastinate_events",
    # pgqueuer logs 'picked' when a worker claims a job and 'successful' when it completes.
    "pgqueuer": "SELECT count(*) FILTER (WHERE status = 'successful'), "
                "extract(epoch FROM min(created) FILTER (WHERE status = 'picked')), "
                "extract(epoch FROM max(created) FILTER (WHERE status = 'successful')) FROM pgqueuer_log",
}
COUNT_QUERIES: dict[str, str] = {
    "flexiqd": "SELECT count(*) FROM flexiq_jobs WHERE state = 'done'",
    "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
    "pgqueuer": "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'",
}


STORE_QUERIES[CAPPED], COUNT_QUERIES[CAPPED] = STORE_QUERIES["flexiqd"], COUNT_QUERIES["flexiqd"]


def read_marks(out: Path) -> collections.Counter:
    runs: collections.Counter = collections.Counter()
    for path in glob.glob(str(out / "ran-*.txt")):
        with open(path) as f:
            for line in f:
                if line.strip():
                    runs[int(line)] += 1
    return runs


def worker_commands(lib: str, procs: int) -> list[list[str]]:
    py = python_for(lib)
    if lib.startswith("flexiqd"):
        cmd = [py, "-m", "flexiqd.cli.flexiq", "worker", "--app", "pg_flexiqd:queue",
               "--queues", "default", "--concurrency", str(SLOTS)]
        if lib == CAPPED:
            config = WORK / "capped.yaml"
            config.write_text(CAP_CONFIG)
            cmd += ["--config", str(config)]
    elif lib == "procrastinate":
        cmd = [py, "-m", "procrastinate", "--app=pg_procrastinate.app", "worker", "--concurrency", str(SLOTS)]
    else:
        cmd = [py, "-m", "pg_pgqueuer"]  # pgqueuer.run("pg_pgqueuer:main"), as `pgqueuer run` does
    return [cmd] * procs


def stop_workers(procs: list[subprocess.Popen], timeout: float = 30) -> list[int | None]:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    codes: list[int | None] = []
    for p in procs:
        try:
            codes.append(p.wait(max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # its own session: whatever it forked
            p.wait()
            codes.append(None)
    return codes


def server_counters(server, database: str) -> dict:
    """The run's database's committed transactions, and the server's WAL flushes and bytes.

    Read over a connection to another database, so reading them adds nothing to the
    counts; the short wait lets backends that just closed flush their statistics.
    """
    time.sleep(0.2)
    commits = server.admin(f"SELECT xact_commit FROM pg_stat_database WHERE datname = '{database}'")[0][0]
    wal_sync, wal_bytes = server.admin("SELECT wal_sync, wal_bytes FROM pg_stat_wal")[0]
    return {"commits": int(commits), "wal_flushes": int(wal_sync), "wal_bytes": int(wal_bytes)}


def per_job(before: dict, after: dict, own_commits: int, n: int) -> dict:
    """Commits (less the benchmark's own polls), WAL flushes and WAL bytes per job completed."""
    if not n:
        return {}
    return {"commits": (after["commits"] - before["commits"] - own_commits) / n,
            "wal_flushes": (after["wal_flushes"] - before["wal_flushes"]) / n,
            "wal_bytes": (after["wal_bytes"] - before["wal_bytes"]) / n}


def drain_run(server, lib: str, shape: str, procs: int, rnd: int, n: int, cap: float) -> dict:
    import psycopg

    database = f"b_{lib.replace('-', '_')}_{shape}_{procs}_{rnd}"
    out = WORK / database
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    server.admin(f"DROP DATABASE IF EXISTS {database}")
    server.admin(f"CREATE DATABASE {database}")
    env = worker_env(lib, server, database, out)
    fill = run_phase(lib, env, "enqueue", lib=lib, shape=shape, n=n)
    logs = [open(out / f"worker-{k}.log", "wb") for k in range(procs)]
    before = server_counters(server, database)
    polls = 0
    began = time.monotonic()
    workers = [subprocess.Popen(cmd, env=env, cwd=str(out), stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
               for cmd, log_file in zip(worker_commands(lib, procs), logs)]
    done, crashed, seen_all = 0, None, None
    try:
        conn = psycopg.connect(dsn(server, database), autocommit=True)
    except BaseException:
        stop_workers(workers)
        raise
    with conn:
        try:
            while True:
                done = conn.execute(COUNT_QUERIES[lib]).fetchone()[0]
                polls += 1
                if done >= n or time.monotonic() - began >= cap:
                    seen_all = time.monotonic() - began if done >= n else None
                    break
                if any(w.poll() is not None for w in workers):
                    crashed = [w.returncode for w in workers]
                    break
                time.sleep(0.1)
        finally:
            codes = stop_workers(workers)  # also when interrupted: they run in sessions of their own
        completed, first, last = conn.execute(STORE_QUERIES[lib]).fetchone()
        polls += 1
    after = server_counters(server, database)
    for log_file in logs:
        log_file.close()
    runs = read_marks(out)
    seconds = float(last) - float(first) if first is not None and last is not None else None
    record = {
        "lib": lib, "shape": shape, "procs": procs, "round": rnd, "backlog": n, "completed": completed,
        "seconds": seconds, "rate": completed / seconds if seconds else None,
        "complete": completed >= n,
        # A cross-check on the store's timestamps: from the workers' spawn (start-up included)
        # to the poll (every 0.1 s) that saw every job done.
        "spawn_to_all_done_s": seen_all, "crashed": crashed, "exit_codes": codes, "enqueue": fill,
        # Diagnostics: what each completed job cost the server, from the enqueue's end to the workers' stop.
        "per_job": per_job(before, after, polls, completed),
        "runs_marked": sum(runs.values()), "duplicate_runs": sum(c - 1 for c in runs.values() if c > 1),
    }
    if crashed is None and all(code == 0 for code in codes):
        shutil.rmtree(out, ignore_errors=True)
        server.admin(f"DROP DATABASE IF EXISTS {database}")
    else:
        record["kept"] = str(out)
    return record


# ---------------------------------------------------------------------------------------------
# Summary and report: pure functions of the results.
# ---------------------------------------------------------------------------------------------

def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarise(results: dict) -> dict:
    """Per (shape, workers): each library's median rate and range, the best peer, the ratio to it."""
    cells: dict[str, Any] = {}
    for shape in results["config"]["shapes"]:
        for procs in results["config"]["workers"]:
            key = f"{shape}/{procs}"
            cell: dict[str, Any] = {"rates": {}, "ranges": {}, "timeboxed": {}}
            for lib in results["config"]["libs"]:
                mine = [r for r in results["runs"] if r["lib"] == lib and r["shape"] == shape and r["procs"] == procs]
                rates = [r["rate"] for r in mine if r["rate"]]
                cell["rates"][lib] = median(rates)
                cell["ranges"][lib] = [min(rates), max(rates)] if rates else None
                cell["timeboxed"][lib] = [r["completed"] for r in mine if not r["complete"]]
            peers = {lib: rate for lib, rate in cell["rates"].items() if not lib.startswith("flexiqd") and rate}
            best = max(peers, key=peers.get) if peers else None
            cell["best_peer"] = best
            ours = cell["rates"].get("flexiqd")
            cell["ratio_to_best_peer"] = ours / peers[best] if best and ours else None
            cell["ahead_of_both"] = bool(ours and peers and all(ours > rate for rate in peers.values())
                                         and len(peers) == len([lib for lib in results["config"]["libs"]
                                                                if not lib.startswith("flexiqd")]))
            capped = cell["rates"].get(CAPPED)
            cell["capped_ratio"] = capped / ours if capped and ours else None
            cells[key] = cell
    aim = all(c["ahead_of_both"] for c in cells.values()) if cells else False
    return {"cells": cells, "aim_met": aim,
            "cells_ahead": sum(1 for c in cells.values() if c["ahead_of_both"]), "cells_total": len(cells)}


def fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def render(results: dict) -> str:
    summary = results["summary"]
    config, machine, server = results["config"], results["machine"], results["server"]
    libs = config["libs"]
    versions = results["versions"]
    lines = [
        f"Recorded {results['started'][:16].replace('T', ' ')} UTC; the run took "
        f"{results['wall_seconds'] / 60:.1f} min. Medians of {config['rounds']} rounds per cell; "
        f"every run in `results-pg-throughput.json`.",
        "",
        f"Machine: {machine.get('cpu', '?')}, {machine.get('cpus')} cores (shared with other work, so noisy: "
        f"compare within this run), {machine.get('memory_gib')} GiB, Linux {machine.get('kernel')}, "
        f"Python {machine.get('python')}.",
        f"Server: PostgreSQL {server.get('server_version')} on the same machine, over its unix socket; "
        + ", ".join(f"{k}={server[k]}" for k in SHOWN_SETTINGS if k != "server_version" and k in server)
        + " (PostgreSQL's defaults but for max_connections).",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
        f"Backlogs: {config['jobs']['noop']:,} no-op jobs, {config['jobs']['sleep10']:,} jobs of 10 ms; "
        f"{SLOTS} job slots per worker process (pgqueuer: {SLOTS} threads for the blocking sleep; "
        f"its async no-op entrypoint runs on its event loop, not limited to {SLOTS}).",
        "",
        "Jobs/s from the first claim to the last completion (small figures: lowest-highest round):",
        "",
        "| workload | worker processes | " + " | ".join(libs) + " | flexiqd / best peer |",
        "|---|---:|" + "---:|" * len(libs) + "---:|",
    ]
    boxed: list[str] = []
    for shape in config["shapes"]:
        for procs in config["workers"]:
            cell = summary["cells"][f"{shape}/{procs}"]
            row = []
            for lib in libs:
                rng = cell["ranges"][lib]
                text = fmt_rate(cell["rates"][lib])
                if rng and config["rounds"] > 1:
                    text += f" <sub>{fmt_rate(rng[0])}–{fmt_rate(rng[1])}</sub>"
                if cell["timeboxed"][lib]:
                    text += " †"
                    done = cell["timeboxed"][lib]
                    span = f"{min(done):,}" if min(done) == max(done) else f"{min(done):,}–{max(done):,}"
                    boxed.append(f"{lib}, {SHAPE_LABELS[shape]}, {procs} process{'es' if procs > 1 else ''}: "
                                 f"{len(done)} of {config['rounds']} rounds, {span} of {config['jobs'][shape]:,} done")
                row.append(text)
            ratio = fmt_ratio(cell["ratio_to_best_peer"])
            if cell["best_peer"]:
                ratio += f" ({cell['best_peer']})"
            lines.append(f"| {SHAPE_LABELS[shape]} | {procs} | " + " | ".join(row) + f" | {ratio} |")
    lines.append("")
    if boxed:
        lines.append(f"† Time-boxed: still draining {config['cap_s']:g} s after the workers' spawn, so the rate is "
                     "the jobs completed by then over their first-claim-to-last-completion time ("
                     + "; ".join(boxed) + ").")
        lines.append("")
    lines.append(f"Aim, flexiqd ahead of both peers in every cell: **{'met' if summary['aim_met'] else 'not met'}** "
                 f"(ahead in {summary['cells_ahead']} of {summary['cells_total']} cells).")
    enqueue = {lib: median([r["enqueue"]["rate"] for r in results["runs"] if r["lib"] == lib]) for lib in libs}
    lines.append(f"Enqueueing the backlogs (calls of {config['enqueue_chunk']:,} jobs), median jobs/s: "
                 + ", ".join(f"{lib} {fmt_rate(rate)}" for lib, rate in enqueue.items()) + ".")
    if any(r.get("per_job") for r in results["runs"] if r["shape"] == "noop"):
        def cost(lib: str, key: str, digits: int) -> str:
            values = [median([r["per_job"].get(key) for r in results["runs"] if r["lib"] == lib
                              and r["shape"] == "noop" and r["procs"] == procs and r.get("per_job")])
                      for procs in config["workers"]]
            return " / ".join("-" if v is None else f"{v:,.{digits}f}" for v in values)

        procs_text = " / ".join(map(str, config["workers"]))
        lines += ["", f"What a no-op job cost the server (medians; {procs_text} worker processes; commits are the "
                      "run's database's committed transactions, read-only ones included, less the benchmark's "
                      "own polls; WAL flushes and bytes are the server's):", "",
                  "| | commits per job | WAL flushes per job | WAL bytes per job |", "|---|---:|---:|---:|"]
        lines += [f"| {lib} | {cost(lib, 'commits', 2)} | {cost(lib, 'wal_flushes', 2)} | {cost(lib, 'wal_bytes', 0)} |"
                  for lib in libs]
        lines.append("")
    dups = {lib: sum(r["duplicate_runs"] for r in results["runs"] if r["lib"] == lib) for lib in libs}
    lines.append("Runs of one job more than once, from the tasks' own marks: "
                 + ", ".join(f"{lib} {count}" for lib, count in dups.items()) + ".")
    limit = results.get("limit")
    if limit is not None:
        if limit.get("enforced") and CAPPED in libs:
            ratios = [f"{SHAPE_LABELS[shape]} x {procs}: {fmt_ratio(summary['cells'][f'{shape}/{procs}'].get('capped_ratio'))}"
                      for shape in config["shapes"] for procs in config["workers"]]
            lines.append(f"The cost of a fleet-wide cap: `{CAPPED}` is flexiqd with every job's task using a "
                         f"dependency whose `limit.concurrency` ({CAP_LIMIT}) is above every slot, so the limit "
                         f"never binds and only the admission (each worker within its share of the limit, a hold "
                         f"row per job stored with its exchanges) costs; its rate over flexiqd's, per cell: " + "; ".join(ratios) + ".")
        elif limit.get("enforced"):
            lines.append("Fleet-wide cap: the PostgreSQL store enforces dependency limits in this checkout; "
                         f"run with `{CAPPED}` among the libraries to measure their cost.")
        else:
            lines.append(f"Fleet-wide cap (`dependencies.<d>.limit.concurrency`): not measured. "
                         f"The PostgreSQL store does not enforce dependency limits yet "
                         f"(`Backend.admit`: \"{limit.get('message')}\"), so that row is skipped.")
    return "\n".join(lines)


def update_readme(path: Path, section: str) -> None:
    from queue_bench import update_readme as replace_section
    replace_section(path, section, marker="pg-throughput")


def machine_info() -> dict:
    info: dict[str, Any] = {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()}
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError):
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                info["memory_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
    return info


def versions() -> dict:
    out: dict[str, Any] = {}
    for lib in (lib for lib in LIBS if lib != CAPPED):
        code = "from importlib.metadata import version; print(version(%r))" % lib
        with contextlib.suppress(Exception):
            out[lib] = subprocess.run([python_for(lib), "-c", code], capture_output=True, text=True,
                                      timeout=60).stdout.strip() or "?"
    with contextlib.suppress(Exception):
        out["flexiqd"] += " (" + subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                                capture_output=True, text=True).stdout.strip() + ")"
    with contextlib.suppress(Exception):
        out["asyncpg (pgqueuer's driver)"] = subprocess.run(
            [sys.executable, "-c", "import asyncpg; print(asyncpg.__version__)"],
            capture_output=True, text=True, timeout=60).stdout.strip()
    with contextlib.suppress(Exception):
        import psycopg
        out["psycopg"] = psycopg.__version__
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="small backlogs, one round, 1 and 4 workers; records nothing")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--libs", default=",".join(LIBS), help="comma-separated, of: " + ", ".join(LIBS))
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated, of: " + ", ".join(SHAPES))
    parser.add_argument("--workers", default=",".join(map(str, WORKERS)), help="comma-separated process counts")
    parser.add_argument("--noop-jobs", type=int, default=10_000)
    parser.add_argument("--sleep-jobs", type=int, default=2_000)
    parser.add_argument("--cap", type=float, default=20.0,
                        help="seconds from the workers' spawn after which a drain is stopped (time-boxed)")
    parser.add_argument("--out", default=str(BENCH / "results-pg-throughput.json"))
    parser.add_argument("--readme", default=str(BENCH / "README.md"))
    parser.add_argument("--render", metavar="JSON", default=None,
                        help="only re-render the README section from a saved results file")
    args = parser.parse_args(argv)
    for name, allowed in (("libs", LIBS), ("shapes", SHAPES)):
        chosen = [x for x in getattr(args, name).split(",") if x]
        unknown = [x for x in chosen if x not in allowed]
        if unknown or not chosen:
            parser.error(f"--{name}: unknown {', '.join(unknown) or '(empty)'}; choose from {', '.join(allowed)}")
        setattr(args, name, chosen)
    try:
        args.workers = [int(x) for x in args.workers.split(",") if x]
    except ValueError:
        parser.error(f"--workers: not a comma-separated list of numbers: {args.workers!r}")
    if not args.workers or any(w < 1 for w in args.workers):
        parser.error("--workers: each count must be at least 1")
    if args.rounds < 1:
        parser.error("--rounds: must be at least 1")
    if args.quick:
        args.rounds, args.noop_jobs, args.sleep_jobs = 1, 1_000, 400
        args.workers = [w for w in args.workers if w <= 4] or [1]
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["phase"]:
        sys.path.insert(0, str(APPS))
        print(json.dumps(PHASES[argv[1]](**json.loads(argv[2]))))
        return 0
    args = parse_args(argv)
    if args.render:
        results = json.loads(Path(args.render).read_text())
        results["summary"] = summarise(results)
        section = render(results)
        update_readme(Path(args.readme), section)
        print(section)
        return 0
    WORK.mkdir(parents=True, exist_ok=True)
    wall = time.perf_counter()
    jobs = {"noop": args.noop_jobs, "sleep10": args.sleep_jobs}
    results: dict[str, Any] = {
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": {"libs": args.libs, "shapes": args.shapes, "workers": args.workers, "rounds": args.rounds,
                   "jobs": jobs, "slots_per_process": SLOTS, "enqueue_chunk": CHUNK, "cap_s": args.cap,
                   "quick": args.quick},
        "machine": machine_info(), "versions": versions(), "runs": [],
    }
    log(f"versions: {results['versions']}")
    server = start_server()
    try:
        results["server"] = {k: server.admin(f"SHOW {k}")[0][0] for k in SHOWN_SETTINGS}
        log(f"server: {results['server']}")
        if "flexiqd" in args.libs:
            server.admin("CREATE DATABASE b_probe")
            results["limit"] = run_phase("flexiqd", worker_env("flexiqd", server, "b_probe", WORK), "limit_probe")
            server.admin("DROP DATABASE b_probe")
            log(f"dependency limits on PostgreSQL: {results['limit']}")
        for rnd in range(args.rounds):
            for shape in args.shapes:
                for procs in args.workers:
                    for lib in args.libs:
                        r = drain_run(server, lib, shape, procs, rnd, jobs[shape], args.cap)
                        results["runs"].append(r)
                        log(f"{shape:8} {procs:2}p {lib:14} round {rnd}: {r['completed']:,}/{r['backlog']:,} in "
                            f"{(r['seconds'] or 0):.2f}s = {fmt_rate(r['rate'])} jobs/s; enqueue "
                            f"{r['enqueue']['rate']:,.0f}/s; exits {r['exit_codes']}; dup {r['duplicate_runs']}"
                            + (f"; kept {r['kept']}" if "kept" in r else ""))
    finally:
        server.stop()
    results["wall_seconds"] = time.perf_counter() - wall
    results["summary"] = summarise(results)
    section = render(results)
    print(section)
    out = Path(args.out)
    if args.quick:
        out = WORK / "results-quick.json" if args.out == str(BENCH / "results-pg-throughput.json") else out
    else:
        update_readme(Path(args.readme), section)
    out.write_text(json.dumps(results, indent=1) + "\n")
    log(f"done in {results['wall_seconds'] / 60:.1f} min; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
