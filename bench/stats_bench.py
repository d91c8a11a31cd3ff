#!/usr/bin/env python3
"""Stats benchmark: how long one ``Backend.stats()`` read takes on large stores of two shapes,
on SQLite and on PostgreSQL.

    .venv/bin/python bench/stats_bench.py [--stores sqlite,postgres] [--baseline REV] [--quick]

Shapes (sizes are options):

- ``delayed``: 10^6 jobs due over the next 24 hours, owned by 100 active tenants,
  each of which also has jobs runnable, running and completed in the last
  minute; and 9,900 tenants of the past, each with one job done two hours ago;
- ``queued``: 10^6 runnable jobs of one tenant, 5,000 of them completed in the
  last minute (the shape of ``queue_bench.py``'s stats measurement).

Each store is built by one subprocess and read by another, fresh one, through
the public API of the code under test: one untimed read, then ``--reads`` timed
ones.  The clock of the reads runs on from the shape's reference time as real
time passes, so delayed jobs come due while they run, as they would under the
daemon.  ``--baseline REV`` measures the ``flexiqd`` package of that git
revision the same way, in the same run.

``--stores`` picks the stores (both by default):

- ``sqlite``: a file under ``bench/.work/stats``, read on the default durable URL;
- ``postgres``: one private PostgreSQL 15 server for the whole run, started as
  the tests start theirs (``tests/pg_server.py``: Debian's binaries, a temporary
  data directory, a unix socket; tuned for tests: fsync, synchronous_commit and
  full_page_writes off, so the figures are the queries' and round trips' cost,
  not the disk's), with a fresh schema for each shape and code revision, read on
  its unix-socket URL with flexiqd's default options.  After the build the
  schema's tables are ANALYZEd, as autovacuum would have done by then.

The aim: a read under 1 ms on SQLite and under 2 ms on PostgreSQL at either shape.

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
STORES = ("sqlite", "postgres")
STORE_NAMES = {"sqlite": "SQLite", "postgres": "PostgreSQL"}
SHAPES = ("delayed", "queued")
CHUNK = 10_000
DAY = 86_400.0


def log(message: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Phases: run in a subprocess with the code under test first on sys.path.
# ---------------------------------------------------------------------------------------------

def phase_build(url: str, shape: str, jobs: int, tenants: int, active: int, reference: float) -> dict:
    from flexiqd.queue import ClaimRequest, NewJob, Outcome

    if url.startswith("sqlite:///"):
        from flexiqd.queue.sqlite.database import SQLiteBackend

        store = SQLiteBackend(url[len("sqlite:///"):], synchronous="normal")  # the fill need not be durable
    else:
        from flexiqd.queue import open_backend

        store = open_backend(url)
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
    built = {"build_s": round(time.perf_counter() - began, 1)}
    if not url.startswith("sqlite:///"):
        began = time.perf_counter()
        analyze(store)
        built["analyze_s"] = round(time.perf_counter() - began, 1)
    store.close()
    return built


def analyze(store: Any) -> None:
    """ANALYZE the tables of a PostgreSQL store's schema: what autovacuum would have done by now.

    The store's connection (autocommit, its schema first on the search path) is
    ``store.database.connection`` in this code and ``store._conn`` in older revisions.
    """
    database = getattr(store, "database", None)
    conn = getattr(database, "connection", None) if database is not None else getattr(store, "_conn", None)
    if conn is None:
        raise SystemExit(f"cannot find the connection of {type(store).__name__} to ANALYZE its schema")
    tables = [row[0] for row in conn.execute(
        "SELECT format('%I.%I', schemaname, tablename) FROM pg_catalog.pg_tables "
        "WHERE schemaname = current_schema()").fetchall()]
    if not tables:
        raise SystemExit("no tables in the store's schema to ANALYZE")
    for table in tables:
        conn.execute(f"ANALYZE {table}")


def phase_read(url: str, reads: int, reference: float) -> dict:
    import flexiqd
    from flexiqd.queue import open_backend

    store = open_backend(url)  # as the daemon opens it
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


class SQLiteStores:
    """Stores on files under WORK, read on the default durable URL."""

    name = "sqlite"

    def __enter__(self) -> "SQLiteStores":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def info(self) -> dict:
        return {}

    def fresh(self, shape: str, label: str) -> tuple[str, Path]:
        db = WORK / f"{shape}.db"
        self.drop(db)
        return f"sqlite:///{db}", db

    def size_mib(self, db: Path) -> int:
        return round(db.stat().st_size / 2**20)

    def drop(self, db: Path) -> None:
        for suffix in ("", "-wal", "-shm"):
            (db.parent / (db.name + suffix)).unlink(missing_ok=True)


class PostgresStores:
    """One private PostgreSQL 15 server for the run (tests/pg_server.py); a fresh schema per store."""

    name = "postgres"

    def __init__(self) -> None:
        sys.path.insert(0, str(ROOT / "tests"))
        import pg_server

        reason = pg_server.unavailable_reason()
        if reason:
            raise SystemExit(f"cannot measure PostgreSQL: {reason} (or leave it out: --stores sqlite)")
        self.database = pg_server.DATABASE
        self.server = pg_server.PostgresServer()

    def __enter__(self) -> "PostgresStores":
        log("starting a private PostgreSQL server")
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()

    def info(self) -> dict:
        settings = ("server_version", "fsync", "synchronous_commit", "full_page_writes", "shared_buffers")
        return {name: self.server.admin(f"SHOW {name}")[0][0] for name in settings}

    def fresh(self, shape: str, label: str) -> tuple[str, str]:
        schema = self.server.fresh_schema()  # what fresh_url() does, keeping the schema's name
        return self.server.socket_url(schema=schema), schema

    def size_mib(self, schema: str) -> int:
        total = self.server.admin(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_catalog.pg_class c "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            f"WHERE n.nspname = '{schema}' AND c.relkind IN ('r', 'm')", database=self.database)[0][0]
        return round(int(total) / 2**20)

    def drop(self, schema: str) -> None:
        self.server.admin(f"DROP SCHEMA {schema} CASCADE", database=self.database)


def measure(stores: SQLiteStores | PostgresStores, code: Path, label: str, shape: str,
            args: argparse.Namespace) -> dict:
    url, handle = stores.fresh(shape, label)
    reference = time.time()
    built = run_phase(code, "build", url=url, shape=shape, jobs=args.jobs, tenants=args.tenants,
                      active=args.active, reference=reference)
    read = run_phase(code, "read", url=url, reads=args.reads, reference=reference)
    if Path(read["code"]).resolve() != code.resolve():
        raise SystemExit(f"measured the code in {read['code']}, not {code}")
    size = stores.size_mib(handle)
    if stores.name == "postgres":  # a million-job schema each: free the space as we go
        stores.drop(handle)
    return {"store": stores.name, "shape": shape, "revision": label, **built, **read, "db_mib": size}


def render(results: dict) -> str:
    config = results["config"]
    machine = results["machine"]
    stores = [store for store in STORES if any(r["store"] == store for r in results["results"])]
    urls = {"sqlite": "SQLite on the default durable URL",
            "postgres": "PostgreSQL on a unix-socket URL to a schema of its own, default options"}
    lines = [f"Recorded {results['recorded']}; {config['reads']} timed reads of each store after one "
             f"untimed one; {'; '.join(urls[store] for store in stores)}. "
             f"Raw numbers in `results-stats.json`.", "",
             f"Machine: {machine.get('cpu', '?')}, {machine['cpus']} cores, "
             f"{machine.get('filesystem', '?')}, Python {machine['python']}, SQLite {machine['sqlite']}."]
    pg = results.get("postgres")
    if pg:
        lines[-1] += (f" PostgreSQL {pg['server_version'].split()[0]} on the same machine, a private "
                      f"server as the tests start it (fsync={pg['fsync']}, "
                      f"synchronous_commit={pg['synchronous_commit']}, "
                      f"full_page_writes={pg['full_page_writes']}, shared_buffers={pg['shared_buffers']}); "
                      f"each schema ANALYZEd after its build.")
    lines += ["", "| store | shape | code | median ms | p95 ms | max ms | runnable | delayed | tenants shown "
                  "| arrivals/s |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    names = {"delayed": f"{config['jobs']:,} delayed, {config['tenants']:,} tenants ({config['active']} active)",
             "queued": f"{config['jobs']:,} queued, 1 tenant"}
    for store in stores:
        for shape in SHAPES:
            for m in results["results"]:
                if m["store"] == store and m["shape"] == shape:
                    last = m["last"]
                    lines.append(f"| {STORE_NAMES[store]} | {names[shape]} | {m['revision']} | "
                                 f"{m['median_ms']:.3f} | {m['p95_ms']:.3f} | {m['max_ms']:.3f} | "
                                 f"{last['runnable']:,} | {last['delayed']:,} | {last['tenants']:,} | "
                                 f"{last['arrival_rate']:g} |")
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
    parser.add_argument("--stores", default=",".join(STORES),
                        help="comma-separated, of: sqlite, postgres (default: both)")
    parser.add_argument("--baseline", metavar="REV", help="also measure the flexiqd package of this revision")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test (~30 s)")
    parser.add_argument("--out", default=str(BENCH / "results-stats.json"))
    parser.add_argument("--readme", default=str(BENCH / "README.md"))
    args = parser.parse_args(argv)
    chosen = [store.strip() for store in args.stores.split(",") if store.strip()]
    unknown = sorted(set(chosen) - set(STORES))
    if unknown or not chosen:
        parser.error(f"--stores: unknown store {unknown[0]!r}" if unknown else "--stores: name at least one")
    chosen = [store for store in STORES if store in chosen]
    if args.quick:
        args.jobs, args.tenants, args.active, args.reads = 20_000, 200, 10, 20
    WORK.mkdir(parents=True, exist_ok=True)
    variants = [code_of(None)] + ([code_of(args.baseline)] if args.baseline else [])
    for code, label in variants:  # before hours of building: a revision older than the PostgreSQL store
        if "postgres" in chosen and not any((code / "flexiqd" / "queue" / name).exists() for name in ("postgres.py", "postgres")):
            parser.error(f"revision {label} has no PostgreSQL store: measure it with --stores sqlite")
    results: dict[str, Any] = {
        "recorded": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "config": {"jobs": args.jobs, "tenants": args.tenants, "active": args.active,
                   "reads": args.reads, "quick": args.quick, "stores": chosen},
        "machine": machine_info(WORK), "results": []}
    for name in chosen:
        with (PostgresStores() if name == "postgres" else SQLiteStores()) as stores:
            info = stores.info()
            if info:
                results[name] = info
            for code, label in variants:
                for shape in SHAPES:
                    log(f"{STORE_NAMES[name]} {label}: building and reading the {shape} shape")
                    result = measure(stores, code, label, shape, args)
                    results["results"].append(result)
                    log(f"{STORE_NAMES[name]} {label} {shape}: median {result['median_ms']:.3f} ms, "
                        f"p95 {result['p95_ms']:.3f} ms (built in {result['build_s']} s)")
    shutil.rmtree(WORK, ignore_errors=True)
    section = render(results)
    if not args.quick:  # a smoke test records nothing
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
        update_readme(Path(args.readme), section, marker="stats-results")
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
