"""The fleet test's app: every execution records where and when it started and ended.

Each execution appends ``start <job> <attempt> <host> <epoch>`` before the work and
``end <job> <attempt> <host> <epoch>`` after it to ``$FLEXIQ_TEST_MARKS/<host>-<pid>.log``
(O_APPEND: lines from concurrent threads never interleave; the host name keeps the
files of machines whose pids coincide apart).  The sleep is one ``time.sleep``.
"""

import os
import socket
import time

from flexiqd import Queue
from flexiqd.worker.execution import current_job

queue = Queue()


def _mark(what: str) -> None:
    job = current_job()
    host = socket.gethostname()
    line = f"{what} {job.id} {job.attempts} {host} {time.time():.6f}\n".encode()
    path = os.path.join(os.environ["FLEXIQ_TEST_MARKS"], f"{host}-{os.getpid()}.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@queue.task("work")
def work(seconds: float = 0.0) -> str:
    _mark("start")
    time.sleep(seconds)
    _mark("end")
    return "ok"
