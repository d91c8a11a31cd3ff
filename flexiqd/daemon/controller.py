"""One tick of the control loop: observe, decide, apply.  The only place that sequences I/O.

    observe: fleet.list -> recovery (dead workers' jobs, expired leases, failed and
             removed pools' workers) -> first claims -> queue stats -> one Observation per pool
             (``observe.Observer``)
    decide:  policy.decide_fleet (every pool, every policy, every cap) -> operators' overrides
             (``decide_and_steer``)
    apply:   fleet.start (retiring workers resumed first; no more new ones than the room that
             live workers -- stopping ones too -- leave: ``room.StartRoom``) / stop idle
             victims, pause busy ones (``retiring.Retiring``) -> stop retiring workers that
             became idle -> hold paused pools paused

systemd (or the process fleet) is asked every tick which workers exist; the
controller keeps the policies' histories, the pools' measured start costs and
the last decisions.  The histories and start costs are kept in a file too
(``HistoryFile``): a restart forgets no rate limit's budget.  Two collaborators
do the rest: ``operators.OperatorIntent`` holds the operators' pins, drains and
pauses (kept across restarts, published for workers), ``recovery.Recovery``
releases dead workers' jobs and sweeps the store.  A third, ``retiring.Retiring``,
remembers the busy workers a scale-in paused instead of stopping them, until
their jobs are done.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Iterable, Mapping

from ..config.model import DaemonConfig, PoolConfig
from ..errors import FleetError
from ..fleet.base import Fleet, WorkerInfo, WorkerState, instance_name
from ..logs import MessageId, journal
from ..policy import CapValue, Decision, History, Observation, decide_fleet, decision_line
from ..policy.types import KneeState
from ..queue.store.backend import Backend
from ..queue.types import DependencyStats
from ..schedules.forecast import Forecast
from .crashloop import WINDOW as CRASH_WINDOW, CrashLoops
from .events import EventLog
from .activity import Activity
from .evidence import EvidenceReader
from .samples import Samples
from .intent import HistoryFile, SamplesFile
from .observe import Observer, Seen
from .operators import OperatorIntent
from .published import PoolView, Published, frozen
from .overrides import is_stopping
from .recovery import Recovery
from .restarts import DONE, FAILED, REPLACING, Progress, Restarts, plan, policy_counts, surge
from .retiring import Retiring
from .room import StartRoom
from .startcost import StartCosts

log = logging.getLogger(__name__)

HISTORY_SAVE_INTERVAL = 30.0  # seconds between saves of the histories while nothing changes
SAMPLES_SAVE_INTERVAL = 60.0  # seconds between saves of the charts' samples


@dataclasses.dataclass(frozen=True)
class ControllerParts:
    """The collaborators a controller sequences and the files it keeps its state in, wired by
    ``daemon.compose.build_controller`` for the daemon and for ``flexiq autoscale`` alike."""

    host: str
    clock: Callable[[], float]
    activity: Activity
    observer: Observer
    retiring: Retiring
    operators: OperatorIntent
    restarts: Restarts
    start_costs: StartCosts
    crash_loops: CrashLoops
    events: EventLog
    history_file: HistoryFile
    samples_file: SamplesFile


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


class Controller:
    """Sizes every pool once per ``tick``.  Not thread-safe: one loop drives it."""

    def __init__(self, config: DaemonConfig, backend: Backend, fleet: Fleet, parts: ControllerParts) -> None:
        """Built by ``daemon.compose.build_controller``, which wires ``parts``.  Blocking: it loads
        the kept histories and brings the running workers up to ``config``."""
        self.config = config
        self.backend = backend
        self.fleet = fleet
        self.host = parts.host
        # The store's time (leases, run-ats and ages are in it), which no step of the wall clock moves.
        self.clock = parts.clock
        self._activity = parts.activity
        self.histories: dict[str, History] = {}
        self.start_costs = parts.start_costs
        self.crash_loops = parts.crash_loops
        # Per pool, what the last check of its app found wrong (set by the daemon after it
        # imported each app as the workers would, at start and on every reload).
        self.app_problems: dict[str, str] = {}
        self._backoff_said: dict[str, float] = {}  # pool -> the failure whose backoff was logged
        self.history_file = parts.history_file
        self._saved_at: float | None = None
        self.samples_file = parts.samples_file
        #: The last hour of every pool, for charts (recorded after each tick, kept across restarts).
        self.samples = Samples.from_document(self.samples_file.load(), config.pools)
        self._samples_saved_at: float | None = None
        self.views: dict[str, PoolView] = {}
        self.events = parts.events
        #: Pools whose growth waits, at the last tick, for stopping workers to exit: the loop
        #: decides again soon when no unit change will wake it (``waits_on_stopping``).
        self.waiting_for_stopping: set[str] = set()
        self._configure_pending = False  # a reload's Fleet.configure still to do (systemd was out of reach)
        self._binding_caps: dict[str, CapValue | None] = {}  # pool -> the cap that last bound its count
        #: This host's share of the global caps (daemon.hosts.HostHeartbeat.grants); None: the
        #: host is alone, and global caps are its own.
        self.fleet_grants: Callable[[float], dict[str, dict[str, int]] | None] | None = None
        self._fleet_report: dict = {"pools": {}}
        self.retiring = parts.retiring
        #: The tick's first step: the policy's input, read from systemd and the store.
        self.observer = parts.observer
        self.observer.listed = self._listed
        #: The pools' restarts (``flexiqctl restart``).
        self.restarts = parts.restarts
        self.operators = parts.operators
        histories, costs = self.history_file.load()
        self.histories = {name: h for name, h in histories.items() if name in config.pools}
        self.start_costs.load({name: c for name, c in costs.items() if name in config.pools})
        if self.histories:
            log.info("Keeping the decision history of pools %s from before the restart.",
                     ", ".join(sorted(self.histories)))
        self.activity = "configuring the workers"
        self.fleet.configure(p.worker_spec(config.store) for p in config.pools.values())
        self.activity = None
        #: What the API faces read (``published.Published``), replaced whole after each tick.
        self.published: Published
        self.publish()

    def reconfigure(self, config: DaemonConfig) -> None:
        """Use a new config from the next tick; pools that stay keep their history.

        Running workers get the new limits and stop timeout now (``Fleet.configure``).
        """
        self.config = config
        self.histories = {name: h for name, h in self.histories.items() if name in config.pools}
        self.samples.forget_others(config.pools)
        self._binding_caps = {name: c for name, c in self._binding_caps.items() if name in config.pools}
        self.start_costs.forget_pools(config.pools)
        self.observer.reconfigure(config)
        self.operators.reconfigure(config.pools)
        self.restarts.reconfigure(config.pools)
        self._configure_pending = True
        self._configure_workers()
        self.publish()

    def _configure_workers(self) -> None:
        """``Fleet.configure`` for the config in force; kept pending when systemd cannot be
        reached (the bus away): the next tick that lists the workers tries again."""
        self.activity = "configuring the running workers"
        try:
            self.fleet.configure(p.worker_spec(self.config.store) for p in self.config.pools.values())
        except FleetError as exc:
            log.warning("Could not bring the running workers up to the config in force (tried again at "
                        "the next tick that reaches systemd): %s", exc)
            return
        finally:
            self.activity = None
        self._configure_pending = False

    @property
    def activity(self) -> str | None:
        """What the tick is doing now (read by the daemon's loop to report a blocked tick)."""
        return self._activity.now

    @activity.setter
    def activity(self, what: str | None) -> None:
        self._activity(what)

    def _listed(self) -> None:
        """Systemd answered: a reload's ``Fleet.configure`` that could not reach it is done now."""
        if self._configure_pending:
            self._configure_workers()

    # What the observer found, and where it is told of the other hosts and the schedules: read
    # and set here by the daemon and by callers that hold only the controller.

    @property
    def recovery(self) -> Recovery:
        return self.observer.recovery

    @property
    def evidence(self) -> EvidenceReader:
        return self.observer.evidence

    @property
    def next_due(self) -> float | None:
        """When the first delayed job of any pool comes due (epoch seconds), as the last tick
        read it: the daemon decides again then.  None: none delayed, or not known."""
        return self.observer.next_due

    @property
    def store_problem(self) -> str | None:
        """Why the store takes no writes, as the last tick found its disk; None: it does."""
        return self.observer.store_problem

    @property
    def fleet_problem(self) -> str | None:
        """Why the last tick could not list the workers (every pool held); None: it could."""
        return self.observer.fleet_problem

    @property
    def dependency_stats(self) -> dict[str, DependencyStats]:
        """Each limited dependency as the store saw it at the last tick (a failed read: absent)."""
        return self.observer.dependency_stats

    @property
    def fleet_peers(self) -> Callable[[], Mapping[str, int]] | None:
        """Per pool, the other live hosts serving it (daemon.hosts.HostHeartbeat.peers)."""
        return self.observer.fleet_peers

    @fleet_peers.setter
    def fleet_peers(self, peers: Callable[[], Mapping[str, int]] | None) -> None:
        self.observer.fleet_peers = peers

    @property
    def schedule_forecasts(self) -> Callable[[Mapping[str, tuple[str, ...]], float], Mapping[str, Forecast]] | None:
        """Per pool, its schedules' next firing and its measured size (ScheduleFirer.forecasts)."""
        return self.observer.schedule_forecasts

    @schedule_forecasts.setter
    def schedule_forecasts(self, forecasts) -> None:
        self.observer.schedule_forecasts = forecasts

    # -- the tick ---------------------------------------------------------------------------

    def tick(self) -> dict[str, Decision]:
        """Observe, decide and apply once; the decisions, keyed by pool (none when the workers
        cannot be listed: every pool is then held).  Blocking: it waits on the store and the fleet."""
        try:
            decisions = self._tick()
            self.publish()
            return decisions
        finally:
            self.activity = None

    def _tick(self) -> dict[str, Decision]:
        now = self.clock()
        seen = self.observer.observe(now)
        if seen is None:
            return {}
        decisions = self.decide_and_steer(self._as_policy_sees(seen.observations), now, seen.stopping)
        self._apply(decisions, seen, now)
        self._record(decisions, seen, now)
        return decisions

    # -- decide -----------------------------------------------------------------------------

    def _as_policy_sees(self, observations: dict[str, Observation]) -> dict[str, Observation]:
        """The observations with each restarting pool seen at most at its target: the restart's
        replacements above it are not a count for the policy to scale in (daemon.restarts)."""
        seen = dict(observations)
        for name, obs in observations.items():
            request = self.restarts.active(name)
            if request is not None:
                active, starting = policy_counts(obs.active, obs.starting, request.target)
                seen[name] = dataclasses.replace(obs, active=active, starting=starting)
        return seen

    def decide_and_steer(self, observations: dict[str, Observation], now: float,
                         stopping: dict[str, int] | None = None) -> dict[str, Decision]:
        """What the fleet should do for every observed pool: the policy's decisions under the
        operators' overrides.  Keeps each pool's new history, so not idempotent: ``tick`` calls it
        once per tick, between observing and applying."""
        for name in self.operators.take_cleared_ceilings():
            if name in self.histories:
                self.histories[name] = dataclasses.replace(self.histories[name], knee=KneeState())
        return {name: self._steer(decision, now)
                for name, decision in self.decide(observations, now, stopping).items()}

    def decide(self, observations: dict[str, Observation], now: float,
               stopping: dict[str, int] | None = None) -> dict[str, Decision]:
        """The policy's decision for every observed pool (before operators' overrides).  Keeps nothing.

        ``stopping``: per pool, its draining workers that were asked to stop (not the retiring
        ones): they count against its caps until they exit."""
        grants = self._fleet_caps(observations, now) or {}
        stopping = stopping or {}
        inputs = [pool.decision_input(observations[name], self.histories.get(name), grants.get(name),
                                      min(stopping.get(name, 0), observations[name].draining))
                  for name, pool in self.config.pools.items() if name in observations]
        return decide_fleet(inputs, list(self.config.dependencies.values()), now)

    def _steer(self, decision: Decision, now: float) -> Decision:
        """The decision the fleet follows: the operator's, if one steers the pool; and the pool's
        next history."""
        name = decision.pool
        before = self.histories.get(name)
        steered = self.operators.steer(decision, before, now) or decision
        self.histories[name] = steered.history
        return steered

    # -- the fleet's global caps (see daemon.hosts) -----------------------------------------

    def global_caps(self) -> dict[str, float]:
        """The caps shared with the other hosts: global dependencies, ``max_workers:<pool>``."""
        config = self.config
        caps = {name: config.dependencies[name].available for name in config.global_dependencies
                if name in config.dependencies}
        caps.update({f"max_workers:{pool}": float(count) for pool, count in config.global_max_workers.items()})
        return caps

    def _global_uses(self, pool: PoolConfig) -> dict[str, list[float]]:
        uses = {use.dependency: [use.per_worker, use.weight] for use in pool.policy.dependencies
                if use.dependency in self.config.global_dependencies}
        if pool.name in self.config.global_max_workers:
            uses[f"max_workers:{pool.name}"] = [1.0, 1.0]
        return uses

    def _fleet_caps(self, observations: dict[str, Observation], now: float) -> dict[str, dict[str, int]] | None:
        """Each pool's grants of its global caps: its share as of the last beat; before the first
        beat it holds its count; with failing beats it gets none."""
        if self.fleet_grants is None:
            return None
        grants = self.fleet_grants(now)
        caps = {}
        for name, obs in observations.items():
            wanted = self._global_uses(self.config.pools[name])
            if not wanted:
                continue
            granted = {} if grants is None else grants.get(name, {})
            caps[name] = {cap: (0 if grants is None else granted.get(cap, obs.current)) for cap in wanted}
        return caps

    def _report(self, decisions: dict[str, Decision], seen: Seen) -> dict:
        """What this host publishes with its beat: per pool with global caps, its uncapped want
        (within its bounds), the workers it runs (draining ones too) and what one of them uses.

        The want is the policy's ``raw_desired``, which an operator's override leaves as it was."""
        pools = {}
        for name, decision in decisions.items():
            pool, obs = self.config.pools[name], seen.observations[name]
            uses = self._global_uses(pool)
            if not uses:
                continue
            wants = min(max(decision.raw_desired, obs.current, pool.policy.floor), pool.policy.max_workers)
            pools[name] = {"wants": wants, "current": obs.current + obs.draining, "uses": uses}
        # When the oldest worker became active: one from before this daemon may run older code
        # (one not active yet has no time, and is one this daemon is starting).
        since = min((worker.started_at for workers in seen.workers.values() for worker in workers
                     if worker.started_at is not None), default=None)
        return {"pools": pools, "workers_since": since}

    def fleet_report(self) -> dict:
        """The report of the last tick (thread-safe: replaced whole)."""
        return self._fleet_report

    # -- apply ------------------------------------------------------------------------------

    def _apply(self, decisions: dict[str, Decision], seen: Seen, now: float) -> None:
        """Resize every pool as decided, pool by pool (each pool's lines together in the log)."""
        alive = {name: len(workers) for name, workers in seen.workers.items()}
        room = StartRoom(self.config, alive, seen.stopping, self._fleet_caps(seen.observations, now))
        self.waiting_for_stopping = {name for name, decision in decisions.items()
                                     if decision.binding_cap is not None and is_stopping(decision.binding_cap)}
        for name, decision in decisions.items():
            self._note_binding_cap(decision, seen.observations[name])
            self._apply_pool(self.config.pools[name], decision, seen, now, room)

    @property
    def waits_on_stopping(self) -> bool:
        """Whether a pool's growth waited, at the last tick, for workers still stopping: they
        give their room back only as they exit, which the process fleet reports to no one."""
        return bool(self.waiting_for_stopping)

    def _apply_pool(self, pool: PoolConfig, decision: Decision, seen: Seen, now: float, room: StartRoom) -> None:
        workers = seen.workers.get(pool.name, [])
        self.activity = f"resizing pool {pool.name}"
        # An operator's drain empties the pool within the stop timeout, as a `systemctl stop` does:
        # busy workers too are stopped, not retired (a task that never ends must not hold it).
        drained = self.operators.drained(pool.name)
        try:
            self.retiring.adopt(pool.name, workers, self.operators.paused(pool.name))
        except FleetError as exc:
            log.warning("Pool %s: could not resume workers a previous daemon paused (retried next tick): %s",
                        pool.name, exc)
        if decision.changed:
            line = self._line(pool.name, decision, seen.observations[pool.name])
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
            self.activity = f"listing the workers of pool {pool.name} again for its restart"
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

    # -- record -----------------------------------------------------------------------------

    def _record(self, decisions: dict[str, Decision], seen: Seen, now: float) -> None:
        """What the tick leaves for readers between ticks: the views, the histories kept on disk,
        the report for the other hosts."""
        self.views = {name: self._view(name, decisions.get(name), seen, now) for name in self.config.pools
                      if name in seen.observations}
        self._save_histories(now, force=any(d.changed for d in decisions.values()))
        self.samples.record(self.views, now)
        self._save_samples(now)
        self._fleet_report = self._report(decisions, seen)

    def _view(self, name: str, decision: Decision | None, seen: Seen, now: float) -> PoolView:
        obs = seen.observations[name]
        return PoolView(pool=name, active=obs.active, starting=obs.starting, draining=obs.draining,
                        failed=seen.failed.get(name, 0), max_workers=self.config.pools[name].policy.max_workers,
                        decision=decision, stats=seen.stats[name], metrics=obs.metrics,
                        start_cost=self.start_costs.estimate(name), stats_error=seen.stats_errors.get(name),
                        line=self._line(name, decision, obs) if decision is not None else None,
                        crash_loop=self.crash_loops.loop(name, now), app_problem=self.app_problems.get(name),
                        restart=self.restarts.document(name),
                        evidence_notes=self.evidence.notes.get(name, {}))

    def _line(self, name: str, decision: Decision, obs: Observation) -> str:
        return decision_line(decision, obs, self.config.pools[name].policy_kind)

    def _save_histories(self, now: float, force: bool = False) -> None:
        if not force and self._saved_at is not None and now - self._saved_at < HISTORY_SAVE_INTERVAL:
            return
        self._saved_at = now
        self.activity = "keeping the pools' histories"
        self.history_file.save(self.histories, self.start_costs.to_dict(), now)

    def _save_samples(self, now: float, force: bool = False) -> None:
        if not force and self._samples_saved_at is not None and now - self._samples_saved_at < SAMPLES_SAVE_INTERVAL:
            return
        self._samples_saved_at = now
        self.activity = "keeping the pools' samples"
        self.samples_file.save(self.samples.to_document())

    def save_state(self) -> None:
        """Keep the histories and the samples now (the daemon is stopping)."""
        self._save_histories(self.clock(), force=True)
        self._save_samples(self.clock(), force=True)

    # -- between ticks ----------------------------------------------------------------------

    def release_dead_workers(self) -> dict[str, int] | None:
        """``Recovery.release_dead_workers`` on its own, between ticks (what a unit change wakes)."""
        try:
            return self.recovery.release_dead_workers(self.clock())
        finally:
            self.activity = None

    # Operators' requests are ``self.operators``'s; these keep working for callers that hold
    # only the controller.

    def pin(self, name: str, workers: int, seconds: float | None) -> None:
        self.operators.pin(name, workers, seconds)

    def unpin(self, name: str) -> None:
        self.operators.unpin(name)

    def drain(self, name: str) -> None:
        self.operators.drain(name)

    def pause(self, name: str) -> None:
        self.operators.pause(name)

    def resume(self, name: str) -> None:
        self.operators.resume(name)

    # -- reporting --------------------------------------------------------------------------

    def status_line(self) -> str:
        """``default 3/10 age 2.1s ttd 4s; images 1/4 age 0ms ttd 0ms`` for STATUS=, as last published."""
        return self.published.status_line()

    def publish(self) -> None:
        """Replace ``published`` with what the controller holds now: one reference assignment,
        so a reader on another thread sees the last snapshot or this one, never a mix."""
        self.published = Published(
            config=self.config, views=frozen(self.views), overrides=frozen(self.operators.overrides),
            dependency_stats=frozen(self.observer.dependency_stats), global_caps=frozen(self.global_caps()),
            events=tuple(self.events), samples=self.samples.copy(), store_problem=self.observer.store_problem,
            fleet_problem=self.observer.fleet_problem)


def _decision_fields(decision: Decision) -> dict:
    """The journal fields of a scale decision (``journalctl POOL=default MESSAGE_ID=...``)."""
    cap = decision.binding_cap
    return journal(MessageId.SCALE_DECISION, POOL=decision.pool, FROM=decision.current, TO=decision.desired,
                   REASON=decision.reason, SIGNAL=decision.winner, CAP=cap.cap if cap else None,
                   CAP_WORKERS=cap.workers if cap else None)



