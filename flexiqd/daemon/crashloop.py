"""Pools whose workers keep failing: counted, reported, and their restarts backed off.

A worker unit that fails (its process exits with an error, is killed, or runs into
systemd's start limit) is replaced when the pool needs it.  When the pool's workers
keep failing -- the application cannot be imported, the store refuses them, a task
exhausts memory every time -- replacing them at once only turns the loop faster.
Once ``LOOP_AFTER`` workers of a pool failed within ``WINDOW`` seconds, the pool is
*crash-looping*: status, STATUS=, the metrics and the journal say so, with how the
last one ended, and a new start waits ``backoff`` seconds after the last failure
(doubling with each failure, up to ``BACKOFF_MAX``).  A window with fewer failures
ends it.

Pure: time is an argument.
"""

from __future__ import annotations

import dataclasses

# Failures counted over this many seconds.
WINDOW = 300.0
# This many failures within the window make a crash loop.
LOOP_AFTER = 3
# The pause before a new start after the last failure: the first, then doubling up to the most.
BACKOFF_FIRST = 2.0
BACKOFF_MAX = 60.0


@dataclasses.dataclass(frozen=True)
class CrashLoop:
    """A pool's crash loop: ``failures`` within the window, the last at ``last_at``, ending as
    ``last_error`` says (None: unknown); no new worker starts before ``next_start_at``."""

    failures: int
    since: float
    last_at: float
    last_error: str | None
    next_start_at: float

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def backoff(failures: int) -> float:
    """Seconds a new start waits after the last of ``failures`` failures in a loop."""
    return min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** max(0, failures - LOOP_AFTER))


class CrashLoops:
    """Every pool's recent worker failures."""

    def __init__(self) -> None:
        self._failures: dict[str, list[float]] = {}
        self._last_error: dict[str, str | None] = {}

    def failed(self, pool: str, at: float, error: str | None) -> None:
        """A worker of ``pool`` failed at ``at`` (``error``: how it ended, when known)."""
        self._failures.setdefault(pool, []).append(at)
        if error or pool not in self._last_error:
            self._last_error[pool] = error

    def recent(self, pool: str, now: float) -> list[float]:
        """The failures of ``pool`` within the window before ``now``."""
        kept = [at for at in self._failures.get(pool, []) if now - at <= WINDOW]
        self._failures[pool] = kept
        return kept

    def loop(self, pool: str, now: float) -> CrashLoop | None:
        """``pool``'s crash loop at ``now``; None when its workers are not failing that often."""
        recent = self.recent(pool, now)
        if len(recent) < LOOP_AFTER:
            return None
        last = max(recent)
        return CrashLoop(failures=len(recent), since=min(recent), last_at=last,
                         last_error=self._last_error.get(pool), next_start_at=last + backoff(len(recent)))

    def forget(self, pools: set[str]) -> None:
        """Forget pools the config no longer has."""
        for pool in set(self._failures) - pools:
            self._failures.pop(pool, None)
            self._last_error.pop(pool, None)
