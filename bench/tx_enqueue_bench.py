#!/usr/bin/env python3
"""What enqueueing in the application's own transaction costs, on PostgreSQL.

    .venv/bin/python bench/tx_enqueue_bench.py [--n N] [--quick]

Starts its own PostgreSQL 15 (the tests' tests/pg_server.py: Debian's binaries, fsync
off -- the figures are the statements' and round trips' cost, not the disk's), then
times ``--n`` transactions of each kind, the kinds in turns:

- ``business only``: the application's transaction alone (one INSERT into its table);
- ``+ connection=``: the same, plus ``task.enqueue(..., connection=conn)`` (Python);
- ``+ flexiq_enqueue``: the same, plus ``SELECT flexiq_enqueue(...)`` (SQL);
- ``store.enqueue``: an enqueue in a transaction of its own (the store's connection),
  for comparison.

Results go to ``bench/results-tx-enqueue.json`` and to bench/README.md.  No test
depends on these timings.
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

from flexiqd.queue import NewJob, Queue, open_backend  # noqa: E402
from flexiqd.queue.url import postgres_connect_options  # noqa: E402


def timed(n: int, kinds: dict) -> dict:
    """Run each of ``kinds`` (name -> one(i)) n times, in turns (so a busy moment of a shared
    machine falls on each alike), after 50 untimed turns; per-call milliseconds and calls
    per second of the time each took."""
    for i in range(50):
        for one in kinds.values():
            one(-1 - i)
    times: dict = {name: [] for name in kinds}
    for i in range(n):
        for name, one in kinds.items():
            at = time.perf_counter()
            one(i)
            times[name].append((time.perf_counter() - at) * 1000)
    results = {}
    for name, taken in times.items():
        taken.sort()
        results[name] = {"n": n, "median_ms": round(statistics.median(taken), 3),
                         "p95_ms": round(taken[int(0.95 * (n - 1))], 3), "per_second": round(n * 1000 / sum(taken))}
    return results


def measure(url: str, n: int) -> dict:
    import psycopg

    app = Queue(url)

    @app.task("orders.confirm", queue="orders")
    def confirm(order_id):
        return order_id

    store = open_backend(url)
    conn = psycopg.connect(postgres_connect_options(url).conninfo)
    conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY)")
    conn.commit()
    keys = iter(range(10**9))

    def business(_):
        with conn.transaction():
            conn.execute("INSERT INTO orders VALUES (%s)", (next(keys),))

    def with_python(_):
        with conn.transaction():
            order = next(keys)
            conn.execute("INSERT INTO orders VALUES (%s)", (order,))
            confirm.enqueue(order, connection=conn)

    def with_sql(_):
        with conn.transaction():
            order = next(keys)
            conn.execute("INSERT INTO orders VALUES (%s)", (order,))
            conn.execute("SELECT flexiq_enqueue('orders.confirm', jsonb_build_array(%s::bigint))", (order,))

    def own_transaction(i):
        store.enqueue([NewJob(task="orders.confirm", queue="orders", payload={"args": [i], "kwargs": {}})],
                      now=time.time())

    results = timed(n, {"business only": business, "+ connection=": with_python,
                        "+ flexiq_enqueue": with_sql, "store.enqueue": own_transaction})
    conn.close()
    store.close()
    app.close()
    return results


def table(results: dict, machine: dict, when: str) -> str:
    lines = [f"Measured {when} on {machine.get('cpu', '?')} ({machine.get('cpus')} CPUs); PostgreSQL 15 on the same "
             f"machine over its unix socket, fsync off; {next(iter(results.values()))['n']} transactions each.",
             "", "| transaction | median (ms) | p95 (ms) | per second |", "|---|---|---|---|"]
    for name, row in results.items():
        lines.append(f"| {name} | {row['median_ms']} | {row['p95_ms']} | {row['per_second']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="200 of each, records nothing")
    args = parser.parse_args(argv)
    n = 200 if args.quick else args.n
    with PostgresServer() as server:
        results = measure(server.fresh_url(), n)
    machine = machine_info()
    when = time.strftime("%Y-%m-%d", time.gmtime())
    print(table(results, machine, when))
    if not args.quick:
        (BENCH / "results-tx-enqueue.json").write_text(
            json.dumps({"measured": when, "machine": machine, "results": results}, indent=2) + "\n")
        update_readme(BENCH / "README.md", table(results, machine, when), marker="tx-enqueue-results")
    return 0


if __name__ == "__main__":
    sys.exit(main())
