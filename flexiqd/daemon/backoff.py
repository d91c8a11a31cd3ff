"""When to try again something that failed and may succeed later (a connection to a bus that
is restarting): at once, then after ``first`` seconds, doubling up to ``most``.  Pure: times
are given, in seconds of one clock."""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass
class Retry:
    first: float = 1.0
    most: float = 30.0
    failures: int = 0
    next_at: float = -math.inf

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def failed(self, now: float) -> bool:
        """Count a failed attempt made at ``now``; True for the first of a run (the one to log)."""
        self.failures += 1
        self.next_at = now + min(self.first * 2 ** (self.failures - 1), self.most)
        return self.failures == 1
