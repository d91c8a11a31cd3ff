"""A test app whose task declares its own queue, priority and attempts, and records every
execution (as counting_app does), for producers that enqueue it by name only."""

import os

from flexiqd import Queue
from flexiqd.worker.execution import current_job

queue = Queue()


@queue.task("orders.confirm", queue="orders", priority=4, max_attempts=6, timeout=120)
def confirm(order_id: int) -> int:
    job = current_job()
    line = f"start {job.id} {job.attempts} {os.getpid()}\nend {job.id} {job.attempts} {os.getpid()}\n".encode()
    fd = os.open(os.path.join(os.environ["FLEXIQ_TEST_MARKS"], f"{os.getpid()}.log"),
                 os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return order_id
