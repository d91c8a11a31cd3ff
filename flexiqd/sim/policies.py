"""The policies compared, each behind the engine's ``Policy`` interface.

Each comes with the fleet semantics and tick interval of the system it
stands for, taken from that system's documented defaults:

- ``fixed-peak``: a fixed fleet sized for the trace's peak (the work arriving
  in its busiest age-target-long window, done within that window);
- ``hpa-cpu``: Kubernetes' HPA on CPU (target 70 %, 15 s sync, tolerance
  0.1, 300 s down window, default rate limits), pods stopped newest first,
  killed after a 30 s grace period, their jobs back after a 30 s lease;
- ``keda-depth``: KEDA's queue-length scaler through the HPA,
  ceil(runnable / 15), otherwise as ``hpa-cpu``;
- ``flexiq``: flexiq 2.1's ``compute_desired_workers`` every 5 s with its
  defaults and its documented windows (0 s up, 300 s down) as it applies them
  (one unclamped history, not seeded), "pending" including delayed jobs,
  draining workers counted as live and stopped again (killed), SIGKILL 35 s
  after SIGTERM, killed jobs back after its 37.7 s orphan timeout;
- ``flexiqd``: ``flexiqd.policy.decide_fleet``, the daemon's one decision
  path, with the default policy (age
  target from the trace, the trace's dependency declared when it is
  declarable), idle workers stopped first, busy ones paused (they stop
  claiming) and stopped once their jobs are done, resumed by a scale-up.

The oracle is in ``oracle``.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..policy import (
    Behavior,
    Dependency,
    DependencyObservation,
    DependencyUse,
    History,
    Observation,
    PoolInput,
    PoolMetrics,
    PoolPolicy,
    RateLimit,
    Targets,
    compute_desired_workers,
    decide_fleet,
)
from ..policy.economics import lead_time
from ..policy.smoothing import rate_limit, record, record_change, stabilize
from ..policy.config import EvidenceRule
from ..policy.types import EvidenceReading, ScaleChange, TimedCount
from .engine import FleetModel, Simulation, Snapshot
from .metrics import RECENT_WINDOW
from .trace import Trace

KUBERNETES_GRACE = 30.0  # terminationGracePeriodSeconds' default
LEASE_TIMEOUT = 30.0  # a typical visibility/lease timeout for the queue behind an HPA
HPA_SYNC = 15.0
HPA_CPU_TARGET = 0.7
KEDA_TARGET_DEPTH = 15  # the same target as flexiq's default depth per worker
FLEXIQ_POLL = 5.0
FLEXIQ_SIGKILL_AFTER = 35.0  # drain timeout 30 s + 5 s
FLEXIQ_ORPHAN_REQUEUE = 37.7  # measured: 30 s heartbeat threshold + reaper + backoff
FLEXIQ_DOWN_WINDOW = 300.0


def kubernetes_fleet() -> FleetModel:
    return FleetModel("kubernetes", victims="newest_first", drain_timeout=KUBERNETES_GRACE, requeue_delay=LEASE_TIMEOUT)


class BasePolicy:
    """Defaults shared by the policies: start with the trace's initial workers, Kubernetes fleet."""

    name = "base"

    def fleet(self, trace: Trace) -> FleetModel:
        return kubernetes_fleet()

    def tick_interval(self, trace: Trace) -> float:
        return trace.tick_interval

    def initial_workers(self, trace: Trace) -> int:
        return trace.workers.initial

    def start(self, trace: Trace, sim: Simulation) -> None:
        self.trace = trace

    def desired(self, snapshot: Snapshot) -> int:
        raise NotImplementedError


class FixedPeak(BasePolicy):
    """A fleet that never changes, sized so the busiest window's work finishes within the age target."""

    name = "fixed-peak"

    def __init__(self, runnable_at: tuple[float, ...], base_duration: tuple[float, ...]) -> None:
        self._runnable_at = runnable_at
        self._base_duration = base_duration

    def initial_workers(self, trace: Trace) -> int:
        return self.size(trace)

    def size(self, trace: Trace) -> int:
        """Workers for the most work that arrives in any age-target-long window, done within it."""
        window = trace.target_age
        busiest = work = 0.0
        first = 0
        for last, at in enumerate(self._runnable_at):
            work += self._base_duration[last]
            while self._runnable_at[first] < at - window:
                work -= self._base_duration[first]
                first += 1
            busiest = max(busiest, work)
        slots = busiest / window
        return max(trace.workers.min, min(trace.workers.max, math.ceil(slots / trace.workers.concurrency)))

    def start(self, trace: Trace, sim: Simulation) -> None:
        self._workers = sim.current()  # the run started with size(trace) workers

    def desired(self, snapshot: Snapshot) -> int:
        return self._workers


class HpaSmoothing:
    """The HPA's stabilisation and rate limits, as ``flexiqd.policy.smoothing`` implements them."""

    BEHAVIOR = Behavior(
        up_window=0.0,
        down_window=300.0,
        tolerance=0.1,
        up_limit=RateLimit(workers=4, percent=100.0, period=15.0),
        down_limit=RateLimit(workers=0, percent=100.0, period=15.0),
    )

    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high
        self.recommendations: tuple[TimedCount, ...] | None = None
        self.changes: tuple[ScaleChange, ...] = ()

    def apply(self, current: int, recommendation: int, now: float) -> int:
        behavior = self.BEHAVIOR
        if self.recommendations is None:
            self.recommendations = record((), now, current, 0.0)
        stabilized, _ = stabilize(current, recommendation, self.recommendations, now, behavior)
        limited, _ = rate_limit(current, stabilized, self.changes, now, behavior)
        desired = min(max(limited, self.low), self.high)
        self.recommendations = record(self.recommendations, now, recommendation, behavior.down_window)
        self.changes = record_change(self.changes, now, current, desired, behavior)
        return desired


class HpaDriven(BasePolicy):
    """A policy that the HPA applies: its sync period and its default smoothing."""

    def tick_interval(self, trace: Trace) -> float:
        return HPA_SYNC

    def start(self, trace: Trace, sim: Simulation) -> None:
        self.smoothing = HpaSmoothing(trace.workers.min, trace.workers.max)


class HpaCpu(HpaDriven):
    """desired = ceil(ready pods x mean CPU / target), the HPA's resource metric rule."""

    name = "hpa-cpu"

    def desired(self, snapshot: Snapshot) -> int:
        current = snapshot.active + snapshot.starting
        if snapshot.active == 0:
            return max(current, self.smoothing.low)
        ratio = snapshot.cpu / HPA_CPU_TARGET
        within = abs(ratio - 1) <= HpaSmoothing.BEHAVIOR.tolerance
        wanted = snapshot.active if within else math.ceil(snapshot.active * ratio)
        return self.smoothing.apply(current, wanted, snapshot.now)


class KedaDepth(HpaDriven):
    """KEDA's queue-length trigger through the HPA: ceil(runnable / target) per replica."""

    name = "keda-depth"

    def desired(self, snapshot: Snapshot) -> int:
        current = snapshot.active + snapshot.starting
        wanted = math.ceil(snapshot.runnable / KEDA_TARGET_DEPTH)
        # The HPA's tolerance on an AverageValue metric: runnable per replica vs the target.
        per_replica = snapshot.runnable / (KEDA_TARGET_DEPTH * current) if current > 0 else None
        if per_replica is not None and abs(per_replica - 1) <= HpaSmoothing.BEHAVIOR.tolerance:
            wanted = current
        return self.smoothing.apply(current, wanted, snapshot.now)


class Flexiq(BasePolicy):
    """flexiq 2.1's autoscaler, defects included where they change what happens."""

    name = "flexiq"

    def fleet(self, trace: Trace) -> FleetModel:
        return FleetModel(
            "flexiq", victims="oldest_first", counts_draining=True, resignal_kills=True,
            drain_timeout=FLEXIQ_SIGKILL_AFTER, requeue_delay=FLEXIQ_ORPHAN_REQUEUE,
        )

    def tick_interval(self, trace: Trace) -> float:
        return FLEXIQ_POLL

    def start(self, trace: Trace, sim: Simulation) -> None:
        self.trace = trace
        self.history: list[tuple[float, int]] = []

    def desired(self, snapshot: Snapshot) -> int:
        workers = self.trace.workers
        live = snapshot.active + snapshot.starting + snapshot.draining
        raw = compute_desired_workers(
            snapshot.runnable + snapshot.delayed,  # its "pending" counts future-dated jobs too
            snapshot.running,
            live,
            min_workers=workers.min,
            max_workers=workers.max,
            concurrency_per_worker=workers.concurrency,
        ).desired_workers
        return self._window(raw, live, snapshot.now)

    def _window(self, raw: int, current: int, now: float) -> int:
        """flexiq's windows: one history, not seeded, no clamping toward the current count."""
        self.history = [(at, rec) for at, rec in self.history if at > now - FLEXIQ_DOWN_WINDOW]
        self.history.append((now, raw))
        if raw < current:
            return max(rec for _, rec in self.history)
        return raw  # its up window is 0 s: only this poll counts


def flexiqd_pool_policy(trace: Trace) -> tuple[PoolPolicy, tuple[Dependency, ...]]:
    """flexiqd's default policy for the trace's pool, and the dependencies it declares."""
    spec = trace.workers
    dep = trace.dependency
    uses: tuple[DependencyUse, ...] = ()
    declared: tuple[Dependency, ...] = ()
    if dep is not None and dep.declared:
        uses = (DependencyUse(dependency=dep.name, per_worker=dep.per_worker(spec.concurrency)),)
        declared = (Dependency(name=dep.name, capacity=dep.capacity, reserved=dep.request_load),)
    policy = PoolPolicy(
        min_workers=spec.min,
        max_workers=spec.max,
        scale_to_zero=spec.min == 0,  # a trace's min 0 is a pool allowed to stop its last worker
        cpu_bound=spec.cpu_bound,
        targets=Targets(age=trace.target_age),
        dependencies=uses,
    )
    return policy, declared


def observation_from(snapshot: Snapshot, trace: Trace) -> Observation:
    """The policy's ``Observation`` of the simulated pool (runnable jobs only)."""
    dep = trace.dependency
    observed = ()
    if dep is not None and snapshot.dependency_latency is not None:
        observed = (DependencyObservation(name=dep.name, latency=snapshot.dependency_latency),)
    metrics = PoolMetrics(
        runnable_depth=snapshot.runnable,
        running=snapshot.running,
        oldest_runnable_age=snapshot.oldest_age,
        arrival_rate=snapshot.arrival_rate,
        completion_rate=snapshot.completion_rate,
        rate_window=snapshot.rate_window,
        duration_p50=snapshot.duration_p50,
        duration_p95=snapshot.duration_p95,
        duration_p99=snapshot.duration_p99,
        cpu_utilisation=snapshot.cpu,
        dependencies=observed,
        coming_due=snapshot.coming_due,
        coming_due_within=snapshot.coming_due_within,
        running_age_mean=snapshot.running_age_mean,
        recent_duration_p50=snapshot.recent_duration_p50,
        recent_duration_p95=snapshot.recent_duration_p95,
        recent_completions=snapshot.recent_completions,
        recent_window=RECENT_WINDOW,
        completion_series=snapshot.completion_series,
        series_reported=True,
    )
    return Observation(
        pool=trace.name, active=snapshot.active, starting=snapshot.starting, draining=snapshot.draining,
        concurrency=snapshot.concurrency, metrics=metrics, start_cost=snapshot.start_cost,
        tick=trace.tick_interval,
    )


class Flexiqd(BasePolicy):
    """flexiqd's default policy, through ``decide_fleet`` as the daemon calls it.

    ``down_window`` replaces the default down window (for showing what the
    window costs); the row is then named after it.  ``probe_factor``: the
    trace's dependency (declared or not) has a probe, the request path's latency
    the simulator models, heeded with this factor (``policy.evidence``); the row
    is ``flexiqd-probe<factor>``.
    """

    name = "flexiqd"

    def __init__(self, down_window: float | None = None, probe_factor: float | None = None) -> None:
        self.down_window = down_window
        self.probe_factor = probe_factor
        if down_window is not None:
            self.name = f"flexiqd-dw{down_window:g}"
        if probe_factor is not None:
            self.name = f"flexiqd-probe{probe_factor:g}"

    def fleet(self, trace: Trace) -> FleetModel:
        return FleetModel("flexiqd", victims="idle_first", drain_timeout=trace.workers.stop_timeout, requeue_delay=0.0,
                          quiesce=True)

    def start(self, trace: Trace, sim: Simulation) -> None:
        self.trace = trace
        self.policy, self.dependencies = flexiqd_pool_policy(trace)
        if self.down_window is not None:
            behavior = replace(self.policy.behavior, down_window=self.down_window)
            self.policy = replace(self.policy, behavior=behavior)
        self.probe: str | None = None
        if self.probe_factor is not None and trace.dependency is not None:
            self.probe = f"probe:{trace.dependency.name}"
            self.policy = replace(self.policy, evidence=(EvidenceRule(source=self.probe, threshold=self.probe_factor),))
        # As the daemon asks the store: the jobs coming due within the lead time (a start and a tick).
        sim.coming_due_within = lead_time(self.policy.targets, trace.workers.cold_start, trace.tick_interval)
        self.history: History | None = None
        self.log: list[str] = []

    def desired(self, snapshot: Snapshot) -> int:
        observation = observation_from(snapshot, self.trace)
        if self.probe is not None:
            # The probe times one request of the request path: its latency as the dependency's load makes it.
            observation = replace(observation, evidence=(EvidenceReading(self.probe, snapshot.dependency_latency),))
        pool = PoolInput(observation=observation, policy=self.policy, history=self.history)
        decision = decide_fleet([pool], self.dependencies, snapshot.now)[self.trace.name]
        self.history = decision.history
        if decision.changed:
            self.log.append(f"t={snapshot.now:.0f}s {decision.line()}")
        return decision.desired
