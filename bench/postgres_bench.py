#!/usr/bin/env python3
"""PostgreSQL store benchmark: ``stats()`` and ``claim()`` on a store of 10^6 jobs.

    .venv/bin/python bench/postgres_bench.py [--jobs N] [--quick]

Starts its own PostgreSQL 15 (the tests' tests/pg_server.py: Debian's binaries,
fsync off -- the figures are the queries' cost, not the disk's), builds one store
through the public API -- ``--jobs`` runnable jobs of one queue spread over 100
tenants, a tenth as many delayed ones due over the next day, 5,000 completed in
the last minute -- then times, on a fresh connection: ``stats()`` (one untimed,
then ``--reads`` timed), and a claim-and-ack of 10 jobs at a time (``--claims``).

Results go to ``bench/results-postgres.json`` and to the PostgreSQL section of
``bench/README.md``.  No test depends on these timings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(BENCH)]

from pg_server import PostgresServer  # noqa: E402
from queue_bench import machine_info, update_readme  # noqa: E402

from flexiqd.queue import ClaimRequest, NewJob, Outcome, open_backend  # noqa: E402

CHUNK = 10_000
DAY = 86_400.0


def build(url: str, jobs: int, now: float) -> float:
    store = open_backend(url)
    started = time.perf_counter()
    for at in range(0, jobs, CHUNK):
        store.enqueue([NewJob(task="t", payload=i, tenant=f"tenant-{i % 100}", run_at=now - 60)
                       for i in range(at, min(jobs, at + CHUNK))], now=now - 60)
    delayed = jobs // 10
    for at in range(0, delayed, CHUNK):
        store.enqueue([NewJob(task="t", payload=i, run_at=now + DAY * i / delayed)
                       for i in range(at, min(delayed, at + CHUNK))], now=now - 60)
    for _ in range(5):  # 5,000 completions in the last minute: the duration sample is full
        claimed = store.claim(ClaimRequest("bench:build:1", ("default",), 1000), now=now - 30)
        store.settle("bench:build:1", [Outcome.ack(job.id) for job in claimed], now=now - 20)
    elapsed = time.perf_counter() - started
    store.database.connection.execute("ANALYZE")  # what autovacuum would have done by now
    store.close()
    return elapsed


def measure(url: str, reads: int, claims: int, now: float) -> dict:
    store = open_backend(url)
    store.stats("default", now=now, horizon=60)
    times = []
    for i in range(reads):
        started = time.perf_counter()
        stats = store.stats("default", now=now + i * 0.01, horizon=60)
        times.append(time.perf_counter() - started)
    claim_times = []
    for i in range(claims):
        started = time.perf_counter()
        settled, claimed = store.settle_and_claim(
            "bench:w:1", [], ClaimRequest("bench:w:1", ("default",), 10), now=now + i * 0.01)
        store.settle("bench:w:1", [Outcome.ack(job.id) for job in claimed], now=now + i * 0.01)
        claim_times.append(time.perf_counter() - started)
    store.close()
    return {"stats_ms_median": round(statistics.median(times) * 1000, 2),
            "stats_ms_max": round(max(times) * 1000, 2),
            "claim_and_ack_10_ms_median": round(statistics.median(claim_times) * 1000, 2),
            "runnable": stats.runnable, "delayed": stats.delayed, "tenants": len(stats.tenants)}


def render(result: dict) -> str:
    return "\n".join([
        f"Measured {result['date']} on {result['machine'].get('cpu', '?')} "
        f"({result['machine'].get('cpus')} CPUs); PostgreSQL 15 on the same machine, fsync off.",
        "",
        "| store | runnable | delayed | tenants | build (s) | stats() median (ms) | stats() max (ms) "
        "| claim+ack of 10 median (ms) |",
        "|---|---|---|---|---|---|---|---|",
        f"| PostgreSQL | {result['runnable']:,} | {result['delayed']:,} | {result['tenants']} "
        f"| {result['build_s']:.0f} | {result['stats_ms_median']} | {result['stats_ms_max']} "
        f"| {result['claim_and_ack_10_ms_median']} |",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--reads", type=int, default=20)
    parser.add_argument("--claims", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="10,000 jobs, no results written")
    args = parser.parse_args()
    if args.quick:
        args.jobs = 10_000
    now = time.time()
    with PostgresServer() as server:
        url = server.fresh_url()
        build_s = build(url, args.jobs, now)
        result = measure(url, args.reads, args.claims, now)
    result.update(build_s=round(build_s, 1), jobs=args.jobs, date=time.strftime("%Y-%m-%d"),
                  machine=machine_info())
    print(json.dumps(result, indent=2))
    if not args.quick:
        (BENCH / "results-postgres.json").write_text(json.dumps(result, indent=2) + "\n")
        update_readme(BENCH / "README.md", render(result), marker="postgres-results")
    return 0


if __name__ == "__main__":
    sys.exit(main())
