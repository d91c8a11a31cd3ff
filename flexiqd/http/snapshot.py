"""The immutable state the daemon publishes after each tick, for the HTTP endpoint to read.

Built on the daemon's loop from the controller's views (pure: everything is an
argument); never changed once built, so a request reads it without a lock while
the next tick runs.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Mapping

from ..daemon.documents import dependency_use, status_document
from ..queue.types import Stats
from .counters import Histogram, QueueTally

if TYPE_CHECKING:
    from ..config.model import DaemonConfig
    from ..daemon.controller import PoolView
    from ..daemon.overrides import Override


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


def dependency_figures(config: "DaemonConfig", views: Mapping[str, "PoolView"]) -> tuple[DependencyFigures, ...]:
    use = dependency_use(config, views)
    return tuple(DependencyFigures(name, dep.capacity, dep.reserved, use.get(name, 0.0))
                 for name, dep in sorted(config.dependencies.items()))


def build_snapshot(config: "DaemonConfig", config_path: str, config_error: str | None,
                   views: Mapping[str, "PoolView"], overrides: Mapping[str, "Override"], *,
                   counters: Mapping[str, QueueTally], scale_events: Mapping[tuple[str, str, str], int],
                   daemon: DaemonFigures, now: float) -> Snapshot:
    status = status_document(config, config_path, config_error, views, overrides, now)
    queue_stats: dict[str, Stats] = {}
    caps: dict[str, tuple[str, int]] = {}
    for name, view in views.items():
        for stats in view.stats or ():
            queue_stats[stats.queue] = stats
        cap = view.decision.binding_cap if view.decision is not None else None
        if cap is not None:
            caps[name] = (cap.cap, cap.workers)
    return Snapshot(taken_at=now, status=status, queue_stats=queue_stats, binding_caps=caps,
                    dependencies=dependency_figures(config, views), counters=counters,
                    scale_events=dict(scale_events), daemon=daemon,
                    target_ages={name: pool.policy.targets.age for name, pool in config.pools.items()})
