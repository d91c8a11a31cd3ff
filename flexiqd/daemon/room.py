"""Room to start workers: a worker counts against max_workers and every dependency cap until
its process has exited.

A stopped worker (a unit still ``deactivating``, a child process still draining) holds its
connections until it is gone; so does a retiring one (paused, not stopped yet).  The policies'
caps count them (``policy.fleet``: caps ``stopping``), but a count can also come from an
operator's pin, a pool's floor or a pool held for want of metrics, so the rule is kept where
workers are started, whatever decided the count.  A pool starts no more workers than

- its ``max_workers`` less every live worker of it (running, starting, retiring, stopping);
- for each global cap, when hosts share them: this host's grant less the same;
- for each dependency it uses (its capacity this host's): what the available capacity leaves
  after every live worker of its users, and every start made before this one in the tick,
  holds what one of them uses -- over what one of this pool's workers uses.

The rest wait for the next ticks, as the stopping workers exit.  Pure: counts in, counts out.
One per tick; not thread-safe.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from ..config.model import DaemonConfig

_EPSILON = 1e-9


@dataclasses.dataclass(frozen=True)
class Room:
    """Of the ``wanted`` starts of a pool, the ``allowed`` ones; ``limit``: what bounds them (None:
    nothing did); ``stopping``: the workers still stopping that count against it."""

    wanted: int
    allowed: int
    limit: str | None = None
    stopping: int = 0

    @property
    def held(self) -> bool:
        return self.allowed < self.wanted

    def sentence(self, pool: str) -> str:
        """``Pool p: 7 workers still stopping: starting 0 of 7 now, the rest as they exit (...)``."""
        if self.stopping:
            return (f"Pool {pool}: {self.stopping} workers still stopping: starting {self.allowed} of "
                    f"{self.wanted} now, the rest as they exit ({self.limit} counts them until they have).")
        return f"Pool {pool}: starting {self.allowed} of {self.wanted} now: {self.limit} leaves no room for more."


class StartRoom:
    """The room every pool has to start workers this tick.

    ``alive``: per pool, its workers whose processes have not exited (every state but
    failed); ``stopping``: those of them asked to stop; ``grants``: per pool, this host's
    grant of each global cap it uses (None: the host is alone, its global caps its own).
    """

    def __init__(self, config: DaemonConfig, alive: Mapping[str, int], stopping: Mapping[str, int],
                 grants: Mapping[str, Mapping[str, int]] | None) -> None:
        self._config = config
        self._alive = dict(alive)
        self._stopping = dict(stopping)
        self._grants = grants
        self._free = {name: dep.available - self._held(name) for name, dep in config.dependencies.items()
                      if grants is None or name not in config.global_dependencies}

    def _users(self, dependency: str):
        for pool in self._config.pools.values():
            for use in pool.policy.dependencies:
                if use.dependency == dependency:
                    yield pool.name, use

    def _held(self, dependency: str) -> float:
        return sum(self._alive.get(name, 0) * use.per_worker for name, use in self._users(dependency))

    def allow(self, pool: str, wanted: int) -> Room:
        """How many of ``wanted`` new workers ``pool`` may start now, and what bounds them."""
        policy = self._config.pools[pool].policy
        alive, stopping = self._alive.get(pool, 0), self._stopping.get(pool, 0)
        limits = [(policy.max_workers - alive, f"max_workers={policy.max_workers}", stopping)]
        for cap, granted in sorted(((self._grants or {}).get(pool) or {}).items()):
            limits.append((granted - alive, f"this host's grant of {cap} ({granted} workers)", stopping))
        for use in policy.dependencies:
            if use.dependency in self._free:
                free = max(0.0, self._free[use.dependency])
                users_stopping = sum(self._stopping.get(name, 0) for name, _ in self._users(use.dependency))
                limits.append((math.floor(free / use.per_worker + _EPSILON),
                               f"dependency {use.dependency}", users_stopping))
        room, limit, count = min(limits, key=lambda entry: entry[0])
        if room >= wanted:
            return Room(wanted, wanted)
        return Room(wanted, max(0, room), limit, count)

    def started(self, pool: str, count: int) -> None:
        """``pool`` started ``count`` workers: they are alive and hold their share from now."""
        self._alive[pool] = self._alive.get(pool, 0) + count
        for use in self._config.pools[pool].policy.dependencies:
            if use.dependency in self._free:
                self._free[use.dependency] -= count * use.per_worker
