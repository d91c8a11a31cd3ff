"""procrastinate's tasks for the PostgreSQL throughput benchmark (``pg_procrastinate.app``).

The libpq connection string comes from ``$BENCH_DSN``.  Synchronous tasks, which
procrastinate's worker runs in a thread; the same two as pg_flexiqd.py.
"""

import os
import time

import procrastinate
from pg_marks import mark

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCH_DSN", "")))


@app.task(name="noop")
def noop(i):
    mark(i)


@app.task(name="sleep10")
def sleep10(i):
    time.sleep(0.01)
    mark(i)
