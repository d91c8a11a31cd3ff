"""A CPU-bound test app: ``spin(seconds)`` keeps one CPU busy (in C: key stretching) that long."""

from __future__ import annotations

import hashlib
import time

from flexiqd import Queue

queue = Queue()


@queue.task("spin")
def spin(seconds: float = 1.0) -> int:
    rounds, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        hashlib.pbkdf2_hmac("sha256", b"spin", b"salt", 20_000)   # ~10 ms of CPU in C per call
        rounds += 1
    return rounds
