"""Retry delays: exponential backoff with full jitter (pure)."""

from __future__ import annotations

import random


def retry_delay(attempt: int, *, base: float = 1.0, cap: float = 300.0,
                rng: random.Random | None = None) -> float:
    """Seconds to wait before retry number ``attempt`` (1 = first retry).

    Full jitter (uniform in [0, min(cap, base * 2**(attempt-1))]) spreads a
    burst of failures so the retries do not arrive together.
    """
    ceiling = min(cap, base * 2 ** max(0, attempt - 1))
    return (rng or random).uniform(0.0, ceiling)
