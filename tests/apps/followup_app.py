"""A test app whose first task enqueues a follow-up job through the application's own Queue.

The Queue names a store of its own, as an application written for one machine does
(``$FOLLOWUP_APP_URL``, a SQLite file): inside a worker, the follow-up must still go to
the store the worker claims from.  Each execution is recorded, as in counting_app.
"""

import os

import marks
from flexiqd import Queue
from flexiqd.worker.execution import current_job

queue = Queue(os.environ["FOLLOWUP_APP_URL"])


def _mark(what: str) -> None:
    job = current_job()
    marks.append(f"{what} {job.id} {job.attempts} {os.getpid()}\n")


@queue.task("order.placed")
def placed(order: int) -> str:
    _mark("start")
    send_receipt.enqueue(order)
    _mark("end")
    return "ok"


@queue.task("order.receipt")
def send_receipt(order: int) -> str:
    _mark("start")
    _mark("end")
    return f"receipt {order}"
