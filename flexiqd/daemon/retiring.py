"""Workers leaving a pool by scale-in while they still run jobs.

A scale-in stops idle workers (and those still starting) at once.  A busy one is
not stopped: a stop is bounded by the unit's stop timeout, and a job longer than
that would be interrupted and handed back to run again.  ``Retiring`` pauses it
instead (it claims nothing new and hands back what it had claimed ahead), and
stops it on the first tick its lease count is zero, when the stop costs nothing.
Until then it is no capacity: the pool's observation counts it as draining, and
a scale-up takes it back (resumes it) before starting a new unit.

Which workers are retiring is kept in memory only.  A daemon that restarts
forgets it; a worker it had paused would then look like capacity while claiming
nothing, forever.  So ``adopt`` resumes, once per pool after the start, every ready
worker of a pool no operator paused: the policy sees them as what they are again,
and a scale-in it still wants pauses the busy ones anew.

Not thread-safe: the controller's loop drives it.
"""

from __future__ import annotations

import logging
from typing import Iterable

from ..fleet.base import Fleet, WorkerInfo, WorkerState

# The control loop's logger: these lines are the tick's, like the operators' and recovery's.
log = logging.getLogger("flexiqd.daemon.controller")


class Retiring:
    """The busy workers chosen for scale-in: paused, stopped once idle, resumed on a scale-up."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._pids: dict[str, int | None] = {}   # instance -> the pid that was paused
        self._adopted: set[str] = set()          # pools whose workers were resumed after the start

    def __contains__(self, worker: WorkerInfo) -> bool:
        """Whether ``worker`` (this process of it) is retiring."""
        return worker.instance in self._pids and self._pids[worker.instance] == worker.pid

    def instances(self) -> set[str]:
        return set(self._pids)

    def of(self, workers: Iterable[WorkerInfo]) -> list[WorkerInfo]:
        """Those of ``workers`` that are retiring."""
        return [w for w in workers if w in self]

    def forget_gone(self, workers: Iterable[WorkerInfo]) -> None:
        """Forget retiring workers that are no longer ready: stopped by someone else, failed,
        gone, or restarted by systemd (a new process is not paused)."""
        ready = {w.instance: w.pid for w in workers if w.state is WorkerState.ACTIVE}
        for instance in [i for i, pid in self._pids.items() if ready.get(i, -1) != pid]:
            del self._pids[instance]

    def adopt(self, pool: str, workers: list[WorkerInfo], operator_paused: bool) -> None:
        """Once per pool after the daemon started: resume ready workers that a previous daemon
        may have paused to retire (see the module docstring).  A pool an operator paused stays
        paused, and is adopted once it is not.  Raises ``FleetError`` (retried next tick)."""
        if pool in self._adopted or operator_paused:
            return
        self.fleet.set_paused([w for w in workers if w not in self], False)
        self._adopted.add(pool)

    def retire(self, workers: list[WorkerInfo], busy: dict[str, int] | None) -> None:
        """Pause these busy victims of a scale-in; they are stopped once idle (``settle``)."""
        for worker in workers:
            # One at a time: a worker is remembered only once it was told, so a failure leaves
            # no worker counted as retiring that still claims.
            self.fleet.set_paused([worker], True)
            self._pids[worker.instance] = worker.pid
            running = "an unknown number of" if busy is None else str(busy.get(worker.instance, 0))
            log.info("Worker %s paused to retire: it claims nothing new and is stopped once its %s "
                     "running jobs are done.", worker.instance, running)

    def take_back(self, workers: list[WorkerInfo], count: int, busy: dict[str, int] | None) -> int:
        """Resume up to ``count`` retiring workers of ``workers``, busiest first (an idle one would
        be stopped anyway); how many were resumed."""
        back = sorted(self.of(workers), key=lambda w: -(busy or {}).get(w.instance, 0))[:max(0, count)]
        if not back:
            return 0
        self.fleet.set_paused(back, False)
        for worker in back:
            del self._pids[worker.instance]
            log.info("Worker %s taken back from retiring: it claims again.", worker.instance)
        return len(back)

    def stop_all(self, workers: list[WorkerInfo], why: str) -> None:
        """Stop the retiring workers of ``workers`` now, busy or not (each drains within its stop
        timeout).  Raises ``FleetError``."""
        retiring = self.of(workers)
        if not retiring:
            return
        self.fleet.stop(retiring)
        for worker in retiring:
            del self._pids[worker.instance]
            log.info("Worker %s stopped while retiring: %s.", worker.instance, why)

    def settle(self, workers: list[WorkerInfo], busy: dict[str, int] | None) -> None:
        """Stop the retiring workers of ``workers`` that run no job.  With no lease count
        (``busy`` None: the read failed) none is stopped.  Raises ``FleetError``."""
        if busy is None:
            return
        idle = [w for w in self.of(workers) if busy.get(w.instance, 0) == 0]
        if not idle:
            return
        self.fleet.stop(idle)
        for worker in idle:
            del self._pids[worker.instance]
            log.info("Worker %s retired: its jobs are done, stopping it.", worker.instance)
