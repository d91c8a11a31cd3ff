"""The benchmark's no-op task for flexiqd (``bench_flexiqd:queue``).

Each run appends ``<arg> <job id> <time>`` to a file per process under
``$BENCH_OUT``, so the benchmark can check that every job ran exactly once.
"""

import os
import time

from flexiqd import Queue
from flexiqd.worker.execution import current_job

queue = Queue(os.environ.get("BENCH_DB"))
_out: list[int] = []


def _fd() -> int:
    if not _out:
        path = os.path.join(os.environ["BENCH_OUT"], f"ran-{os.getpid()}.txt")
        _out.append(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    return _out[0]


@queue.task("noop")
def noop(i):
    job = current_job()
    os.write(_fd(), f"{i} {job.id if job else '-'} {time.time():.6f}\n".encode())
