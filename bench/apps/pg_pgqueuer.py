"""pgqueuer's entrypoints for the PostgreSQL throughput benchmark (``pgqueuer run pg_pgqueuer:main``).

The connection string comes from ``$BENCH_DSN``; asyncpg is pgqueuer's own default driver.
pgqueuer runs only ``async`` entrypoints, so ``sleep10`` puts its ``time.sleep`` in a
thread (``asyncio.to_thread``), as pgqueuer's documentation says to do for blocking
code; that thread pool has ``$BENCH_CONCURRENCY`` threads (4), so a process sleeps in at
most as many jobs at once as the other libraries' 4 slots per process allow.  Its
defaults otherwise: batches of 10, no ``concurrency_limit`` (a limit of 4 on the
entrypoints instead made it drain at 40-50 jobs/s here).
"""

import asyncio
import concurrent.futures
import contextlib
import os
import time

import asyncpg
from pg_marks import mark
from pgqueuer import AsyncpgDriver, PgQueuer


def _blocking_sleep() -> None:
    time.sleep(0.01)


@contextlib.asynccontextmanager
async def main():
    """The factory pgqueuer's runner enters: a PgQueuer on one asyncpg connection."""
    threads = int(os.environ.get("BENCH_CONCURRENCY", "4"))
    asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(threads))
    connection = await asyncpg.connect(os.environ["BENCH_DSN"])
    pgq = PgQueuer(AsyncpgDriver(connection))

    @pgq.entrypoint("noop")
    async def noop(job) -> None:
        mark(int(job.payload))

    @pgq.entrypoint("sleep10")
    async def sleep10(job) -> None:
        await asyncio.to_thread(_blocking_sleep)
        mark(int(job.payload))

    try:
        yield pgq
    finally:
        await connection.close()


if __name__ == "__main__":
    # What `pgqueuer run pg_pgqueuer:main` does, with its defaults and on its event loop
    # (uvloop), without its command line, which fails here before it starts (typer 0.29.2
    # with Debian's click 8.1.3 hands it --log-level as a string).
    import pgqueuer
    from pgqueuer.adapters.cli.cli import asyncio_run

    asyncio_run(pgqueuer.run("pg_pgqueuer:main"))
