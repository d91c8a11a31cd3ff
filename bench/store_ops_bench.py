#!/usr/bin/env python3
"""How long ``flexiq backup`` and ``flexiq move-store`` take as a SQLite store grows, and
what a producer feels meanwhile.

For each size: a store of N jobs (nine in ten done, each with its attempt recorded; the
rest queued), then
- ``backup``: the wall time of ``backup_store`` and the copy's size, while a producer
  enqueues one job at a time in a thread: its slowest enqueue during the copy
  (WAL: the copy holds a read snapshot, writers go on);
- ``move``: the wall time of ``move_store`` into an empty schema of a throw-away
  PostgreSQL 15 (tests/pg_server.py, fsync off -- a lower bound for a real server), which
  is also how long the file's write lock is held: producers wait that long.

Writes bench/results-store-ops.json and prints a table for bench/store_ops.md.

    .venv/bin/python bench/store_ops_bench.py [--sizes 10000,100000]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sqlite3
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from flexiqd.queue import NewJob, open_backend  # noqa: E402
from flexiqd.queue.backup import backup_store  # noqa: E402
from flexiqd.queue.move import move_store  # noqa: E402
from pg_server import PostgresServer  # noqa: E402


def fill(path: pathlib.Path, jobs: int, now: float) -> None:
    """``jobs`` jobs, nine in ten done with an attempt recorded, written directly in batches."""
    open_backend(f"sqlite:///{path}").close()  # the schema
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    payload = json.dumps({"args": ["someone@example.com", 12345], "kwargs": {"template": "welcome"}})
    rows, executions = [], []
    for job_id in range(1, jobs + 1):
        done = job_id % 10 != 0
        rows.append((job_id, "default", "mail.send", payload, "done" if done else "queued", now - 3600,
                     1 if done else 0, 3, now - 3600, now - 3599 if done else None, now - 3598 if done else None,
                     '"ok"' if done else None))
        if done:
            executions.append((job_id, 1, "web1:default-1:42", now - 3599, now - 3598, "ack"))
    conn.executemany("INSERT INTO jobs (id, queue, task, payload, state, run_at, attempts, max_attempts, "
                     "enqueued_at, started_at, finished_at, result) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", rows)
    conn.executemany("INSERT INTO executions (job_id, attempt, worker, started_at, finished_at, outcome) "
                     "VALUES (?,?,?,?,?,?)", executions)
    conn.execute("COMMIT")
    conn.close()


class Producer(threading.Thread):
    """Enqueues one job at a time until stopped; keeps each enqueue's latency."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.latencies: list[float] = []
        self.failures = 0
        self._halt = threading.Event()

    def run(self) -> None:
        backend = open_backend(self.url)
        try:
            while not self._halt.is_set():
                started = time.perf_counter()
                try:
                    backend.enqueue([NewJob(task="t")], now=time.time())
                    self.latencies.append(time.perf_counter() - started)
                except Exception:  # noqa: BLE001 -- counted, the bench goes on
                    self.failures += 1
                time.sleep(0.005)
        finally:
            backend.close()

    def stop(self) -> None:
        self._halt.set()
        self.join()


def one_size(jobs: int, server: PostgresServer, work: pathlib.Path) -> dict:
    path = work / f"queue-{jobs}.db"
    fill(path, jobs, time.time())
    url = f"sqlite:///{path}"
    producer = Producer(url)
    producer.start()
    time.sleep(0.2)
    before = len(producer.latencies)
    started = time.perf_counter()
    report = backup_store(url, str(work / f"backup-{jobs}.db"))
    backup_seconds = time.perf_counter() - started
    during = producer.latencies[before:]
    producer.stop()
    target = server.fresh_url()
    started = time.perf_counter()
    moved = move_store(url, target)
    move_seconds = time.perf_counter() - started
    return {"jobs": jobs, "file_bytes": os.path.getsize(path), "backup_seconds": round(backup_seconds, 3),
            "backup_bytes": report.size, "enqueues_during_backup": len(during),
            "slowest_enqueue_during_backup_ms": round(max(during, default=0.0) * 1000, 1),
            "enqueue_failures": producer.failures, "move_seconds": round(move_seconds, 3),
            "moved_jobs": moved.jobs, "moved_attempts": moved.executions}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--out", default=str(REPO / "bench" / "results-store-ops.json"))
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    results = []
    with PostgresServer() as server, tempfile.TemporaryDirectory(prefix="flexiq-store-ops-") as work:
        for jobs in sizes:
            results.append(one_size(jobs, server, pathlib.Path(work)))
            print(json.dumps(results[-1]), flush=True)
    machine = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version,
               "when": time.strftime("%Y-%m-%d", time.gmtime())}
    pathlib.Path(args.out).write_text(json.dumps({"machine": machine, "results": results}, indent=1) + "\n")
    print("| jobs | file | backup | slowest enqueue during it | move (file locked) |")
    print("|---:|---:|---:|---:|---:|")
    for row in results:
        print(f"| {row['jobs']:,} | {row['file_bytes'] / 2**20:.1f} MiB | {row['backup_seconds']:.2f} s | "
              f"{row['slowest_enqueue_during_backup_ms']:.1f} ms ({row['enqueues_during_backup']} enqueues) | "
              f"{row['move_seconds']:.2f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
