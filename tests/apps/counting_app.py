"""A test app whose tasks record every execution, so tests count executions, not completions.

Each execution appends ``start <job> <attempt> <pid>`` before the work and
``end <job> <attempt> <pid>`` after it to ``$FLEXIQ_TEST_MARKS/<pid>.log``
(O_APPEND: lines from concurrent threads never interleave).
"""

import asyncio
import os
import time

from flexiqd import Queue
from flexiqd.worker.execution import current_job

queue = Queue()


def _mark(what: str) -> None:
    job = current_job()
    directory = os.environ["FLEXIQ_TEST_MARKS"]
    line = f"{what} {job.id} {job.attempts} {os.getpid()}\n".encode()
    fd = os.open(os.path.join(directory, f"{os.getpid()}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


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
