"""The chaos test's app: every execution records when it started and ended, in wall-clock time.

Each execution appends ``start <job> <attempt> <pid> <epoch>`` before the work and
``end <job> <attempt> <pid> <epoch>`` after it to ``$FLEXIQ_TEST_MARKS/<pid>.log``
(O_APPEND: lines from concurrent threads never interleave).  The sleep is one
``time.sleep``: it blocks in C, as a user's I/O would.
"""

import os
import time

import marks
from flexiqd import Queue
from flexiqd.worker.execution import current_job

queue = Queue()


def _mark(what: str) -> None:
    job = current_job()
    marks.append(f"{what} {job.id} {job.attempts} {os.getpid()} {time.time():.6f}\n")


@queue.task("work")
def work(seconds: float = 0.0) -> str:
    _mark("start")
    time.sleep(seconds)
    _mark("end")
    return "ok"


@queue.task("hog")
def hog(megabytes: int = 1024) -> str:
    """Allocate ``megabytes`` and touch every page, 16 MiB at a time: under a memory limit
    smaller than that, the kernel's OOM killer ends the worker mid-job."""
    _mark("start")
    held = []
    for _ in range(megabytes // 16):
        held.append(bytearray(b"\x01") * (16 << 20))
    _mark("end")
    return f"held {len(held) * 16} MiB"
