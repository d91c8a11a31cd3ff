"""The crash-recovery benchmark's task for flexiq 2.1 (``recovery_flexiq:queue``).

Each execution appends ``start <seq> <retry> <pid> <epoch>`` before the work and
``end <seq> <retry> <pid> <epoch>`` after it to ``$BENCH_OUT/<pid>.log`` -- the lines
tests/apps/chaos_app.py writes for flexiqd, with the job's enqueue sequence number
(its first argument) standing for the job id, so both queues are judged by one parser.
The work is one ``time.sleep``: it blocks in C, as a user's I/O would.
"""

import os
import time

from flexiq import Queue
from flexiq.context import current_job

# Four threads per worker process: the concurrency flexiqd's workers get in the benchmark.
queue = Queue(db_path=os.environ.get("BENCH_DB", ".flexiq/flexiq.db"), workers=4)


def _mark(what: str, seq: int) -> None:
    line = f"{what} {seq} {current_job.retry_count} {os.getpid()} {time.time():.6f}\n".encode()
    path = os.path.join(os.environ["BENCH_OUT"], f"{os.getpid()}.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@queue.task(name="work")
def work(seq: int, seconds: float) -> str:
    _mark("start", seq)
    time.sleep(seconds)
    _mark("end", seq)
    return "ok"
