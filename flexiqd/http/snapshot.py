"""The immutable state the HTTP endpoint publishes after each tick, for its requests to read.

Built on the daemon's loop from what the daemon's port gives (the Status document,
the queues' stats: pure, everything is an argument); never changed once built, so a
request reads it without a lock while the next tick runs.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from ..queue.types import Stats
from .counters import Histogram, QueueTally


@dataclasses.dataclass(frozen=True)
class DependencyFigures:
    """A declared dependency: its capacity, the part reserved for others, and what the pools'
    workers (running, starting or draining) hold of it, in its own unit."""

    name: str
    capacity: float
    reserved: float
    use: float


@dataclasses.dataclass(frozen=True)
class DaemonFigures:
    version: str
    ticks: int = 0
    last_tick_at: float | None = None
    tick_durations: Histogram | None = None
    last_stats_read_at: float | None = None     # every pool's stats read in one tick
    stats_read_failures: int = 0                # ticks in which a pool's stats could not be read
    config_generation: int = 1                  # +1 per applied reload
    last_reload_ok: bool = True


@dataclasses.dataclass(frozen=True)
class Snapshot:
    taken_at: float
    status: Mapping                              # the Status document (daemon/documents.py)
    queue_stats: Mapping[str, Stats]             # each served queue's last stats
    binding_caps: Mapping[str, tuple[str, int]]  # pool -> (cap, workers) when a cap binds
    dependencies: tuple[DependencyFigures, ...]
    counters: Mapping[str, QueueTally]
    scale_events: Mapping[tuple[str, str, str], int]   # (pool, up|down, reason) -> count
    daemon: DaemonFigures
    target_ages: Mapping[str, float] = dataclasses.field(default_factory=dict)  # pool -> targets.age

    def pool_queues(self, pool: str) -> tuple[str, ...] | None:
        document = self.status["pools"].get(pool)
        return tuple(document["queues"]) if document is not None else None

    def served_queues(self) -> list[str]:
        return sorted({q for pool in self.status["pools"].values() for q in pool["queues"]})


def dependency_figures(status: Mapping) -> tuple[DependencyFigures, ...]:
    """The declared dependencies (those with a capacity) of a Status document."""
    return tuple(DependencyFigures(entry["name"], entry["capacity"], entry["reserved"], entry["use"])
                 for entry in status.get("dependencies", ()) if entry["capacity"] is not None)


def build_snapshot(status: Mapping, queue_stats: Mapping[str, Stats], *, counters: Mapping[str, QueueTally],
                   scale_events: Mapping[tuple[str, str, str], int], daemon: DaemonFigures,
                   now: float) -> Snapshot:
    """A snapshot of what the daemon's port gave after a tick: its Status document and each
    served queue's last stats (a queue whose read failed has none)."""
    pools = status["pools"]
    caps = {name: (pool["binding_cap"], pool["binding_cap_workers"]) for name, pool in pools.items()
            if pool.get("binding_cap") is not None}
    return Snapshot(taken_at=now, status=status, queue_stats=dict(queue_stats), binding_caps=caps,
                    dependencies=dependency_figures(status), counters=counters,
                    scale_events=dict(scale_events), daemon=daemon,
                    target_ages={name: pool["target_age"] for name, pool in pools.items()})
