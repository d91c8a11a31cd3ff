"""The tick's third step: each pool resized as decided, through the fleet.

    per pool: resume workers a previous daemon paused -> log and record a change (one line
    ending with the reason) -> grow (retiring workers taken back first, then new units as
    the crash-loop backoff and the room allow: ``room.StartRoom``) or shrink (idle victims
    stopped, busy ones paused until their jobs are done: ``retiring.Retiring``) -> the
    restart's next step (daemon.restarts) -> stop retiring workers that became idle ->
    hold paused pools paused

A failed fleet call is logged and the rest of the tick goes on: the next tick, which lists
the workers again, retries from what systemd then reports.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Iterable

from ..config.model import DaemonConfig, PoolConfig
from ..errors import FleetError
from ..fleet.base import Fleet, WorkerInfo, WorkerState, instance_name
from ..logs import MessageId, journal
from ..policy import CapValue, Decision, Observation, decision_line
from .crashloop import WINDOW as CRASH_WINDOW, CrashLoops
from .events import EventLog
from .observe import Seen
from .operators import OperatorIntent
from .overrides import is_stopping
from .restarts import DONE, FAILED, REPLACING, Progress, Restarts, plan, surge
from .retiring import Retiring
from .room import StartRoom
from .startcost import StartCosts

# The control loop's logger, not this module's: these lines were always the controller's, and
# its name starts every line's text in the journal (logs.LINE_FORMAT) and is its LOGGER= field.
log = logging.getLogger("flexiqd.daemon.controller")


@dataclasses.dataclass(frozen=True)
class ResizerParts:
    """The collaborators the resizer shares with the rest of the tick."""

    retiring: Retiring
    operators: OperatorIntent
    restarts: Restarts
    crash_loops: CrashLoops
    start_costs: StartCosts
    events: EventLog


def choose_victims(workers: Iterable[WorkerInfo], count: int, busy: dict[str, int],
                   old: Callable[[WorkerInfo], bool] = lambda worker: False) -> list[WorkerInfo]:
    """Whom to stop: workers still starting, then the ``old`` ones a restart replaces, then idle
    ones, then the newest.  (A starting worker is no capacity yet: stopping it costs none.)"""
    def order(worker: WorkerInfo) -> tuple:
        return (worker.state is not WorkerState.STARTING, not old(worker), busy.get(worker.instance, 0) > 0,
                -(worker.started_at or float("inf")), -worker.index)
    return sorted(workers, key=order)[:max(0, count)]


def free_indices(taken: set[int], count: int) -> list[int]:
    """The ``count`` smallest worker numbers (from 1) not in use: instance names get reused."""
    found, candidate = [], 1
    while len(found) < count:
        if candidate not in taken:
            found.append(candidate)
        candidate += 1
    return found


def decision_line_for(config: DaemonConfig, decision: Decision, obs: Observation) -> str:
    """The decision's one line, as logged and shown in the status."""
    return decision_line(decision, obs, config.pools[decision.pool].policy_kind)


class Resizer:
    """Applies the tick's decisions to the fleet.  Not thread-safe: the control loop drives it.

    ``doing(what)`` is told what it is about to wait for (the controller's ``activity``).
    """

    def __init__(self, config: DaemonConfig, fleet: Fleet, parts: ResizerParts, *,
                 doing: Callable[[str], None]) -> None:
        self.config = config
        self.fleet = fleet
        self.retiring = parts.retiring
        self.operators = parts.operators
        self.restarts = parts.restarts
        self.crash_loops = parts.crash_loops
        self.start_costs = parts.start_costs
        self.events = parts.events
        self._doing = doing
        self._backoff_said: dict[str, float] = {}  # pool -> the failure whose backoff was logged
        self._binding_caps: dict[str, CapValue | None] = {}  # pool -> the cap that last bound its count
        #: Pools whose growth waits, at the last tick, for stopping workers to exit: the loop
        #: decides again soon when no unit change will wake it (``Controller.waits_on_stopping``).
        self.waiting_for_stopping: set[str] = set()

    def reconfigure(self, config: DaemonConfig) -> None:
        """Use the reloaded config from the next tick; removed pools' caps are forgotten."""
        self.config = config
        self._binding_caps = {name: c for name, c in self._binding_caps.items() if name in config.pools}

    def apply(self, decisions: dict[str, Decision], seen: Seen, now: float, room: StartRoom) -> None:
        """Resize every pool as decided, pool by pool (each pool's lines together in the log)."""
        self.waiting_for_stopping = {name for name, decision in decisions.items()
                                     if decision.binding_cap is not None and is_stopping(decision.binding_cap)}
        for name, decision in decisions.items():
            self._note_binding_cap(decision, seen.observations[name])
            self._apply_pool(self.config.pools[name], decision, seen, now, room)

    def _apply_pool(self, pool: PoolConfig, decision: Decision, seen: Seen, now: float, room: StartRoom) -> None:
        workers = seen.workers.get(pool.name, [])
        self._doing(f"resizing pool {pool.name}")
        # An operator's drain empties the pool within the stop timeout, as a `systemctl stop` does:
        # busy workers too are stopped, not retired (a task that never ends must not hold it).
        drained = self.operators.drained(pool.name)
        try:
            self.retiring.adopt(pool.name, workers, self.operators.paused(pool.name))
        except FleetError as exc:
            log.warning("Pool %s: could not resume workers a previous daemon paused (retried next tick): %s",
                        pool.name, exc)
        if decision.changed:
            line = decision_line_for(self.config, decision, seen.observations[pool.name])
            log.info("%s", line, extra=_decision_fields(decision))
            self.events.record(now, pool.name, decision.current, decision.desired, decision.reason, line)
            try:
                if decision.desired > decision.current:
                    self._grow(pool, workers, decision.desired - decision.current, seen, now, room)
                else:
                    self._shrink(workers, decision.current - decision.desired, seen.busy, retire=not drained,
                                 old=self._old_for(pool.name))
            except FleetError as exc:
                log.error("Pool %s: could not apply %d -> %d: %s", pool.name, decision.current,
                          decision.desired, exc)
        try:
            self._restart_step(pool, decision, seen, now, room)
        except FleetError as exc:
            log.error("Pool %s: could not take the restart's next step (retried next tick): %s", pool.name, exc)
        try:
            # After the resize: a worker taken back this tick is not stopped.
            if drained:
                self.retiring.stop_all(workers, "the pool is drained by an operator")
            else:
                self.retiring.settle(workers, seen.busy)
        except FleetError as exc:
            log.error("Pool %s: could not stop its retired workers (retried next tick): %s", pool.name, exc)
        self.operators.hold_pause(pool.name, workers)

    def _grow(self, pool: PoolConfig, workers: list[WorkerInfo], count: int, seen: Seen, now: float,
              room: StartRoom) -> None:
        """Take retiring workers back first (they are ready now, and no job waits on a start),
        then start new units for the rest -- as many as the live workers leave room for (a
        stopping worker counts until it has exited); the others at the next ticks."""
        # An old worker a restart replaces is not taken back: it runs the previous code.
        old = self._old_for(pool.name)
        count -= self.retiring.take_back([w for w in workers if not old(w)], count, seen.busy)
        if count <= 0:
            return
        self._start(pool, workers, count, seen, now, room)

    def _start(self, pool: PoolConfig, workers: list[WorkerInfo], count: int, seen: Seen, now: float,
               room: StartRoom, *, say_held: bool = True) -> str | None:
        """Start up to ``count`` new units, as the crash-loop backoff and the room allow; what held
        any back, in words (None: nothing).  ``say_held`` False: the caller logs that itself."""
        loop = self.crash_loops.loop(pool.name, now)
        if loop is not None and now < loop.next_start_at:
            if say_held and self._backoff_said.get(pool.name) != loop.last_at:  # once per failure, not per tick
                self._backoff_said[pool.name] = loop.last_at
                log.info("Pool %s: no new worker for %.0fs: %d workers failed within %.0fs, the last %s.",
                         pool.name, loop.next_start_at - now, loop.failures, CRASH_WINDOW,
                         loop.last_error or "ended in a way systemd did not record")
            return "its workers keep failing: new starts back off"
        allowed = room.allow(pool.name, count)
        held = None
        if allowed.held:
            if say_held:
                log.info("%s", allowed.sentence(pool.name))
            held = f"no room for a new worker: {allowed.limit}"
            if allowed.stopping:
                self.waiting_for_stopping.add(pool.name)
        count = allowed.allowed
        if count <= 0:
            return held
        room.started(pool.name, count)
        indices = free_indices({w.index for w in workers}, count)
        self.fleet.start(pool.worker_spec(self.config.store), indices)
        metrics = seen.observations[pool.name].metrics
        if metrics is not None and metrics.runnable_depth > 0:
            self.start_costs.started(pool.name, [instance_name(pool.name, i) for i in indices], now)
        return held

    def _old_for(self, pool: str) -> Callable[[WorkerInfo], bool]:
        """Which of the pool's workers its restart in progress replaces (none without one)."""
        request = self.restarts.active(pool)
        if request is None:
            return lambda worker: False
        return lambda worker: self.restarts.old(request, worker)

    def _restart_step(self, pool: PoolConfig, decision: Decision, seen: Seen, now: float, room: StartRoom) -> None:
        """The pool's restart, one step (daemon.restarts): replacements started first, old workers
        drained once the ready ones cover the target; failed when the replacements keep failing."""
        request = self.restarts.active(pool.name)
        if request is None:
            return
        workers = seen.workers.get(pool.name, [])
        if decision.changed:
            # The resize changed what the tick observed (a scale-in's victims serve no more, the
            # starts are new workers): the step counts the pool's workers as they are now.
            self._doing(f"listing the workers of pool {pool.name} again for its restart")
            workers = [w for w in self.fleet.list() if w.pool == pool.name and w.state is not WorkerState.FAILED]
        target = decision.desired
        self.restarts.update(pool.name, target=target)
        seen_now = self.restarts.census(request, workers, self.retiring)
        loop = self.crash_loops.loop(pool.name, now)
        if loop is not None and loop.last_at >= request.requested_at:
            error = (f"replacement workers keep failing ({loop.failures} within {CRASH_WINDOW:.0f}s, the last "
                     f"{loop.last_error or 'ended in a way systemd did not record'})")
            log.error("Pool %s: restart failed: %s; the %d old workers left keep running.", pool.name, error,
                      seen_now.old_ready + seen_now.old_starting,
                      extra=journal(MessageId.POOL_RESTART, POOL=pool.name, STATE=FAILED,
                                    LAST_ERROR=loop.last_error))
            self.restarts.progress[pool.name] = Progress(seen_now, surge(target))
            self.restarts.update(pool.name, state=FAILED, error=error)
            return
        step = plan(seen_now, target)
        waiting = None
        old = self._old_for(pool.name)
        if step.stop_starting:
            self.fleet.stop([w for w in workers if w.state is WorkerState.STARTING and old(w)])
        if step.stop_ready:
            ready_old = [w for w in workers if w.state is WorkerState.ACTIVE and old(w) and w not in self.retiring]
            log.info("Pool %s: restart: %d new workers ready, draining %d old ones.", pool.name,
                     seen_now.new_ready, step.stop_ready)
            self._shrink(ready_old, step.stop_ready, seen.busy)
        if step.start:
            held = self._start(pool, workers, step.start, seen, now, room, say_held=False)
            waiting = f"held: {held}" if held else None
            before = self.restarts.progress.get(pool.name)
            if held and (before is None or before.waiting != waiting):  # once, not every tick it holds
                log.info("Pool %s: the restart's next step is %s.", pool.name, waiting)
        elif step.phase == REPLACING and seen_now.new_starting:
            waiting = f"waiting for {seen_now.new_starting} new workers to become ready"
        self.restarts.progress[pool.name] = Progress(seen_now, surge(target), waiting)
        if step.phase != request.state:
            if step.phase == DONE:
                log.info("Pool %s: restart done: every worker was started after it was requested.", pool.name,
                         extra=journal(MessageId.POOL_RESTART, POOL=pool.name, STATE=DONE))
            self.restarts.update(pool.name, state=step.phase)

    def _shrink(self, workers: list[WorkerInfo], count: int, busy: dict[str, int] | None, *,
                retire: bool = True, old: Callable[[WorkerInfo], bool] = lambda worker: False) -> None:
        """Stop the victims that run nothing (starting or idle) now; pause the busy ones to retire
        once their jobs are done, so no job outlives a stop timeout.  Without a lease count
        (``busy`` None) every ready victim is treated as busy.  ``retire`` False: stop them all
        (each drains within its stop timeout)."""
        candidates = [w for w in workers if w.state in (WorkerState.ACTIVE, WorkerState.STARTING)
                      and w not in self.retiring]
        victims = choose_victims(candidates, count, busy or {}, old)
        # A worker with no pid cannot be told to pause: it is stopped as before.
        now_idle = [w for w in victims if not retire or w.state is WorkerState.STARTING or not w.pid
                    or (busy is not None and busy.get(w.instance, 0) == 0)]
        if now_idle:
            self.fleet.stop(now_idle)
        self.retiring.retire([w for w in victims if w not in now_idle], busy)

    def _note_binding_cap(self, decision: Decision, obs: Observation) -> None:
        """Log when another cap (or none) starts to bound the pool's count."""
        if obs.metrics is None:
            return  # a hold for want of stats says nothing about the caps
        name, binding = decision.pool, decision.binding_cap
        if name in self._binding_caps and self._binding_caps[name] == binding:
            return
        before = self._binding_caps.get(name)
        self._binding_caps[name] = binding
        if binding is None and before is None:
            return  # the pool's first decision, uncapped: nothing changed
        fields = journal(MessageId.BINDING_CAP_CHANGED, POOL=name, CAP=binding.cap if binding else "none",
                         CAP_WORKERS=binding.workers if binding else None,
                         PREVIOUS_CAP=before.cap if before else "none", REASON=decision.reason)
        if binding is None:
            log.info("Pool %s: no cap bounds its count any more (was %s=%d).", name, before.cap, before.workers,
                     extra=fields)
        else:
            log.info("Pool %s: bounded by cap %s=%d (wanted %d).", name, binding.cap, binding.workers,
                     decision.raw_desired, extra=fields)


def _decision_fields(decision: Decision) -> dict:
    """The journal fields of a scale decision (``journalctl POOL=default MESSAGE_ID=...``)."""
    cap = decision.binding_cap
    return journal(MessageId.SCALE_DECISION, POOL=decision.pool, FROM=decision.current, TO=decision.desired,
                   REASON=decision.reason, SIGNAL=decision.winner, CAP=cap.cap if cap else None,
                   CAP_WORKERS=cap.workers if cap else None)
