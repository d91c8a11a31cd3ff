"""The clock-step fault test's app: every execution records when it started and ended on the
kernel's CLOCK_BOOTTIME, which a step of the wall clock does not move (the test steps the
workers' wall clock), so executions on one machine -- or on sandboxes sharing its kernel --
are compared on one clock whatever the wall clock did.

Lines as tests/system/executions.py reads them (``start|end <job> <attempt> <pid> <boottime>``)
in ``$FLEXIQ_TEST_MARKS/<host>-<pid>.log``; a delayed job given ``due`` (the boottime before which it
must not start, taken by its producer before the enqueue) also writes
``due <job> <due> <pid> <started>``.  The work is one ``time.sleep``: it blocks in C.
"""

import os
import time

import marks
from flexiqd import Queue
from flexiqd.worker.execution import current_job

queue = Queue()


def _append(line: str) -> None:
    marks.append(line, name=f"{os.uname().nodename}-{os.getpid()}")


def _mark(what: str) -> float:
    job, at = current_job(), time.clock_gettime(time.CLOCK_BOOTTIME)
    _append(f"{what} {job.id} {job.attempts} {os.getpid()} {at:.6f}\n")
    return at


@queue.task("work")
def work(seconds: float = 0.0, due: float | None = None) -> str:
    started = _mark("start")
    if due is not None:
        _append(f"due {current_job().id} {due:.6f} {os.getpid()} {started:.6f}\n")
    time.sleep(seconds)
    _mark("end")
    return "ok"
