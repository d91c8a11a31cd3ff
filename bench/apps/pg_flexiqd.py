"""flexiqd's tasks for the PostgreSQL throughput benchmark (``pg_flexiqd:queue``).

The store's URL comes from ``$BENCH_DB``.  ``noop`` does nothing but leave its mark;
``sleep10`` blocks 10 ms in C (``time.sleep``) first.
"""

import os
import time

from flexiqd import Queue
from pg_marks import mark

queue = Queue(os.environ.get("BENCH_DB"))


@queue.task("noop")
def noop(i):
    mark(i)


@queue.task("sleep10")
def sleep10(i):
    time.sleep(0.01)
    mark(i)


# The same work for jobs that use a limited dependency (the ``flexiqd-capped`` runs).
@queue.task("noop_capped", uses=["bench_dep"])
def noop_capped(i):
    mark(i)


@queue.task("sleep10_capped", uses=["bench_dep"])
def sleep10_capped(i):
    time.sleep(0.01)
    mark(i)
