#!/usr/bin/env python3
"""What checking a SQLite store costs, by its size: the daemon's check at start and ``flexiq check``'s.

For each size (default 100,000 and 1,000,000 jobs), a store is built with flexiqd's own
schema through ``SQLiteBackend.enqueue`` (batches of 10,000; 80 % of the jobs then marked
done, as a store with retention holds mostly finished jobs), and each depth of
``flexiqd.queue.sqlite.check`` is timed, ``--reps`` times, the median kept:

- ``files``: the header and write-ahead-log checks every opener runs;
- ``quick``: + ``PRAGMA quick_check`` (the daemon's check at start);
- ``full``: + ``PRAGMA integrity_check``, foreign keys, the counts (``flexiq check``).

Warm: the file in the page cache (as on a host that just ran).  Cold: the file's cached
pages dropped first with ``posix_fadvise(DONTNEED)`` (as after a reboot), which touches
this file only.  Results go to ``bench/results-store-check.json``; bench/store_check.md
records a run.

    .venv/bin/python bench/store_check_bench.py [--sizes 100000,1000000] [--reps 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from flexiqd.queue.sqlite.database import SQLiteBackend  # noqa: E402
from flexiqd.queue.sqlite.check import Depth, check_store  # noqa: E402
from flexiqd.queue.types import NewJob  # noqa: E402

BATCH = 10_000


def build(path: str, jobs: int) -> None:
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    backend = SQLiteBackend(path, synchronous="normal")
    try:
        now = time.time()
        for start in range(0, jobs, BATCH):
            count = min(BATCH, jobs - start)
            backend.enqueue([NewJob(task="bench.noop", payload={"args": [start + i], "kwargs": {}},
                                    queue=f"q{(start + i) % 4}") for i in range(count)], now=now)
        done = int(jobs * 0.8)
        conn = backend.database.connection
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE jobs SET state = 'done', started_at = enqueued_at, finished_at = enqueued_at + 1, "
                     "attempts = 1 WHERE id <= ?", (done,))
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        backend.close()


def drop_cache(path: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        try:
            fd = os.open(path + suffix, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(path: str, depth: Depth, cold: bool) -> float:
    if cold:
        drop_cache(path)
    started = time.perf_counter()
    report = check_store(path, depth)
    seconds = time.perf_counter() - started
    if not report.healthy:
        raise SystemExit(f"the bench store is damaged: {report.summary()}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default=str(BENCH / ".work" / "store-check"))
    parser.add_argument("--out", default=str(BENCH / "results-store-check.json"))
    args = parser.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    results = []
    for jobs in (int(size) for size in args.sizes.split(",")):
        path = os.path.join(args.dir, f"store-{jobs}.db")
        started = time.perf_counter()
        build(path, jobs)
        built = time.perf_counter() - started
        row = {"jobs": jobs, "file_bytes": os.path.getsize(path), "build_seconds": round(built, 1)}
        for depth in Depth:
            for cold in (False, True):
                samples = [timed(path, depth, cold) for _ in range(args.reps)]
                row[f"{depth.value}_{'cold' if cold else 'warm'}_seconds"] = {
                    "median": round(statistics.median(samples), 4), "samples": [round(s, 4) for s in samples]}
        results.append(row)
        print(json.dumps(row), flush=True)
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
    document = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                            "sqlite": __import__("sqlite3").sqlite_version, "platform": platform.platform()},
                "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "reps": args.reps,
                "results": results}
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=2)
        handle.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
