"""How many operations a dependency serves at once, measured: a short sweep of concurrent callers.

``slot_sweep(dependency, levels)``: for each level, that many threads (each its own
connection, as separate workers would hold) call the job's operation back to back for
``seconds``; the completions per second give the level's throughput.  The dependency's
slots are the fewest callers within ``within`` of the best throughput; the knee in workers
follows from the workers' concurrency (``knee_from_slots``).  Seconds, not minutes: a check
of the knee a fixed-fleet sweep (runs.knee_sweep) measures the long way.
"""

from __future__ import annotations

import math
import threading
import time

from .deps import Dependency


def _throughput(dependency: Dependency, callers: int, seconds: float) -> float:
    clients = [dependency.client() for _ in range(callers)]
    done = [0] * callers
    try:
        for client in clients:
            client.call()   # connected before the clock starts
        start = threading.Barrier(callers + 1)
        deadline: list[float] = []

        def call(i: int) -> None:
            start.wait()
            while time.monotonic() < deadline[0]:
                clients[i].call()
                done[i] += 1

        threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(callers)]
        for thread in threads:
            thread.start()
        began = time.monotonic()
        deadline.append(began + seconds)
        start.wait()
        for thread in threads:
            thread.join()
        return sum(done) / (time.monotonic() - began)
    finally:
        for client in clients:
            client.close()


def slot_sweep(dependency: Dependency, levels: list[int], seconds: float = 1.5, within: float = 0.1) -> dict:
    """{"points": {callers: ops/s}, "slots": the fewest callers within ``within`` of the best}."""
    points = {level: round(_throughput(dependency, level, seconds), 1) for level in levels}
    best = max(points.values())
    return {"points": points, "slots": min(level for level, rate in points.items() if rate >= (1 - within) * best)}


def knee_from_slots(slots: int, concurrency: int) -> int:
    """The fewest workers of ``concurrency`` slots each that keep every one of the dependency's busy."""
    return max(1, math.ceil(slots / concurrency))
