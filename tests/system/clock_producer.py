"""The clock-step test's load, run as a process of its own (inside the sandbox, under the same
stepped wall clock as the daemon and the workers when it shares their host).

``python clock_producer.py URL SECONDS``: every ``EVERY`` seconds, ``SHORT`` jobs of
``tests/apps/clock_app.py``'s ``work`` due now and ``DELAYED`` delayed by 1 to ``MAX_DELAY`` seconds,
each given ``due``: the kernel's CLOCK_BOOTTIME plus its delay, read *before* the enqueue, so a
start before ``due`` is a start before its delay had passed, whatever the wall clock did.
Prints one JSON object: the ids enqueued, the delayed ones with their ``due``, the errors.
"""

from __future__ import annotations

import json
import random
import sys
import time

from flexiqd import Queue

EVERY = 0.5
SHORT = 4
# Delays up to MAX_DELAY span a step's hold (the test's STEPS), so delayed jobs wait across
# every step; two a batch keep the count of delayed jobs over the test's bound.
DELAYED = 2
WORK = 0.2
MAX_DELAY = 15.0


def main(url: str, seconds: float) -> None:
    queue = Queue(url)
    rng = random.Random(24)
    ids: list[int] = []
    delayed: dict[int, float] = {}
    errors: list[str] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            ids += [queue.enqueue("work", [WORK], max_attempts=1000) for _ in range(SHORT)]
            for _ in range(DELAYED):
                delay = rng.uniform(1.0, MAX_DELAY)
                due = time.clock_gettime(time.CLOCK_BOOTTIME) + delay
                job_id = queue.enqueue("work", [WORK, due], delay=delay, max_attempts=1000)
                ids.append(job_id)
                delayed[job_id] = due
        except Exception as exc:  # noqa: BLE001 -- the test reports every failed enqueue
            errors.append(f"{type(exc).__name__}: {exc}")
        time.sleep(EVERY)
    queue.close()
    print(json.dumps({"ids": ids, "delayed": delayed, "errors": errors}))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
