"""The oracle: the fewest workers, tick by tick, that keep every job within its age target.

It knows the future -- every arrival and every duration -- because it looks
ahead on a copy of the simulation: at each tick it tries worker counts on a
fork, runs the fork to the next tick, and keeps the smallest count with no
second of the oldest job over target.  Its workers start instantly (no cold
start, no boot cost) and drain without ever being killed, and it never goes
past the dependency's true ceiling, declared or not.  So its worker-seconds
are a lower bound for a policy that meets the target without hurting the
dependency -- approximately: the search is greedy, one tick at a time, so a
policy could in principle undercut it by a little.

When no count up to the ceiling meets the target (more work than the
ceiling allows), it runs at the ceiling: best effort, and its row shows the
seconds lost that no policy could have saved.
"""

from __future__ import annotations

import math

from .engine import FleetModel, Simulation, Snapshot
from .policies import BasePolicy
from .trace import Trace

_EPSILON = 1e-9


def dependency_ceiling(trace: Trace) -> int:
    """The most workers whose jobs fit in the dependency next to the request path."""
    dep = trace.dependency
    if dep is None:
        return trace.workers.max
    per_worker = dep.per_worker(trace.workers.concurrency)
    if per_worker == 0:
        return trace.workers.max
    fit = math.floor((dep.capacity - dep.request_load) / per_worker + _EPSILON)
    return max(trace.workers.min, min(trace.workers.max, fit))


class Oracle(BasePolicy):
    name = "oracle"

    def fleet(self, trace: Trace) -> FleetModel:
        return FleetModel("oracle", victims="idle_first", drain_timeout=None, instant_start=True)

    def start(self, trace: Trace, sim: Simulation) -> None:
        self.trace = trace
        self.sim = sim
        self.low = trace.workers.min
        self.high = dependency_ceiling(trace)
        self.horizon = trace.tick_interval

    def desired(self, snapshot: Snapshot) -> int:
        current = min(max(self.sim.current(), self.low), self.high)
        if self._meets(current):
            # Gallop down while fewer still meet the target, then settle between.
            step, good = 1, current
            while good > self.low:
                trial = max(self.low, good - step)
                if not self._meets(trial):
                    return self._smallest(trial + 1, good)
                good, step = trial, step * 2
            return good
        step, bad = 1, current
        while bad < self.high:
            trial = min(self.high, bad + step)
            if self._meets(trial):
                return self._smallest(bad + 1, trial)
            bad, step = trial, step * 2
        return self.high

    def _smallest(self, low: int, high: int) -> int:
        """The smallest count in [low, high] that meets the target; ``high`` is known to."""
        while low < high:
            middle = (low + high) // 2
            if self._meets(middle):
                high = middle
            else:
                low = middle + 1
        return high

    def _meets(self, workers: int) -> bool:
        """Whether ``workers`` until the next tick keep every job within target, now and later.

        Later: from the next tick on, even the ceiling's worth of workers
        must still be able to start every job already waiting by its deadline
        -- otherwise holding back now only moves the violation later.
        """
        twin = self.sim.fork()
        before = twin.slo_seconds
        twin.scale_to(workers)
        next_tick = min(self.sim.now + self.horizon, self.trace.duration)
        twin.run_until(next_tick)
        if twin.slo_seconds - before > _EPSILON:
            return False
        twin.scale_to(self.high)
        twin.run_until_started(next_tick, min(next_tick + self.trace.target_age, self.trace.duration))
        return twin.slo_seconds - before <= _EPSILON
