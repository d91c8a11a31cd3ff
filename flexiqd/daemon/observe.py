"""The tick's first step: every pool as the policy will see it, read from systemd and the store.

    fleet.list -> (a reload's pending configure) -> the store's disk -> recovery (dead
    workers' jobs, expired leases, failed and removed pools' workers) -> failures toward
    crash loops -> first claims (start costs) -> dependency figures -> schedules' forecasts
    -> per pool: queue stats, metrics, direct evidence -> one ``Observation`` per pool

``Observer.observe`` returns them in a ``Seen`` with what the apply and record steps need
(the workers per pool, their running jobs, the stats), or None when the workers cannot be
listed.  What it found between ticks -- the store's and the fleet's problems, the
dependencies' figures, when the next delayed job comes due -- stays readable on it.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from typing import Callable, Mapping

import psutil

from ..config.model import DaemonConfig, PoolConfig
from ..errors import FleetError, QueueError, StoreDamaged
from ..fleet.base import Fleet, WorkerInfo, WorkerState
from ..logs import MessageId, journal
from ..policy import Observation, PoolMetrics
from ..policy.economics import lead_time, start_cost_or_default
from ..policy.types import DependencyObservation
from ..queue.store.backend import Backend
from ..queue.sqlite.disk import disk_problem, same_problem
from ..queue.types import DependencyStats
from ..queue.url import sqlite_path
from ..schedules.forecast import Forecast, jobs_coming_due
from .crashloop import WINDOW as CRASH_WINDOW, CrashLoops
from .evidence import EvidenceReader
from .recovery import Recovery
from .retiring import Retiring
from .startcost import StartCosts

# The control loop's logger, not this module's: these lines were always the controller's, and
# its name starts every line's text in the journal (logs.LINE_FORMAT) and is its LOGGER= field.
log = logging.getLogger("flexiqd.daemon.controller")

# How often the daemon writes a probe file beside a SQLite store: a file system that turned
# read-only after an error says so only to a write (queue.sqlite.disk).
DISK_PROBE_INTERVAL = 5.0
# While the workers cannot be listed, the journal says so when it starts, when the reason
# changes, and then this often (seconds), not every tick.
FLEET_PROBLEM_REPEAT = 30.0
FORECAST_EVERY = 10.0  # seconds between reads of the schedules' forecasts (ledger, jobs, arrivals)


@dataclasses.dataclass(frozen=True)
class Seen:
    """What one tick observed: the policy's view of every pool, and what applying needs."""

    observations: dict[str, Observation]
    workers: dict[str, list[WorkerInfo]]
    busy: dict[str, int] | None   # running jobs per instance; None: the lease read failed
    failed: collections.Counter
    stats: dict[str, list | None]
    stopping: dict[str, int] = dataclasses.field(default_factory=dict)  # asked to stop, not exited
    stats_errors: dict[str, str] = dataclasses.field(default_factory=dict)  # pool -> why its read failed


@dataclasses.dataclass(frozen=True)
class ObserverParts:
    """The collaborators the observer shares with the rest of the tick."""

    recovery: Recovery
    retiring: Retiring
    start_costs: StartCosts
    crash_loops: CrashLoops
    evidence: EvidenceReader


class Observer:
    """Builds the policy's input from systemd and the store, once per tick.  Not thread-safe:
    the control loop drives it.

    ``doing(what)`` is told what it is about to wait for (the controller's ``activity``);
    ``listed()`` runs once the workers could be listed, before anything else is read (the
    controller sets it: a reload's ``Fleet.configure`` that waited for systemd).
    """

    def __init__(self, config: DaemonConfig, backend: Backend, fleet: Fleet, parts: ObserverParts, *,
                 host: str, doing: Callable[[str], None], listed: Callable[[], None] = lambda: None) -> None:
        self.config = config
        self.backend = backend
        self.fleet = fleet
        self.host = host
        self.recovery = parts.recovery
        self.retiring = parts.retiring
        self.start_costs = parts.start_costs
        self.crash_loops = parts.crash_loops
        #: The probes' threads and the pools' cgroup pressure (direct evidence of a ceiling).
        self.evidence = parts.evidence
        self._doing = doing
        self.listed = listed
        #: When the first delayed job of any pool comes due (epoch seconds), as the last tick
        #: read it: the daemon decides again then.  None: none delayed, or not known.
        self.next_due: float | None = None
        #: Why the store takes no writes, as the last tick found its disk (full, read-only); None: it does.
        self.store_problem: str | None = None
        #: Why the last tick could not list the workers (systemd out of reach: the bus restarting,
        #: systemd re-executing); every pool is held meanwhile.  None: it could.
        self.fleet_problem: str | None = None
        self._fleet_problem_since = 0.0
        self._fleet_problem_logged = float("-inf")
        self._disk_probed_at = float("-inf")
        self._probe_problem: str | None = None
        #: Each limited dependency as the store saw it at the last tick (a failed read: absent).
        self.dependency_stats: dict[str, DependencyStats] = {}
        self._cpu = CpuSampler()
        self._warned_p99: set[str] = set()
        #: Per pool, the other live hosts serving it (daemon.hosts.HostHeartbeat.peers).
        self.fleet_peers: Callable[[], Mapping[str, int]] | None = None
        #: Per pool, its schedules' next firing and its measured size (ScheduleFirer.forecasts).
        self.schedule_forecasts: Callable[[Mapping[str, tuple[str, ...]], float], Mapping[str, Forecast]] | None = None
        self._forecasts: Mapping[str, Forecast] = {}
        self._forecasts_read = float("-inf")

    def reconfigure(self, config: DaemonConfig) -> None:
        """Use the reloaded config from the next tick (the recovery's and the probes' too)."""
        self.config = config
        self.recovery.reconfigure(config)
        self.evidence.reconfigure(config)

    def close(self) -> None:
        """End the probes' threads."""
        self.evidence.stop()

    def observe(self, now: float) -> Seen | None:
        """Every pool as the policy sees it; None when the workers cannot be listed.  Blocking:
        it waits on the store and the fleet; it releases dead workers' jobs on the way."""
        self._doing("listing the workers")
        try:
            workers = self.fleet.list()
        except FleetError as exc:
            self._fleet_unreachable(str(exc), now)
            return None
        self._fleet_reachable(now)
        self.listed()
        self._check_disk()
        # Dead workers' jobs first: a failed worker is forgotten only once its leases are released.
        busy = self.recovery.release_dead_workers(now, {w.pid for w in workers
                                                        if w.pid and w.state is not WorkerState.FAILED})
        self.recovery.maintain(now)
        failed = collections.Counter(w.pool for w in workers if w.state is WorkerState.FAILED)
        self._count_failures(workers, now)
        self.recovery.forget_failed(workers)
        self.retiring.forget_gone(workers)
        by_pool: dict[str, list[WorkerInfo]] = collections.defaultdict(list)
        for worker in workers:
            if worker.state is not WorkerState.FAILED:
                by_pool[worker.pool].append(worker)
        self.recovery.stop_unconfigured(by_pool)
        self._measure_start_costs(workers, now)

        self.dependency_stats = self._read_dependency_stats(now)
        self._read_forecasts(now)
        observations, stats, errors = {}, {}, {}
        peers = self.fleet_peers() if self.fleet_peers is not None else {}
        self.evidence.begin_tick()
        for pool in self.config.pools.values():
            mine = by_pool.get(pool.name, [])
            cost = self.start_costs.estimate(pool.name)
            start_cost = cost.seconds if cost else None
            self._doing(f"reading the queue stats of pool {pool.name}")
            stats[pool.name] = self._read_stats(pool, now, start_cost, errors)
            # A retiring worker is leaving: no capacity, so draining, as a stopped one.
            retiring = len(self.retiring.of(mine))
            observations[pool.name] = Observation(
                pool=pool.name, active=count(mine, WorkerState.ACTIVE) - retiring,
                starting=count(mine, WorkerState.STARTING),
                draining=count(mine, WorkerState.DRAINING) + retiring,
                concurrency=pool.concurrency, metrics=self._metrics(pool, stats[pool.name], mine, now),
                start_cost=start_cost, tick=self.config.tick, other_hosts=peers.get(pool.name, 0),
                evidence=self.evidence.read(pool, [w.pid for w in mine if w.state is WorkerState.ACTIVE and w.pid]))
        self.next_due = min((s.next_due for per_queue in stats.values() for s in per_queue or ()
                             if s.next_due is not None), default=None)
        stopping = {name: count(mine, WorkerState.DRAINING) for name, mine in by_pool.items()}
        return Seen(observations=observations, workers=dict(by_pool), busy=busy, failed=failed, stats=stats,
                    stopping=stopping, stats_errors=errors)

    def _fleet_unreachable(self, problem: str, now: float) -> None:
        """Hold every pool, and say why: when it starts or its reason changes, then every
        ``FLEET_PROBLEM_REPEAT`` seconds (not every tick: a bus restarting takes seconds)."""
        if self.fleet_problem is None:
            self._fleet_problem_since = now
        if problem != self.fleet_problem or now - self._fleet_problem_logged >= FLEET_PROBLEM_REPEAT:
            log.warning("Holding every pool: cannot list workers: %s", problem)
            self._fleet_problem_logged = now
        self.fleet_problem = problem

    def _fleet_reachable(self, now: float) -> None:
        if self.fleet_problem is not None:
            log.info("Listing the workers again after %.1fs (%s); the pools are sized again.",
                     now - self._fleet_problem_since, self.fleet_problem)
        self.fleet_problem = None
        self._fleet_problem_logged = float("-inf")

    def _check_disk(self) -> None:
        """A SQLite store's disk, full or mounted read-only: said in the status and, when it
        changes (not the free space left on a full one), in the journal.  (Reads go on meanwhile,
        so the pools are sized as ever.)"""
        if not self.config.store.startswith("sqlite:///"):
            return
        self._doing("looking at the store's disk")
        path, now = sqlite_path(self.config.store), time.monotonic()
        problem = disk_problem(path)
        if problem is None and now - self._disk_probed_at >= DISK_PROBE_INTERVAL:
            self._disk_probed_at = now
            problem = self._probe_problem = disk_problem(path, write_probe=True)
        elif problem is None:
            problem = self._probe_problem  # what the last write found: only a write tells it passed
        if not same_problem(problem, self.store_problem):
            if problem is not None:
                log.warning("Writes to the queue fail: %s. Nothing can be enqueued, and workers claim "
                            "nothing and keep their jobs until it takes writes again.", problem,
                            extra=journal(MessageId.STORE_NOT_WRITABLE, PROBLEM=problem))
            else:
                log.info("The queue takes writes again (it did not: %s).", self.store_problem)
        self.store_problem = problem

    def _count_failures(self, workers: list[WorkerInfo], now: float) -> None:
        """Count each failed worker (with how it ended) toward its pool's crash loop; say so when
        a pool's failures begin to make one."""
        for worker in workers:
            if worker.state is not WorkerState.FAILED:
                continue
            looping = self.crash_loops.loop(worker.pool, now) is not None
            try:
                ending = self.fleet.how_it_ended(worker.instance, worker.pid)
            except FleetError:
                ending = None
            self.crash_loops.failed(worker.pool, now, ending)
            loop = self.crash_loops.loop(worker.pool, now)
            if loop is not None and not looping:
                log.error("Pool %s is crash-looping: %d workers failed within %.0fs (the last %s); each new "
                          "start waits after the last failure, up to a minute.", worker.pool, loop.failures,
                          CRASH_WINDOW, ending or "ended in a way systemd did not record",
                          extra=journal(MessageId.POOL_CRASH_LOOP, POOL=worker.pool, FAILURES=loop.failures,
                                        LAST_ERROR=ending))
        self.crash_loops.forget(set(self.config.pools))

    def _measure_start_costs(self, workers: list[WorkerInfo], now: float) -> None:
        """Read the first claims of workers started for waiting work that became ready."""
        owners = self.start_costs.waiting(workers, self.host, now)
        if not owners:
            return
        self._doing("reading the first claims of new workers")
        try:
            self.start_costs.claimed(self.backend.first_claims(list(owners)), owners)
        except QueueError as exc:
            log.warning("Cannot read the first claims of new workers (retried next tick): %s", exc)

    def _read_stats(self, pool: PoolConfig, now: float, start_cost: float | None,
                    errors: dict[str, str]) -> list | None:
        """Each queue's stats; None, and the reason in ``errors``, when the store cannot be read."""
        try:
            # Work coming due within the lead time: what a worker started now would be ready for.
            horizon = lead_time(pool.policy.targets, start_cost_or_default(start_cost, pool.policy.behavior),
                                self.config.tick)
            return [self.backend.stats(queue, now=now, horizon=horizon) for queue in pool.queues]
        except StoreDamaged:
            raise  # not "no information": the daemon stops on a damaged store
        except QueueError as exc:
            # No information is not "no load": the policy holds the pool.
            log.warning("Pool %s: cannot read queue stats, holding: %s", pool.name, exc)
            errors[pool.name] = str(exc)
            return None

    def _metrics(self, pool: PoolConfig, stats: list | None, workers: list[WorkerInfo], now: float):
        if stats is None:
            return None
        metrics = PoolMetrics.from_queues(stats)
        # A schedule firing within the lead time brings jobs as delayed ones coming due do: the
        # workers for them start before it fires.
        scheduled = jobs_coming_due(self._forecasts.get(pool.name), now, metrics.coming_due_within)
        if scheduled:
            metrics = dataclasses.replace(metrics, coming_due=metrics.coming_due + scheduled)
        latencies = self._dependency_latencies(pool, now)
        if latencies:
            metrics = dataclasses.replace(metrics, dependencies=latencies)
        self._check_drain_budget(pool, metrics.duration_p99)
        if pool.policy.cpu_bound:
            pids = [w.pid for w in workers if w.state is WorkerState.ACTIVE and w.pid]
            metrics = dataclasses.replace(metrics, cpu_utilisation=self._cpu.sample(pids))
        return metrics

    def _read_forecasts(self, now: float) -> None:
        """The schedules' forecasts, read again every ``FORECAST_EVERY`` seconds and once a firing
        has passed; a failed read leaves none (no pre-warming on old figures)."""
        if self.schedule_forecasts is None:
            return
        passed = any(forecast.at <= now for forecast in self._forecasts.values())
        if not passed and 0 <= now - self._forecasts_read < FORECAST_EVERY:
            return
        self._doing("reading the schedules' forecasts")
        self._forecasts_read = now
        try:
            self._forecasts = dict(self.schedule_forecasts(
                {name: pool.queues for name, pool in self.config.pools.items()}, now))
        except QueueError as exc:
            self._forecasts = {}
            log.warning("Cannot read the schedules' past firings (no workers started ahead of them): %s", exc)

    def _read_dependency_stats(self, now: float) -> dict[str, DependencyStats]:
        """Each limited dependency's figures (jobs inside, deferred, hold times), once per tick."""
        found = {}
        for name in self.config.dependency_limits:
            self._doing(f"reading the figures of dependency {name}")
            try:
                found[name] = self.backend.dependency_stats(name, now=now)
            except QueueError as exc:
                log.warning("Cannot read the figures of dependency %s: %s", name, exc)
        return found

    def _dependency_latencies(self, pool: PoolConfig, now: float) -> tuple[DependencyObservation, ...]:
        """For ``uses.<name>.max_latency``: the p95 time jobs held the (limited) dependency, measured
        by the store; a failed read is no information, so no cap."""
        seen = []
        for use in pool.policy.dependencies:
            held = self.dependency_stats.get(use.dependency)
            if use.max_latency is not None and held is not None and held.hold_p95 is not None:
                seen.append(DependencyObservation(name=use.dependency, latency=held.hold_p95))
        return tuple(seen)

    def _check_drain_budget(self, pool: PoolConfig, p99: float | None) -> None:
        """Warn (once, until it is fixed) when a stop would have to release p99 jobs (a scale-in
        waits for them: see ``retiring``)."""
        if p99 is not None and p99 > pool.drain_timeout:
            if pool.name not in self._warned_p99:
                self._warned_p99.add(pool.name)
                log.warning("Pool %s: p99 job duration %.1fs exceeds drain_timeout %.0fs: a drain or a "
                            "stop of flexiqd will release long jobs to run again; raise drain_timeout.",
                            pool.name, p99, pool.drain_timeout)
        else:
            self._warned_p99.discard(pool.name)


def count(workers: list[WorkerInfo], state: WorkerState) -> int:
    """How many of ``workers`` are in ``state``."""
    return sum(1 for w in workers if w.state is state)


class CpuSampler:
    """Mean CPU use (0..1 of one core) of a set of processes since the previous sample."""

    def __init__(self) -> None:
        self._processes: dict[int, psutil.Process] = {}

    def sample(self, pids: list[int]) -> float | None:
        values = []
        for pid in pids:
            process = self._processes.get(pid)
            try:
                if process is None:
                    process = self._processes[pid] = psutil.Process(pid)
                    process.cpu_percent(None)  # the first call only starts the measurement
                    continue
                values.append(process.cpu_percent(None) / 100.0)
            except psutil.Error:
                self._processes.pop(pid, None)
        for gone in set(self._processes) - set(pids):
            del self._processes[gone]
        return sum(values) / len(values) if values else None
