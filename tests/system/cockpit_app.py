"""The tasks the Cockpit browser test's pool runs (its ``app: cockpit_app:queue``).

``count`` records every execution as tests/apps/counting_app.py does, so the test
counts executions; ``greet`` is a job whose arguments and result are easy to spot.  ``charge`` stands for a call to a payment provider: it uses the
dependency ``payments`` and fails while the provider is "down" (no file
``$FLEXIQ_TEST_MARKS/payments-up``), so a job enqueued with one attempt becomes a
dead letter that a retry, once the provider is back, runs to the end.
"""

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


@queue.task("greet")
def greet(name: str) -> str:
    _mark("start")
    _mark("end")
    return f"hello {name}"


@queue.task("charge", uses=["payments"])
def charge(customer: str, amount_cents: int) -> dict:
    _mark("start")
    if not os.path.exists(os.path.join(os.environ["FLEXIQ_TEST_MARKS"], "payments-up")):
        raise ConnectionError(f"payment provider unreachable while charging {customer} {amount_cents} cents")
    _mark("end")
    return {"customer": customer, "charged": amount_cents}
