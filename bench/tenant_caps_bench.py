#!/usr/bin/env python3
"""What a claim costs when a capped tenant's backlog lies ahead of everyone else's.

On each store (SQLite with ``synchronous=normal``, and PostgreSQL on this machine started
by ``tests/pg_server.py``), ``--backlog`` due jobs of tenant ``acme`` are enqueued first,
then jobs of tenant ``globex``.  ``acme`` is capped at 2 and two of its jobs are claimed
and held, so it is at its cap.  Then, ``--claims`` times each:

- ``capped``: a claim of 4 jobs with the tenant caps: it must step past acme's backlog
  and take globex's jobs;
- ``without caps``: the same claim without tenant caps, on the same store (it takes
  acme's jobs, first in the queue).

Each claim is timed alone; its jobs are acked afterwards, outside the timing.  The
median and the p95 are kept.  Results go to ``bench/results-tenant-caps.json``;
docs/tenants.md quotes a run.

    .venv/bin/python bench/tenant_caps_bench.py [--backlog 100000] [--claims 300] [--no-postgres]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from flexiqd.queue import ClaimRequest, NewJob, Outcome, open_backend  # noqa: E402
from flexiqd.queue.limits import TenantCaps  # noqa: E402

CAPS = TenantCaps({"acme": 2})
BATCH = 10_000
CLAIM = 4


def measure(backend, backlog: int, claims: int) -> dict:
    now = time.time()
    for start in range(0, backlog, BATCH):
        backend.enqueue([NewJob(task="t", payload=i, tenant="acme") for i in range(min(BATCH, backlog - start))],
                        now=now)
    backend.enqueue([NewJob(task="t", payload=i, tenant="globex") for i in range(CLAIM * claims + 10)], now=now)
    held = backend.claim(ClaimRequest("holder", ("default",), 2, 3600.0, tenant_caps=CAPS), now=time.time())
    assert [job.tenant for job in held] == ["acme", "acme"], held
    figures = {}
    for name, caps, tenant in (("capped", CAPS, "globex"), ("without caps", None, "acme")):
        times = []
        for _ in range(claims):
            started = time.perf_counter()
            jobs = backend.claim(ClaimRequest("bench", ("default",), CLAIM, 300.0, tenant_caps=caps), now=time.time())
            times.append((time.perf_counter() - started) * 1000)
            assert len(jobs) == CLAIM and {job.tenant for job in jobs} == {tenant}, (name, jobs)
            backend.settle("bench", [Outcome.ack(job.id) for job in jobs], now=time.time())
        times.sort()
        figures[name] = {"median_ms": round(statistics.median(times), 3),
                         "p95_ms": round(times[int(0.95 * (len(times) - 1))], 3)}
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=300)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    load_at_start = round(os.getloadavg()[0], 2)
    results = {}
    with tempfile.TemporaryDirectory(prefix="flexiq-tenant-caps-") as folder:
        backend = open_backend(f"sqlite:///{folder}/queue.db?synchronous=normal")
        try:
            results["sqlite"] = measure(backend, args.backlog, args.claims)
        finally:
            backend.close()
    print(json.dumps({"sqlite": results["sqlite"]}))
    if not args.no_postgres:
        from pg_server import PostgresServer

        with PostgresServer() as server:
            backend = open_backend(server.fresh_url())
            try:
                results["postgresql"] = measure(backend, args.backlog, args.claims)
            finally:
                backend.close()
        print(json.dumps({"postgresql": results["postgresql"]}))
    record = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}",
              "load_1min_at_start_and_end": [load_at_start, round(os.getloadavg()[0], 2)],
              "backlog": args.backlog, "claims": args.claims, "claim_size": CLAIM,
              "postgresql_server": "tests/pg_server.py: on this machine, over its unix socket, fsync off",
              "results": results}
    (BENCH / "results-tenant-caps.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "results"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
