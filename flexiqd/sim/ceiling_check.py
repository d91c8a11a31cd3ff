"""The real ceilings' flash crowds, simulated with the fitted model, beside what was measured.

``bench/ceiling_bench.py`` records, per kind of ceiling, a knee sweep and a flash
crowd per policy.  ``check_kind`` fits the simulator's dependency model to the
sweep (``ceiling_fit``), builds the same crowd (the same jobs, concurrency, max
workers, age target, tick, drain timeout, a pool at rest with one worker) and runs
each policy the bench ran:

- ``flexiqd``: ``decide_fleet`` with flexiqd's default policy, the dependency
  undeclared, on flexiqd's process fleet (idle workers stopped first, busy ones
  paused), as ``flexiq autoscale --policy flexiqd`` runs it;
- ``flexiq``: ``decide_fleet`` with ``kind="flexiq"`` (flexiq's formula as flexiqd
  ships it, its options at their defaults), the same fleet;
- ``keda``: the bench's loop: ceil((runnable + running) / target) each tick,
  clamped, applied at once both ways, the newest workers drain-stopped;
- ``fixed-<n>``: that many workers, ready before the crowd;
- ``daemon``, ``daemon-probe``, ``daemon-probe-only``: flexiqd itself on the process
  fleet (the same decision path as ``flexiqd``), heeding a probe of the dependency at
  the default factor -- it reads the model's request latency, a p95 where a real probe
  reads one request -- and, for the last, with the throughput knee off.

It measures what the bench measures: workers (processes: starting and draining
ones count) every 0.2 s, settle = their median over the second half of the drain,
max = the most seen; drain = the crowd's enqueue to its last job done; the request
path sampled 10 times a second during the drain, its p95, and that over the fixed
fleet at the knee's.  Pure apart from the policies' own state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import median
from typing import Any, Mapping

from ..config.model import FlexiqOptions
from ..policy import PoolInput, decide_fleet
from ..policy.fleet import FLEXIQ
from .ceiling_fit import CeilingFit, fit_kind
from .engine import FleetModel, Simulation, Snapshot
from .policies import BasePolicy, Flexiqd, observation_from
from .trace import Burst, Constant, Source, Trace, Workers, realise

CROWD_AT = 5.5          # s: the pool rests with one worker, then the crowd (mid-tick, as a real one lands)
SAMPLE_WORKERS = 0.2    # s, as the bench samples the processes
REQUEST_RATE = 10.0     # requests/s of the bench's request path
LONGEST = 600.0         # s: a crowd not drained by then is reported as such


@dataclass(frozen=True)
class CrowdSettings:
    """The settings of the recorded run that the simulated crowd copies."""

    concurrency: int
    min_workers: int
    max_workers: int
    target_age: float
    tick: float
    drain_timeout: float
    keda_target: int
    start_cost: float

    @classmethod
    def of(cls, settings: Mapping[str, Any], start_cost: float) -> "CrowdSettings":
        return cls(concurrency=int(settings["concurrency"]), min_workers=int(settings["min_workers"]),
                   max_workers=int(settings["max_workers"]), target_age=float(settings["target_age"]),
                   tick=float(settings["poll_interval"]), drain_timeout=float(settings["drain_timeout"]),
                   keda_target=int(settings["keda_target"]), start_cost=start_cost)


@dataclass(frozen=True)
class CrowdResult:
    policy: str
    settle_workers: float
    max_workers: int
    drain_s: float
    request_p95_ms: float
    drained: bool


def crowd_trace(fit: CeilingFit, jobs: int, settings: CrowdSettings, initial: int) -> Trace:
    """The flash crowd of the recorded run: ``jobs`` jobs of the fitted duration at once."""
    workers = Workers(concurrency=settings.concurrency, cold_start=settings.start_cost, min=settings.min_workers,
                      max=settings.max_workers, initial=initial, stop_timeout=settings.drain_timeout,
                      cpu_per_slot=0.05, cpu_idle=0.02, cpu_bound=False)
    return Trace(name=f"ceiling-{fit.kind}", description=f"a real {fit.kind} ceiling's flash crowd, fitted",
                 seed=0, duration=CROWD_AT + LONGEST, tick_interval=settings.tick, target_age=settings.target_age,
                 workers=workers, sources=(Source(Burst(CROWD_AT, jobs, 0.0), Constant(fit.base), 0.0, "crowd"),),
                 dependency=fit.dependency())


def process_fleet(trace: Trace) -> FleetModel:
    """flexiqd's ProcessFleet under ``flexiq autoscale``: idle workers stop first, busy ones pause."""
    return FleetModel("process", victims="idle_first", drain_timeout=trace.workers.stop_timeout, quiesce=True)


class AutoscaleFlexiqd(Flexiqd):
    """``flexiq autoscale --policy flexiqd``: the daemon's decision path, the fleet's own tick.

    Also flexiqd itself on the process fleet (the bench's ``daemon`` rows): ``probe_factor``
    heeds a probe of the dependency (it reads the model's request latency), ``knee`` False
    turns the throughput knee off.
    """

    def __init__(self, name: str = "flexiqd", probe_factor: float | None = None, knee: bool = True) -> None:
        super().__init__(probe_factor=probe_factor)
        self.name = name
        self.knee = knee

    def fleet(self, trace: Trace) -> FleetModel:
        return process_fleet(trace)

    def start(self, trace: Trace, sim: Simulation) -> None:
        super().start(trace, sim)
        if not self.knee:
            self.policy = replace(self.policy, knee=replace(self.policy.knee, enabled=False))


class AutoscaleFlexiq(AutoscaleFlexiqd):
    """``flexiq autoscale --policy flexiq``: flexiq's formula as flexiqd ships it, default options."""

    def __init__(self) -> None:
        super().__init__("flexiq")

    def desired(self, snapshot: Snapshot) -> int:
        observation = observation_from(snapshot, self.trace)
        pool = PoolInput(observation=observation, policy=self.policy, history=self.history, kind=FLEXIQ,
                         flexiq=FlexiqOptions())
        decision = decide_fleet([pool], self.dependencies, snapshot.now)[self.trace.name]
        self.history = decision.history
        return decision.desired


class KedaLoop(BasePolicy):
    """The bench's KEDA loop: ceil((runnable + running) / target), clamped, applied at once."""

    name = "keda"

    def __init__(self, target: int, drain_timeout: float) -> None:
        self.target = target
        self.drain_timeout = drain_timeout

    def fleet(self, trace: Trace) -> FleetModel:
        return FleetModel("process", victims="newest_first", drain_timeout=self.drain_timeout)

    def desired(self, snapshot: Snapshot) -> int:
        workers = self.trace.workers
        return max(workers.min, min(workers.max, math.ceil((snapshot.runnable + snapshot.running) / self.target)))


class FixedFleet(BasePolicy):
    """``count`` workers, all ready before the crowd."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.name = f"fixed-{count}"

    def initial_workers(self, trace: Trace) -> int:
        return self.count

    def desired(self, snapshot: Snapshot) -> int:
        return self.count


# The bench's probe rows heed a probe at the default factor.
PROBE_FACTOR = 5.0


def policy_named(name: str, settings: CrowdSettings) -> BasePolicy | None:
    """The simulated counterpart of the bench's policy ``name`` (None: none)."""
    if name in ("flexiqd", "daemon"):
        return AutoscaleFlexiqd(name)
    if name == "daemon-probe":
        return AutoscaleFlexiqd(name, probe_factor=PROBE_FACTOR)
    if name == "daemon-probe-only":
        return AutoscaleFlexiqd(name, probe_factor=PROBE_FACTOR, knee=False)
    if name == "flexiq":
        return AutoscaleFlexiq()
    if name == "keda":
        return KedaLoop(settings.keda_target, settings.drain_timeout)
    if name.startswith("fixed-") and name[6:].isdigit():
        return FixedFleet(int(name[6:]))
    return None


def run_crowd(fit: CeilingFit, jobs: int, settings: CrowdSettings, policy: BasePolicy) -> CrowdResult:
    """One policy on the crowd, measured as the bench measures it (see the module docstring)."""
    initial = policy.initial_workers(crowd_trace(fit, jobs, settings, settings.min_workers))
    trace = crowd_trace(fit, jobs, settings, initial)
    sim = Simulation(trace, realise(trace), policy.fleet(trace), initial)
    sim.journal = []
    policy.start(trace, sim)
    dep = trace.dependency
    assert dep is not None
    # Every instant at which something is looked at, in order: ticks, worker samples, requests.
    step = 1.0 / REQUEST_RATE
    samples: list[tuple[float, int]] = []
    requests: list[float] = []
    t, tick_due, sample_due = 0.0, 0.0, CROWD_AT
    while t <= trace.duration:
        sim.run_until(t)
        if t >= CROWD_AT:
            requests.append(dep.request_time(len(sim.running)))
        while sample_due <= t + 1e-9:
            samples.append((sample_due, len(sim.workers)))
            sample_due += SAMPLE_WORKERS
        if t >= tick_due - 1e-9:
            sim.scale_to(policy.desired(sim.snapshot()))
            tick_due += trace.tick_interval
        if sim.completed >= jobs:
            break
        t = round(t + step, 6)
    drained = sim.completed >= jobs
    finishes = [at for at, what, _, _ in sim.journal if what == "finish"]
    end = max(finishes) if drained else sim.now
    drain = end - CROWD_AT
    during = [count for at, count in samples if at <= end] or [len(sim.workers)]
    second_half = [count for at, count in samples if CROWD_AT + drain / 2 <= at <= end] or during
    latencies = sorted(requests[:max(1, int(drain * REQUEST_RATE) + 1)])
    p95 = latencies[min(len(latencies) - 1, math.ceil(0.95 * len(latencies)) - 1)]
    return CrowdResult(policy=policy.name, settle_workers=float(median(second_half)), max_workers=max(during),
                       drain_s=round(drain, 2), request_p95_ms=round(p95 * 1000, 2), drained=drained)


# --- beside the real run ------------------------------------------------------------------------

COMPARED = ("settle_workers", "max_workers", "drain_s", "p95_ratio")


def check_kind(kind: str, recorded: Mapping[str, Any], settings: Mapping[str, Any], start_cost: float,
               fit: CeilingFit | None = None) -> dict[str, Any]:
    """The fitted model, and per policy the simulated and the real figures and their differences in %."""
    fit = fit or fit_kind(kind, recorded, settings)
    crowd = CrowdSettings.of(settings, start_cost)
    jobs = int(recorded["jobs"])
    fixed_knee = str(recorded.get("fixed_knee") or f"fixed-{fit.knee}")
    summary = recorded["summary"]
    recorded_names = [name for name in recorded.get("policies", summary) if name in summary]
    policies = {name: policy_named(name, crowd) for name in recorded_names}
    names = [name for name in recorded_names if policies[name] is not None]
    simulated = {name: run_crowd(fit, jobs, crowd, policies[name]) for name in names}
    knee_p95 = simulated[fixed_knee].request_p95_ms if fixed_knee in simulated else None
    rows = []
    for name in names:
        sim = simulated[name]
        real = summary[name]
        sim_row = {"settle_workers": sim.settle_workers, "max_workers": sim.max_workers, "drain_s": sim.drain_s,
                   "request_p95_ms": sim.request_p95_ms,
                   "p95_ratio": round(sim.request_p95_ms / knee_p95, 2) if knee_p95 else None,
                   "drained": sim.drained}
        real_row = {"settle_workers": real["settle_workers"], "max_workers": real["max_workers"],
                    "drain_s": real["drain_s"], "request_p95_ms": real["request_p95_ms"],
                    "p95_ratio": real["p95_ratio"]}
        rows.append({"policy": name, "simulated": sim_row, "real": real_row,
                     "difference_pct": {key: difference(sim_row[key], real_row[key]) for key in COMPARED}})
    return {"kind": kind, "jobs": jobs, "knee": fit.knee, "fixed_knee": fixed_knee, "start_cost": start_cost,
            "fit": fit.as_dict(), "policies": rows,
            "not_simulated": [name for name in recorded_names if policies[name] is None]}


def difference(simulated: float | None, real: float | None) -> float | None:
    """(simulated - real) / real in %, rounded (None when either is missing or real is 0)."""
    if simulated is None or real is None or real == 0:
        return None
    return round((simulated - real) / real * 100, 1)

