"""The deploy test's app: it reads its version when a worker imports it, as an application's
code is loaded once per worker process, and says which version ran each execution.

At import it reads ``$VERSIONED_APP_FILE`` (a deploy changes it between versions) and writes
``<pid>.version`` beside the marks; the version ``broken`` fails the import, as a bad deploy
would.  Each execution appends ``start <job> <attempt> <pid> <epoch>`` and ``end ...`` to
``$FLEXIQ_TEST_MARKS/<pid>.log`` (tests/system/executions.py reads them).  The work is one
``time.sleep``: it blocks in C.
"""

import os
import time

import marks
from flexiqd import Queue
from flexiqd.worker.execution import current_job

with open(os.environ["VERSIONED_APP_FILE"], encoding="utf-8") as _handle:
    VERSION = _handle.read().strip()
if VERSION == "broken":
    raise RuntimeError("this version of the application cannot be imported")
with open(os.path.join(os.environ["FLEXIQ_TEST_MARKS"], f"{os.getpid()}.version"), "w", encoding="utf-8") as _out:
    _out.write(VERSION + "\n")

queue = Queue()


def _mark(what: str) -> None:
    job = current_job()
    marks.append(f"{what} {job.id} {job.attempts} {os.getpid()} {time.time():.6f}\n")


@queue.task("work")
def work(seconds: float = 0.0) -> str:
    _mark("start")
    time.sleep(seconds)
    _mark("end")
    return VERSION
