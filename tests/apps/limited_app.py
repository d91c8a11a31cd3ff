"""A test app whose tasks use limited dependencies and record when each execution ran.

Each execution appends ``start <job> <monotonic time> <pid>`` before its work and
``end <job> <monotonic time> <pid>`` after it to ``$FLEXIQ_TEST_MARKS/<pid>.log``
(O_APPEND: lines from concurrent threads never interleave).  CLOCK_MONOTONIC is
one clock for every process of the machine, so intervals of different workers
compare.
"""

import os
import time

import marks
from flexiqd import Queue
from flexiqd.worker.execution import current_job

queue = Queue()


def _mark(what: str) -> None:
    marks.append(f"{what} {current_job().id} {time.monotonic():.6f} {os.getpid()}\n")


@queue.task("partner_sync", uses=["partner_api"])
def partner_sync(seconds: float) -> str:
    _mark("start")
    time.sleep(seconds)  # blocks in C, as a call to the partner would
    _mark("end")
    return "ok"


@queue.task("send_sms", uses=["sms"])
def send_sms() -> str:
    _mark("start")
    _mark("end")
    return "ok"


@queue.task("free")
def free(seconds: float) -> str:
    _mark("start")
    time.sleep(seconds)
    _mark("end")
    return "ok"
