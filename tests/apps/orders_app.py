"""A test app whose task declares its own queue, priority and attempts, and records every
execution (as counting_app does), for producers that enqueue it by name only."""

import os

import marks
from flexiqd import Queue
from flexiqd.worker.execution import current_job

queue = Queue()


@queue.task("orders.confirm", queue="orders", priority=4, max_attempts=6, timeout=120)
def confirm(order_id: int) -> int:
    job = current_job()
    marks.append(f"start {job.id} {job.attempts} {os.getpid()}\nend {job.id} {job.attempts} {os.getpid()}\n")
    return order_id
