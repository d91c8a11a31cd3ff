"""What the last tick published for the API faces: one immutable snapshot, swapped whole.

The controller builds a ``Published`` at the end of every tick (and when a reload or an
operator's request changes what it shows) and replaces its ``published`` with it in one
reference assignment.  The daemon's faces -- D-Bus and HTTP through ``api_port.DaemonPort``,
STATUS= through ``status_line`` -- read only that, from whichever thread they run on, never
the controller's attributes, which the next tick changes as it goes.  Nothing in it is
changed after it is built: the views and events are the tick's own, the samples a copy.
"""

from __future__ import annotations

import dataclasses
import types
from typing import TYPE_CHECKING, Mapping

from ..config.model import DaemonConfig
from ..policy import Decision, PoolMetrics
from .crashloop import CrashLoop
from .events import ScaleEvent
from .samples import Samples
from .startcost import StartCost

if TYPE_CHECKING:
    from ..queue.types import DependencyStats, Stats
    from .overrides import Override


@dataclasses.dataclass(frozen=True)
class PoolView:
    """A pool as last seen: for STATUS=, flexiqctl status and the D-Bus API."""

    pool: str
    active: int
    starting: int
    draining: int
    failed: int
    max_workers: int
    decision: Decision | None
    stats: list | None               # each queue's Stats; None when the read failed
    metrics: PoolMetrics | None = None   # all its queues together, as the policy saw them
    start_cost: StartCost | None = None  # measured; None until a worker started for work claimed
    line: str | None = None              # the decision's one line, as logged
    stats_error: str | None = None       # why the stats could not be read (stats None)
    crash_loop: CrashLoop | None = None  # its workers keep failing (daemon.crashloop)
    app_problem: str | None = None       # why its workers could not run its app (flexiqd.apps), as last checked
    restart: dict | None = None          # its last restart (daemon.restarts.Restarts.document)
    evidence_notes: Mapping[str, str] = dataclasses.field(default_factory=dict)  # source -> why no reading


def frozen(mapping: Mapping) -> Mapping:
    """A read-only copy of ``mapping``."""
    return types.MappingProxyType(dict(mapping))


@dataclasses.dataclass(frozen=True)
class Published:
    """The daemon as of its last tick.  Immutable, so thread-safe to read."""

    config: DaemonConfig
    views: Mapping[str, PoolView]                      # pool -> as last seen (observed pools only)
    overrides: Mapping[str, "Override"]                # pool -> the operator's pin, drain or pause
    dependency_stats: Mapping[str, "DependencyStats"]  # each limited dependency (a failed read: absent)
    global_caps: Mapping[str, float]                   # the caps shared with the other hosts
    fleet_report: Mapping                              # this host's row for the others (fleet_share.host_report)
    events: tuple[ScaleEvent, ...]                     # the kept scale events, oldest first
    samples: Samples                                   # the last hour of every pool (a copy)
    store_problem: str | None = None                   # why the store takes no writes; None: it does
    fleet_problem: str | None = None                   # why the workers could not be listed; None: they could

    def events_since(self, seq: int = 0) -> list[ScaleEvent]:
        """Events with a sequence number above ``seq`` (0: all that are kept), oldest first."""
        return [event for event in self.events if event.seq > seq]

    def queue_stats(self) -> dict[str, "Stats"]:
        """Each served queue's stats as the tick read them (a queue whose read failed: absent)."""
        return {stats.queue: stats for view in self.views.values() for stats in view.stats or ()}

    def status_line(self) -> str:
        """``default 3/10 age 2.1s ttd 4s; images 1/4 age 0ms ttd 0ms`` for STATUS=."""
        from ..durations import format_duration

        parts = []
        for view in self.views.values():
            running = view.active + view.starting
            metrics = view.metrics
            if metrics is None:
                why = f" ({view.stats_error}), holding" if view.stats_error else ""
                parts.append(f"{view.pool} {running}/{view.max_workers} stats unavailable{why}")
                continue
            looping = f" APP-PROBLEM ({view.app_problem})" if view.app_problem else ""
            if view.crash_loop is not None:
                looping += (f" CRASH-LOOPING ({view.crash_loop.failures} workers failed: "
                           f"{view.crash_loop.last_error or 'unknown'})")
            restart = view.restart
            if restart is not None and restart["state"] in ("replacing", "finishing"):
                left = (restart["old_serving"] or 0) + (restart["old_draining"] or 0)
                looping += f" restarting ({left} old workers left)"
            parts.append(f"{view.pool} {running}/{view.max_workers}{looping} age "
                         f"{format_duration(metrics.oldest_runnable_age)} "
                         f"ttd {format_duration(metrics.time_to_drain)}")
        line = "; ".join(parts) or "no pools"
        if self.fleet_problem:
            line = f"holding every pool, workers cannot be listed: {self.fleet_problem}; {line}"
        return f"store takes no writes: {self.store_problem}; {line}" if self.store_problem else line
