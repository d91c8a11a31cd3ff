"""A test app whose tasks record every execution, so tests count executions, not completions.

Each execution appends ``start <job> <attempt> <pid>`` before the work and
``end <job> <attempt> <pid>`` after it to ``$FLEXIQ_TEST_MARKS/<pid>.log``
(O_APPEND: lines from concurrent threads never interleave).
"""

import asyncio
import os
import time

import marks
from flexiqd import Queue
from flexiqd.worker.execution import current_job

queue = Queue()


def _mark(what: str) -> None:
    job = current_job()
    marks.append(f"{what} {job.id} {job.attempts} {os.getpid()}\n")


@queue.task("count")
def count(seconds: float = 0.0) -> str:
    _mark("start")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # short sleeps: interruptible at a drain's end
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    _mark("end")
    return "ok"


@queue.task("count_async")
async def count_async(seconds: float = 0.0) -> str:
    _mark("start")
    await asyncio.sleep(seconds)
    _mark("end")
    return "ok"
