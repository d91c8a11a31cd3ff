#!/usr/bin/env python3
"""Stats benchmark: how long one ``Backend.stats()`` read takes on large stores of two shapes.

    .venv/bin/python bench/stats_bench.py [--baseline REV] [--quick]

Shapes (sizes are options):

- ``delayed``: 10^6 jobs due over the next 24 hours, owned by 100 active tenants,
  each of which also has jobs runnable, running and completed in the last
  minute; and 9,900 tenants of the past, each with one job done two hours ago;
- ``queued``: 10^6 runnable jobs of one tenant, 5,000 of them completed in the
  last minute (the shape of ``queue_bench.py``'s stats measurement).

Each store is built by one subprocess and read by another, fresh one, through
the public API of the code under test: one untimed read, then ``--reads`` timed
ones, on the default durable URL.  The clock of the reads runs on from the
shape's reference time as real time passes, so delayed jobs come due while
they run, as they would under the daemon.  ``--baseline REV`` measures the
``flexiqd`` package of that git revision the same way, in the same run.

Results go to ``bench/results-stats.json`` and to the stats section of
``bench/README.md``.  No test depends on these timings.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from queue_bench import machine_info, update_readme

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / ".work" / "stats"
CHUNK = 10_000
DAY = 86_400.0


def log(message: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Phases: run in a subprocess with the code under test first on sys.path.
# ---------------------------------------------------------------------------------------------

def phase_build(db: str, shape: str, jobs: int, tenants: int, active: int, reference: float) -> dict:
    from flexiqd.queue import ClaimRequest, NewJob, Outcome
    from flexiqd.queue.sqlite import SQLiteBackend

    store = SQLiteBackend(db, synchronous="normal")
    began = time.perf_counter()
    r = reference

    def enqueue(make, n: int, now: float) -> None:
        """Enqueue ``make(i)`` for i < n, in transactions of CHUNK jobs."""
        for at in range(0, n, CHUNK):
            store.enqueue([make(i) for i in range(at, min(n, at + CHUNK))], now=now)

    def run(limit: int, claimed_at: float, acked: int, lease: float = 7200.0) -> None:
        """Claim ``limit`` jobs, ack ``acked`` of them one second apart ending at r - 1."""
        held = store.claim(ClaimRequest("bench", ("default",), limit, lease), now=claimed_at)
        for i, job in enumerate(held[:acked]):
            store.settle("bench", [Outcome.ack(job.id)], now=r - 1 - (i % 40))

    if shape == "delayed":
        past = tenants - active
        enqueue(lambda i: NewJob(task="t", tenant=f"past{i}"), past, now=r - 7200)
        held = store.claim(ClaimRequest("bench", ("default",), past), now=r - 7200)
        store.settle("bench", [Outcome.ack(job.id) for job in held], now=r - 7199)
        # Due over the next day, spread evenly; enqueued a day ago.
        enqueue(lambda i: NewJob(task="t", tenant=f"active{i % active}", run_at=r + (i + 1) * DAY / jobs),
                jobs, now=r - DAY)
        # The last minute: 10 arrivals per active tenant, 8 started, 6 of them done.
        enqueue(lambda i: NewJob(task="t", tenant=f"active{i % active}"), 10 * active, now=r - 50)
        run(8 * active, r - 45, 6 * active)
    elif shape == "queued":
        enqueue(lambda i: NewJob(task="t"), jobs, now=r - 100)
        run(5_000, r - 45, 5_000)
    else:
        raise SystemExit(f"unknown shape {shape!r}")
    store.close()
    return {"build_s": round(time.perf_counter() - began, 1)}


def phase_read(db: str, reads: int, reference: float) -> dict:
    import flexiqd
    from flexiqd.queue import open_backend

    store = open_backend(f"sqlite:///{db}")  # the default durable URL, as the daemon opens it
    started = time.monotonic()

    def now() -> float:
        return reference + (time.monotonic() - started)

    first = store.stats("default", now=now())
    times = []
    for _ in range(reads):
        at = now()
        began = time.perf_counter()
        last = store.stats("default", now=at)
        times.append((time.perf_counter() - began) * 1000)
    store.close()

    def summary(stats) -> dict:
        return {"runnable": stats.runnable, "delayed": stats.delayed, "running": stats.running,
                "tenants": len(stats.tenants), "arrival_rate": round(stats.arrival_rate, 3),
                "completion_rate": round(stats.completion_rate, 3)}

    times.sort()
    return {"code": os.path.dirname(os.path.dirname(flexiqd.__file__)), "ms": [round(t, 4) for t in times],
            "median_ms": round(statistics.median(times), 4),
            "p95_ms": round(times[math.ceil(0.95 * len(times)) - 1], 4),  # nearest rank
            "max_ms": round(times[-1], 4), "first": summary(first), "last": summary(last)}


PHASES = {"build": phase_build, "read": phase_read}


def run_phase(code: Path, name: str, **kwargs: Any) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(code), str(BENCH)]))
    done = subprocess.run([sys.executable, __file__, "phase", name, json.dumps(kwargs)], env=env,
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"phase {name} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# Driver.
# ---------------------------------------------------------------------------------------------

def code_of(rev: str | None) -> tuple[Path, str]:
    """(directory holding the flexiqd package, its label): this checkout, or ``rev`` unpacked."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              check=True).stdout.strip()

    if rev is None:
        dirty = git("status", "--porcelain", "--", "flexiqd")
        return ROOT, git("rev-parse", "--short", "HEAD") + ("+changes" if dirty else "")
    label = git("rev-parse", "--short", rev)
    directory = WORK / f"code-{label}"
    if not (directory / "flexiqd").is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "flexiqd"],
                                 capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(directory)
    return directory, label


def measure(code: Path, shape: str, args: argparse.Namespace) -> dict:
    db = WORK / f"{shape}.db"
    for suffix in ("", "-wal", "-shm"):
        (db.parent / (db.name + suffix)).unlink(missing_ok=True)
    reference = time.time()
    built = run_phase(code, "build", db=str(db), shape=shape, jobs=args.jobs, tenants=args.tenants,
                      active=args.active, reference=reference)
    read = run_phase(code, "read", db=str(db), reads=args.reads, reference=reference)
    if Path(read["code"]).resolve() != code.resolve():
        raise SystemExit(f"measured the code in {read['code']}, not {code}")
    return {**built, **read, "db_mib": round(db.stat().st_size / 2**20)}


def render(results: dict) -> str:
    config = results["config"]
    lines = [f"Recorded {results['recorded']}; {config['reads']} timed reads per store after one "
             f"untimed one, default durable URL. Raw numbers in `results-stats.json`.", "",
             f"Machine: {results['machine'].get('cpu', '?')}, {results['machine']['cpus']} cores, "
             f"{results['machine'].get('filesystem', '?')}, Python {results['machine']['python']}, "
             f"SQLite {results['machine']['sqlite']}.", "",
             "| shape | code | median ms | p95 ms | max ms | runnable | delayed | tenants shown | arrivals/s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    names = {"delayed": f"{config['jobs']:,} delayed, {config['tenants']:,} tenants ({config['active']} active)",
             "queued": f"{config['jobs']:,} queued, 1 tenant"}
    for shape in ("delayed", "queued"):
        for label, variant in results["variants"].items():
            m = variant.get(shape)
            if m:
                last = m["last"]
                lines.append(f"| {names[shape]} | {label} | {m['median_ms']:.3f} | {m['p95_ms']:.3f} | "
                             f"{m['max_ms']:.3f} | {last['runnable']:,} | {last['delayed']:,} | "
                             f"{last['tenants']:,} | {last['arrival_rate']:g} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["phase"]:
        print(json.dumps(PHASES[argv[1]](**json.loads(argv[2]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--active", type=int, default=100)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--baseline", metavar="REV", help="also measure the flexiqd package of this revision")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test (~10 s)")
    parser.add_argument("--out", default=str(BENCH / "results-stats.json"))
    parser.add_argument("--readme", default=str(BENCH / "README.md"))
    args = parser.parse_args(argv)
    if args.quick:
        args.jobs, args.tenants, args.active, args.reads = 20_000, 200, 10, 20
    WORK.mkdir(parents=True, exist_ok=True)
    variants = [code_of(None)] + ([code_of(args.baseline)] if args.baseline else [])
    results: dict[str, Any] = {
        "recorded": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "config": {"jobs": args.jobs, "tenants": args.tenants, "active": args.active,
                   "reads": args.reads, "quick": args.quick},
        "machine": machine_info(WORK), "variants": {}}
    for code, label in variants:
        for shape in ("delayed", "queued"):
            log(f"{label}: building and reading the {shape} shape")
            result = measure(code, shape, args)
            results["variants"].setdefault(label, {})[shape] = result
            log(f"{label} {shape}: median {result['median_ms']:.3f} ms, p95 {result['p95_ms']:.3f} ms "
                f"(built in {result['build_s']} s)")
    shutil.rmtree(WORK, ignore_errors=True)
    section = render(results)
    if not args.quick:  # a smoke test records nothing
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
        update_readme(Path(args.readme), section, marker="stats-results")
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
