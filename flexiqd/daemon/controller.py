"""One tick of the control loop: observe, decide, apply, record.  The only place that sequences I/O.

    observe: fleet.list -> recovery -> first claims -> queue stats -> one Observation per
             pool (``observe.Observer``)
    decide:  policy.decide_fleet (every pool, every policy, every cap; the shares of the caps
             shared with other hosts: ``fleet_share``) -> operators' overrides (``decide_and_steer``)
    apply:   the room the live workers leave (``room.StartRoom``) -> every pool resized
             (``apply.Resizer``: starts, stops, retiring busy workers, restarts' steps)
    record:  the pools' views, the histories and samples kept on disk, this host's report for
             the others -> one immutable snapshot for the API faces (``published.Published``)

systemd (or the process fleet) is asked every tick which workers exist; the
controller keeps the policies' histories, the pools' measured start costs and
the last decisions.  The histories and start costs are kept in a file too
(``HistoryFile``): a restart forgets no rate limit's budget.  ``operators.OperatorIntent``
holds the operators' pins, drains and pauses (kept across restarts, published for
workers).  ``daemon.compose.build_controller`` wires the parts.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Mapping

from ..config.model import DaemonConfig
from ..errors import FleetError
from ..fleet.base import Fleet
from ..policy import Decision, History, Observation, decide_fleet
from ..policy.types import KneeState
from ..queue.store.backend import Backend
from ..queue.types import DependencyStats
from ..schedules.forecast import Forecast
from .activity import Activity
from .apply import Resizer, choose_victims, decision_line_for, free_indices
from .crashloop import CrashLoops
from .events import EventLog
from .evidence import EvidenceReader
from .fleet_share import global_caps, granted, host_report
from .intent import HistoryFile, SamplesFile
from .observe import Observer, Seen
from .operators import OperatorIntent
from .published import PoolView, Published, frozen
from .recovery import Recovery
from .restarts import Restarts, policy_counts
from .retiring import Retiring
from .room import StartRoom
from .samples import Samples
from .startcost import StartCosts

# Kept importable from here: the victims' order and the instance numbers are the controller's
# rules as tests and readers know them.
__all__ = ["Controller", "ControllerParts", "PoolView", "choose_victims", "free_indices"]

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
    resizer: Resizer
    start_costs: StartCosts
    crash_loops: CrashLoops
    events: EventLog
    history_file: HistoryFile
    samples_file: SamplesFile


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
        self.history_file = parts.history_file
        self._saved_at: float | None = None
        self.samples_file = parts.samples_file
        #: The last hour of every pool, for charts (recorded after each tick, kept across restarts).
        self.samples = Samples.from_document(self.samples_file.load(), config.pools)
        self._samples_saved_at: float | None = None
        self.views: dict[str, PoolView] = {}
        self.events = parts.events
        self._configure_pending = False  # a reload's Fleet.configure still to do (systemd was out of reach)
        #: This host's share of the global caps (daemon.hosts.HostHeartbeat.grants); None: the
        #: host is alone, and global caps are its own.
        self.fleet_grants: Callable[[float], dict[str, dict[str, int]] | None] | None = None
        self._fleet_report: dict = {"pools": {}}
        self.retiring = parts.retiring
        #: The tick's first step: the policy's input, read from systemd and the store.
        self.observer = parts.observer
        self.observer.listed = self._listed
        #: The tick's third step: the pools resized through the fleet.
        self.resizer = parts.resizer
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
        self.start_costs.forget_pools(config.pools)
        self.observer.reconfigure(config)
        self.resizer.reconfigure(config)
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
    def restarts(self) -> Restarts:
        """The pools' restarts (``flexiqctl restart``), followed by the resizer."""
        return self.resizer.restarts

    @restarts.setter
    def restarts(self, restarts: Restarts) -> None:
        self.resizer.restarts = restarts

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
        """Observe, decide, apply and record once, then publish; the decisions, keyed by pool (none
        when the workers cannot be listed: every pool is then held).  Blocking: it waits on the
        store and the fleet."""
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

    def close(self) -> None:
        """End the threads the controller's parts run (the dependencies' probes)."""
        self.observer.close()

    # -- the fleet's global caps (see daemon.hosts) -----------------------------------------

    def global_caps(self) -> dict[str, float]:
        """The caps shared with the other hosts (``fleet_share.global_caps``); the heartbeat's
        thread reads them as published."""
        return global_caps(self.config)

    def _fleet_caps(self, observations: dict[str, Observation], now: float) -> dict[str, dict[str, int]] | None:
        """Each pool's grants of its global caps (``fleet_share.granted``); None: the host is alone."""
        if self.fleet_grants is None:
            return None
        return granted(self.config, observations, self.fleet_grants(now))

    # -- apply ------------------------------------------------------------------------------

    def _apply(self, decisions: dict[str, Decision], seen: Seen, now: float) -> None:
        """The room every pool's starts share, then each pool resized (``apply.Resizer``)."""
        alive = {name: len(workers) for name, workers in seen.workers.items()}
        room = StartRoom(self.config, alive, seen.stopping, self._fleet_caps(seen.observations, now))
        self.resizer.apply(decisions, seen, now, room)

    @property
    def waits_on_stopping(self) -> bool:
        """Whether a pool's growth waited, at the last tick, for workers still stopping: they
        give their room back only as they exit, which the process fleet reports to no one."""
        return bool(self.resizer.waiting_for_stopping)

    # -- record -----------------------------------------------------------------------------

    def _record(self, decisions: dict[str, Decision], seen: Seen, now: float) -> None:
        """What the tick leaves for readers between ticks: the views, the histories kept on disk,
        the report for the other hosts."""
        self.views = {name: self._view(name, decisions.get(name), seen, now) for name in self.config.pools
                      if name in seen.observations}
        self._save_histories(now, force=any(d.changed for d in decisions.values()))
        self.samples.record(self.views, now)
        self._save_samples(now)
        self._fleet_report = host_report(self.config, decisions, seen.observations, seen.workers)

    def _view(self, name: str, decision: Decision | None, seen: Seen, now: float) -> PoolView:
        obs = seen.observations[name]
        return PoolView(pool=name, active=obs.active, starting=obs.starting, draining=obs.draining,
                        failed=seen.failed.get(name, 0), max_workers=self.config.pools[name].policy.max_workers,
                        decision=decision, stats=seen.stats[name], metrics=obs.metrics,
                        start_cost=self.start_costs.estimate(name), stats_error=seen.stats_errors.get(name),
                        line=decision_line_for(self.config, decision, obs) if decision is not None else None,
                        crash_loop=self.crash_loops.loop(name, now), app_problem=self.app_problems.get(name),
                        restart=self.restarts.document(name),
                        evidence_notes=self.evidence.notes.get(name, {}))

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
            fleet_report=frozen(self._fleet_report),
            events=tuple(self.events), samples=self.samples.copy(), store_problem=self.observer.store_problem,
            fleet_problem=self.observer.fleet_problem)




