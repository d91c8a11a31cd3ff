"""The built-in demo app (``flexiqd.demo:queue``): tasks that sleep (IO-bound) or spin (CPU-bound).

A fresh install runs a pool of it, so ``flexiq enqueue flexiqd.demo.sleep 2``
shows the fleet at work without writing any code.
"""

from __future__ import annotations

import time

from .queue.api import Queue

queue = Queue()


@queue.task("flexiqd.demo.sleep")
def sleep(seconds: float = 1.0) -> float:
    """Wait ``seconds`` without using the CPU, like a job waiting on a network call."""
    time.sleep(float(seconds))
    return float(seconds)


@queue.task("flexiqd.demo.spin")
def spin(seconds: float = 1.0) -> int:
    """Keep one CPU busy for ``seconds``, like a CPU-bound job."""
    deadline = time.monotonic() + float(seconds)
    loops = 0
    while time.monotonic() < deadline:
        loops += 1
    return loops


@queue.task("flexiqd.demo.fail")
def fail(message: str = "demo failure") -> None:
    """Always raise: shows retries with backoff and the dead-letter list."""
    raise RuntimeError(message)
