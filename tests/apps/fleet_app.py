"""The fleet test's app: every execution records where and when it started and ended.

Each execution appends ``start <job> <attempt> <host> <epoch>`` before the work and
``end <job> <attempt> <host> <epoch>`` after it to ``$FLEXIQ_TEST_MARKS/<host>-<pid>.log``
(O_APPEND: lines from concurrent threads never interleave; the host name keeps the
files of machines whose pids coincide apart).  The sleep is one ``time.sleep``.
"""

import os
import socket
import time

import marks
from flexiqd import Queue
from flexiqd.worker.execution import current_job

queue = Queue()


def _mark(what: str) -> None:
    job = current_job()
    host = socket.gethostname()
    marks.append(f"{what} {job.id} {job.attempts} {host} {time.time():.6f}\n", name=f"{host}-{os.getpid()}")


@queue.task("work")
def work(seconds: float = 0.0) -> str:
    _mark("start")
    time.sleep(seconds)
    _mark("end")
    return "ok"
