"""The discrete-event simulation of one pool: queue, workers, a shared dependency.

Events, in time order: a job becomes runnable, a job completes, a worker
finishes booting, a draining worker's timeout expires, a killed job comes
back.  Between events the state is constant, so the run's costs (worker-
seconds, seconds with the oldest job over target, seconds over dependency
capacity) are integrated exactly.

Model, in brief (docs/BENCHMARKS.md says more):
- jobs are claimed oldest first by the active worker with the most free slots;
- a job's duration is fixed when it starts: its base duration, with the share
  spent inside the dependency stretched by the dependency's slowdown at that
  moment (load = running jobs x per_job x share + the request path's load);
- a worker boots for ``cold_start`` seconds (costing, not claiming), then
  claims; a draining worker claims nothing, and stops when its jobs are done
  -- or, past the fleet's drain timeout, its jobs are killed and re-queued
  after the fleet's re-queue delay;
- how a fleet picks workers to stop, and what it counts as current, is the
  fleet's (``FleetModel``): flexiq's, Kubernetes', flexiqd's differ.

What a policy sees (``Snapshot``) is what the job store would report for the
same jobs at the same instant: runnable, delayed and running counts, the
oldest runnable job's age from its run-at, arrivals counted when a job becomes
runnable, rates and duration percentiles by the store's definitions (see
``metrics``) -- the unit tests run one scripted scenario through both and
compare.  Besides: the pool's start cost (the trace's ``cold_start``), the
delayed jobs coming due soon, and how long the running jobs have run.

Deterministic: no randomness here; the workload is realised up front.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from .metrics import RECENT_WINDOW, EventCounter, RecentDurations, RunResult, TimelinePoint, percentile, summarise
from .trace import Trace, Workload

STARTING, ACTIVE, DRAINING = 0, 1, 2
_COMPLETE, _READY, _KILL, _REQUEUE = 0, 1, 2, 3

# A change of direction less than this long after the previous change counts as a flap.
FLAP_WINDOW = 120.0
# Rates handed to policies are over this many seconds: the window the daemon asks the store for.
RATE_WINDOW = 60.0
# "Coming due" counts the delayed jobs whose run-at falls within this many seconds, unless a
# policy sets ``Simulation.coming_due_within`` to its own horizon.
COMING_DUE_WITHIN = 60.0


@dataclass(frozen=True)
class FleetModel:
    """How a fleet manager starts and stops workers.

    ``victims``: which workers a scale-in stops -- ``idle_first`` (fewest
    in-flight jobs, newest first), ``newest_first`` (Kubernetes' ReplicaSet),
    ``oldest_first`` (flexiq).  ``counts_draining``: draining workers still
    count as current (flexiq), so a later scale-in may pick them again, and
    with ``resignal_kills`` that second stop kills them.  ``drain_timeout``:
    in-flight jobs are killed this long after the stop (None: never).
    ``requeue_delay``: how long a killed job takes to become runnable again
    (0 when the worker releases it, else the lease/orphan timeout).
    ``instant_start``: workers boot in no time and a scale-up takes back
    draining workers before starting new ones (the oracle only).
    ``quiesce``: a busy worker chosen to stop first stops claiming and is
    stopped once its jobs are done -- never killed -- and a scale-up takes such
    workers back before starting new ones (flexiqd's fleet: pause, then stop
    when idle; a paused worker resumes at once).
    """

    name: str
    victims: str
    counts_draining: bool = False
    resignal_kills: bool = False
    drain_timeout: float | None = None
    requeue_delay: float = 0.0
    instant_start: bool = False
    quiesce: bool = False


@dataclass(frozen=True)
class Snapshot:
    """What a policy sees at a tick, as the store would report it (see the module docstring).

    Rates are over the last ``rate_window`` s, counted as the store counts them
    (0 before any event, as from a new store).  ``coming_due``: delayed jobs
    whose run-at falls within the next ``coming_due_within`` s.
    ``running_age_mean``: how long the running jobs have run so far, on average
    (None: none running).  ``start_cost``: seconds from a start decision to the
    worker's first claim (the trace's ``cold_start``; 0 for instant starts).
    ``recent_duration_p50``, ``recent_duration_p95``, ``recent_completions``,
    ``completion_series``: of the completions in the last ``RECENT_WINDOW``
    seconds.
    """

    now: float
    active: int
    starting: int
    draining: int
    concurrency: int
    runnable: int
    delayed: int
    running: int
    oldest_age: float
    arrival_rate: float | None
    completion_rate: float | None
    rate_window: float
    duration_p50: float | None
    duration_p95: float | None
    duration_p99: float | None
    cpu: float
    dependency_utilisation: float | None
    dependency_latency: float | None
    coming_due: int = 0
    coming_due_within: float = COMING_DUE_WITHIN
    running_age_mean: float | None = None
    start_cost: float | None = None
    recent_duration_p50: float | None = None
    recent_duration_p95: float | None = None
    recent_completions: int = 0
    completion_series: tuple[tuple[int, int], ...] = ()


class Worker:
    __slots__ = ("id", "spawned", "state", "jobs", "drains")

    def __init__(self, worker_id: int, spawned: float, state: int) -> None:
        self.id = worker_id
        self.spawned = spawned
        self.state = state
        self.jobs: set[int] = set()
        self.drains = 0  # how many times it was told to drain: a kill is for one drain only

    def copy(self) -> "Worker":
        twin = Worker(self.id, self.spawned, self.state)
        twin.jobs = set(self.jobs)
        twin.drains = self.drains
        return twin


class Simulation:
    """One pool under one fleet model.  Drive it with ``run_until`` and ``scale_to``."""

    def __init__(self, trace: Trace, workload: Workload, fleet: FleetModel, initial_workers: int) -> None:
        self.trace = trace
        self.workload = workload
        self.fleet = fleet
        self.concurrency = trace.workers.concurrency
        self.cold_start = 0.0 if fleet.instant_start else trace.workers.cold_start
        self.now = 0.0
        self._seq = 0
        self._events: list[tuple] = []
        self.queue: list[tuple[float, int]] = []  # (runnable_at, job): a heap, oldest first
        self.next_job = 0  # the next job of the workload to become runnable
        self.next_enqueue = 0  # jobs enqueued so far (delayed ones included)
        self.workers: dict[int, Worker] = {}
        self._next_worker = 0
        self._booting = 0  # workers in STARTING
        # CPU is measured the way a cgroup reports it: busy time over an interval.
        self._busy_seconds = 0.0  # running jobs x seconds
        self._up_seconds = 0.0  # booted (active or draining) workers x seconds
        self._cpu_marks: deque[tuple[float, float, float]] = deque()  # (at, busy, up) at snapshots
        self.running: dict[int, tuple[int, int, float]] = {}  # job -> (worker, token, started)
        self._token = 0
        # The store's statistics of the simulated queue (see ``metrics``).
        self.arrivals = EventCounter()
        self.completions = EventCounter()
        self.durations = RecentDurations()
        self.coming_due_within = COMING_DUE_WITHIN
        # When a list: every job start, finish and kill, as (at, "start"|"finish"|"kill", job, worker).
        self.journal: list[tuple[float, str, int, int]] | None = None
        # Accumulated outcome of the run.
        self.waits: list[float] = []
        self.turnarounds: list[float] = []  # each completed job: runnable -> done, seconds
        self.completed = 0
        self.killed = 0
        self.requeue_pending = 0  # killed jobs waiting out the re-queue delay
        # Those jobs and when their killed attempt started: the store still counts them as
        # running (their lease is held) until the delay is over.
        self.orphaned: dict[int, float] = {}
        self.worker_seconds = 0.0
        self.slo_seconds = 0.0
        self.over_capacity_seconds = 0.0
        self.inflation: dict[float, float] = {}  # request-path latency factor -> seconds at it
        self.scale_events = 0
        self.flaps = 0
        self._last_change: tuple[float, int] | None = None  # (at, direction)
        for _ in range(initial_workers):
            self._spawn(ready=True)

    # --- driving -------------------------------------------------------------------------------

    def run_until(self, end: float) -> None:
        """Process every event up to ``end`` and advance the clock to it."""
        while self._next_time() <= end:
            self._step()
        self._advance(end)

    def run_until_started(self, runnable_by: float, end: float) -> None:
        """Run until every job runnable at or before ``runnable_by`` has started, or until ``end``."""
        while self.queue and self.queue[0][0] <= runnable_by and self._next_time() <= end:
            self._step()
        if self.queue and self.queue[0][0] <= runnable_by:
            self._advance(end)

    def _next_time(self) -> float:
        next_event = self._events[0][0] if self._events else math.inf
        runnable_at = self.workload.runnable_at
        next_arrival = runnable_at[self.next_job] if self.next_job < len(runnable_at) else math.inf
        return min(next_event, next_arrival)

    def _step(self) -> None:
        """Process the next arrival or event (arrivals first on a tie), then start what can start."""
        runnable_at = self.workload.runnable_at
        next_arrival = runnable_at[self.next_job] if self.next_job < len(runnable_at) else math.inf
        if not self._events or next_arrival <= self._events[0][0]:
            self._advance(next_arrival)
            job = self.next_job
            self.next_job += 1
            heapq.heappush(self.queue, (next_arrival, job))
            self.arrivals.add(next_arrival)
        else:
            event = heapq.heappop(self._events)
            self._advance(event[0])
            self._handle(event)
        self._dispatch()

    def scale_to(self, desired: int) -> None:
        """Ask the fleet for ``desired`` workers, with this fleet's semantics."""
        current = self.current()
        if desired == current:
            return
        self._count_change(1 if desired > current else -1)
        if desired > current:
            missing = desired - current
            if self.fleet.instant_start or self.fleet.quiesce:
                missing -= self._reactivate(missing)
            for _ in range(missing):
                self._spawn(ready=self.cold_start == 0)
            self._dispatch()
        else:
            self._shrink(current - desired)
            self._dispatch()  # jobs of a killed worker may be runnable again at once

    def current(self) -> int:
        """The worker count as this fleet manager sees it."""
        counted = (STARTING, ACTIVE, DRAINING) if self.fleet.counts_draining else (STARTING, ACTIVE)
        return sum(1 for worker in self.workers.values() if worker.state in counted)

    def fork(self) -> "Simulation":
        """An independent copy of the current state (for look-ahead); its waits and completion times start empty."""
        twin = object.__new__(Simulation)
        twin.__dict__.update(self.__dict__)
        twin._events = list(self._events)
        twin.queue = list(self.queue)
        twin.workers = {wid: worker.copy() for wid, worker in self.workers.items()}
        twin.running = dict(self.running)
        twin.orphaned = dict(self.orphaned)
        twin.arrivals = self.arrivals.copy()
        twin.completions = self.completions.copy()
        twin.durations = self.durations.copy()
        twin.journal = None
        twin._cpu_marks = deque(self._cpu_marks)
        twin.waits = []
        twin.turnarounds = []  # a look-ahead's completions are not the run's
        twin.inflation = dict(self.inflation)
        return twin

    # --- observing -----------------------------------------------------------------------------

    def counts(self) -> tuple[int, int, int]:
        """(starting, active, draining) workers."""
        tally = [0, 0, 0]
        for worker in self.workers.values():
            tally[worker.state] += 1
        return tally[STARTING], tally[ACTIVE], tally[DRAINING]

    def oldest_age(self) -> float:
        return self.now - self.queue[0][0] if self.queue else 0.0

    def dependency_utilisation(self) -> float | None:
        """Load on the dependency / its capacity (None without one)."""
        dep = self.trace.dependency
        return None if dep is None else dep.utilisation(len(self.running))

    def unfinished_times(self) -> list[float]:
        """How long each runnable job not done yet has been runnable (waiting, running, or
        killed and waiting out its re-queue): at least its completion time, had the run gone on."""
        runnable_at = self.workload.runnable_at
        jobs = [job for _, job in self.queue] + list(self.running) + list(self.orphaned)
        return [self.now - runnable_at[job] for job in jobs]

    def delayed(self) -> int:
        """Jobs enqueued but not runnable yet (future run-at)."""
        order = self.workload.enqueue_order
        while self.next_enqueue < len(order) and order[self.next_enqueue] <= self.now:
            self.next_enqueue += 1
        return self.next_enqueue - self.next_job

    def coming_due(self, within: float) -> int:
        """Delayed jobs (enqueued, run-at in the future) whose run-at is at most ``within`` s away."""
        now = self.now
        return sum(bisect_right(run_ats, now + min(within, delay)) - bisect_right(run_ats, now)
                   for delay, run_ats in self.workload.scheduled)

    def running_age_mean(self) -> float | None:
        """How long the running jobs have run so far, on average (None: none running).

        As the store sees them: with the killed jobs whose lease is still held.
        """
        starts = [started for _, _, started in self.running.values()] + list(self.orphaned.values())
        if not starts:
            return None
        return self.now - sum(starts) / len(starts)

    def snapshot(self) -> Snapshot:
        """The observation at ``now``, as the store would report it (see the module docstring)."""
        now = self.now
        cutoff = now - RATE_WINDOW
        durations = self.durations.sample(now, RATE_WINDOW)
        recent = self.durations.recent(now)
        starting, active, draining = self.counts()
        cpu = self._cpu(cutoff)
        utilisation = self.dependency_utilisation()
        dep = self.trace.dependency
        return Snapshot(
            now=now,
            active=active,
            starting=starting,
            draining=draining,
            concurrency=self.concurrency,
            runnable=len(self.queue),
            delayed=self.delayed(),
            running=len(self.running) + len(self.orphaned),  # a killed job's lease is still held
            oldest_age=self.oldest_age(),
            arrival_rate=self.arrivals.count(now, RATE_WINDOW) / RATE_WINDOW,
            completion_rate=self.completions.count(now, RATE_WINDOW) / RATE_WINDOW,
            rate_window=RATE_WINDOW,
            duration_p50=percentile(durations, 0.50),
            duration_p95=percentile(durations, 0.95),
            duration_p99=percentile(durations, 0.99),
            cpu=cpu,
            dependency_utilisation=utilisation,
            dependency_latency=None if dep is None else dep.request_time(len(self.running)),
            coming_due=self.coming_due(self.coming_due_within),
            coming_due_within=self.coming_due_within,
            running_age_mean=self.running_age_mean(),
            start_cost=self.cold_start,
            recent_duration_p50=percentile(recent, 0.50),
            recent_duration_p95=percentile(recent, 0.95),
            recent_completions=len(recent),
            completion_series=self.completions.series(now, RECENT_WINDOW),
        )

    def _cpu(self, cutoff: float) -> float:
        """Mean CPU of the booted workers since the oldest mark inside the window (0..1)."""
        marks = self._cpu_marks
        marks.append((self.now, self._busy_seconds, self._up_seconds))
        while len(marks) > 1 and marks[0][0] < cutoff:
            marks.popleft()
        _, busy, up = marks[0]
        spec = self.trace.workers
        if self._up_seconds - up <= 0:
            return 0.0
        per_worker = (self._busy_seconds - busy) / (self._up_seconds - up)
        return min(1.0, spec.cpu_idle + spec.cpu_per_slot * per_worker)

    # --- events --------------------------------------------------------------------------------

    def _push(self, at: float, kind: int, a: int, b: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at, self._seq, kind, a, b))

    def _handle(self, event: tuple) -> None:
        _, _, kind, a, b = event
        if kind == _COMPLETE:
            self._complete(a, b)
        elif kind == _READY:
            worker = self.workers.get(a)
            if worker is not None and worker.state == STARTING:
                worker.state = ACTIVE
                self._booting -= 1
        elif kind == _KILL:
            worker = self.workers.get(a)
            if worker is not None and worker.state == DRAINING and worker.drains == b:
                self._kill(worker)
        elif kind == _REQUEUE:
            self.requeue_pending -= 1
            self.orphaned.pop(a, None)
            if self.journal is not None:
                self.journal.append((self.now, "requeue", a, -1))
            heapq.heappush(self.queue, (self.workload.runnable_at[a], a))

    def _advance(self, to: float) -> None:
        """Integrate the run's costs over [now, to], during which nothing changes."""
        span = to - self.now
        if span <= 0:
            return
        self.worker_seconds += len(self.workers) * span
        self._busy_seconds += len(self.running) * span
        self._up_seconds += (len(self.workers) - self._booting) * span
        if self.queue:
            late_from = max(self.now, self.queue[0][0] + self.trace.target_age)
            if to > late_from:
                self.slo_seconds += to - late_from
        dep = self.trace.dependency
        if dep is not None:
            utilisation = dep.utilisation(len(self.running))
            if utilisation > 1.0:
                self.over_capacity_seconds += span
            factor = dep.inflation(len(self.running))
            self.inflation[factor] = self.inflation.get(factor, 0.0) + span
        self.now = to

    def _dispatch(self) -> None:
        """Start runnable jobs, oldest first, on the active workers with the most free slots."""
        queue = self.queue
        if not queue:
            return
        concurrency = self.concurrency
        active = [w for w in self.workers.values() if w.state == ACTIVE and len(w.jobs) < concurrency]
        while queue and active:
            worker = min(active, key=lambda w: (len(w.jobs), w.id))
            _, job = heapq.heappop(queue)
            self._start(job, worker)
            if len(worker.jobs) >= concurrency:
                active.remove(worker)

    def _start(self, job: int, worker: Worker) -> None:
        base = self.workload.base_duration[job]
        dep = self.trace.dependency
        if dep is None:
            duration = base
        else:
            slowdown = dep.slowdown(dep.utilisation(len(self.running) + 1))
            duration = base * ((1.0 - dep.share) + dep.share * slowdown)
        self._token += 1
        self.running[job] = (worker.id, self._token, self.now)
        worker.jobs.add(job)
        self.waits.append(self.now - self.workload.runnable_at[job])
        if self.journal is not None:
            self.journal.append((self.now, "start", job, worker.id))
        self._push(self.now + duration, _COMPLETE, job, self._token)

    def _complete(self, job: int, token: int) -> None:
        entry = self.running.get(job)
        if entry is None or entry[1] != token:
            return  # the job was killed; this completion never happens
        del self.running[job]
        worker = self.workers[entry[0]]
        worker.jobs.discard(job)
        self.completed += 1
        self.turnarounds.append(self.now - self.workload.runnable_at[job])
        self.completions.add(self.now)
        self.durations.add(self.now, self.now - entry[2])
        if self.journal is not None:
            self.journal.append((self.now, "finish", job, entry[0]))
        if worker.state == DRAINING and not worker.jobs:
            del self.workers[worker.id]

    # --- the fleet -----------------------------------------------------------------------------

    def _spawn(self, *, ready: bool) -> None:
        worker = Worker(self._next_worker, self.now, ACTIVE if ready else STARTING)
        self._next_worker += 1
        self.workers[worker.id] = worker
        if not ready:
            self._booting += 1
            self._push(self.now + self.cold_start, _READY, worker.id)

    def _shrink(self, count: int) -> None:
        fleet = self.fleet
        if fleet.counts_draining:
            # flexiq: stop the oldest live workers, whatever they are doing.
            for worker in sorted(self.workers.values(), key=lambda w: w.spawned)[:count]:
                if worker.state == STARTING:
                    self._cancel(worker)
                elif worker.state == ACTIVE:
                    self._drain(worker)
                elif fleet.resignal_kills:
                    self._kill(worker)
            return
        # Booting workers hold no jobs: cancel them first, newest first.
        booting = sorted((w for w in self.workers.values() if w.state == STARTING), key=lambda w: -w.spawned)
        for worker in booting[:count]:
            self._cancel(worker)
        count -= min(count, len(booting))
        active = [w for w in self.workers.values() if w.state == ACTIVE]
        if fleet.victims == "idle_first":
            active.sort(key=lambda w: (len(w.jobs), -w.spawned))
        elif fleet.victims == "newest_first":
            active.sort(key=lambda w: -w.spawned)
        else:
            active.sort(key=lambda w: w.spawned)
        for worker in active[:count]:
            self._drain(worker)

    def _reactivate(self, count: int) -> int:
        """Take back up to ``count`` draining workers, busiest first; return how many."""
        draining = sorted((w for w in self.workers.values() if w.state == DRAINING), key=lambda w: -len(w.jobs))
        for worker in draining[:count]:
            worker.state = ACTIVE
        return min(count, len(draining))

    def _cancel(self, worker: Worker) -> None:
        """Stop a worker that is still booting (it holds no jobs)."""
        del self.workers[worker.id]
        self._booting -= 1

    def _drain(self, worker: Worker) -> None:
        if not worker.jobs:
            del self.workers[worker.id]
            return
        worker.state = DRAINING
        worker.drains += 1
        if self.fleet.drain_timeout is not None and not self.fleet.quiesce:
            self._push(self.now + self.fleet.drain_timeout, _KILL, worker.id, worker.drains)

    def _kill(self, worker: Worker) -> None:
        """Stop ``worker`` now; its in-flight jobs are lost and come back after the re-queue delay."""
        started = {job: self.running[job][2] for job in worker.jobs}
        for job in sorted(worker.jobs):
            del self.running[job]
            self.killed += 1
            if self.journal is not None:
                self.journal.append((self.now, "kill", job, worker.id))
            if self.fleet.requeue_delay > 0:
                self.requeue_pending += 1
                self.orphaned[job] = started[job]
                self._push(self.now + self.fleet.requeue_delay, _REQUEUE, job)
            else:
                heapq.heappush(self.queue, (self.workload.runnable_at[job], job))
        del self.workers[worker.id]

    def _count_change(self, direction: int) -> None:
        self.scale_events += 1
        last = self._last_change
        if last is not None and last[1] != direction and self.now - last[0] < FLAP_WINDOW:
            self.flaps += 1
        self._last_change = (self.now, direction)


class Policy(Protocol):
    """What the engine drives: a scaling policy under its own fleet semantics.

    ``start`` is called once per run before the first tick (a policy keeps
    per-run state, e.g. its history); ``desired`` once per tick.
    """

    name: str

    def fleet(self, trace: Trace) -> FleetModel: ...

    def tick_interval(self, trace: Trace) -> float: ...

    def initial_workers(self, trace: Trace) -> int: ...

    def start(self, trace: Trace, sim: Simulation) -> None: ...

    def desired(self, snapshot: Snapshot) -> int: ...


def run(trace: Trace, workload: Workload, policy: Policy) -> RunResult:
    """Run ``policy`` over the whole trace; sample the pool every tick for the timeline."""
    sim = Simulation(trace, workload, policy.fleet(trace), policy.initial_workers(trace))
    policy.start(trace, sim)
    interval = policy.tick_interval(trace)
    sample_every = trace.tick_interval
    timeline: list[TimelinePoint] = []
    ticks = samples = 0
    while True:
        next_tick, next_sample = ticks * interval, samples * sample_every
        at = min(next_tick, next_sample)
        if at >= trace.duration:
            break
        sim.run_until(at)
        if at == next_sample:
            timeline.append(TimelinePoint(at, sim.oldest_age(), len(sim.workers), sim.dependency_utilisation()))
            samples += 1
        if at == next_tick:
            sim.scale_to(policy.desired(sim.snapshot()))
            ticks += 1
    sim.run_until(trace.duration)
    return summarise(sim, policy.name, tuple(timeline))

