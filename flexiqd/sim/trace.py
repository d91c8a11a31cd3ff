"""Workload traces: the JSON format (docs/traces.md), its validation, and its realisation.

``load_trace(path)`` reads and validates a trace; every problem raises
``TraceError`` naming the file and the field (``bursts.json: arrivals[2].jobs:
must be an integer >= 1, got 0``).  ``realise(trace)`` turns it into the
concrete jobs of one run -- arrival times and base durations -- from the
trace's seed alone, so every policy sees exactly the same jobs.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

# z-scores of the standard normal, for lognormal durations given by percentiles.
_Z99 = 2.3263478740408408


class TraceError(ValueError):
    """A trace file that cannot be used; the message names the file and the field."""


# --- durations ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Constant:
    value: float

    @property
    def mean(self) -> float:
        return self.value

    def sample(self, rng: random.Random) -> float:
        return self.value


@dataclass(frozen=True)
class LogNormal:
    """Lognormal with the given median and 99th percentile (seconds)."""

    median: float
    p99: float

    @property
    def sigma(self) -> float:
        return math.log(self.p99 / self.median) / _Z99

    @property
    def mean(self) -> float:
        return self.median * math.exp(self.sigma**2 / 2)

    def sample(self, rng: random.Random) -> float:
        return rng.lognormvariate(math.log(self.median), self.sigma)


@dataclass(frozen=True)
class Exponential:
    mean: float

    def sample(self, rng: random.Random) -> float:
        return rng.expovariate(1 / self.mean)


@dataclass(frozen=True)
class Mixture:
    """Each job draws from one component, chosen by weight."""

    components: tuple[tuple[float, "Distribution"], ...]

    @property
    def mean(self) -> float:
        total = sum(weight for weight, _ in self.components)
        return sum(weight * dist.mean for weight, dist in self.components) / total

    def sample(self, rng: random.Random) -> float:
        weights = [weight for weight, _ in self.components]
        _, dist = rng.choices(self.components, weights=weights)[0]
        return dist.sample(rng)


Distribution = Constant | LogNormal | Exponential | Mixture


# --- arrivals ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Steady:
    """Poisson arrivals at ``rate`` jobs/s over [start, end)."""

    rate: float
    start: float
    end: float


@dataclass(frozen=True)
class Diurnal:
    """Poisson arrivals whose rate swings from ``base`` to ``peak`` and back every ``period`` s.

    rate(t) = base + (peak - base) * (1 - cos(2 pi (t - phase) / period)) / 2.
    """

    base: float
    peak: float
    period: float
    phase: float
    start: float
    end: float

    def rate_at(self, t: float) -> float:
        swing = (1 - math.cos(2 * math.pi * (t - self.phase) / self.period)) / 2
        return self.base + (self.peak - self.base) * swing


@dataclass(frozen=True)
class Burst:
    """``jobs`` jobs enqueued evenly over ``spread`` seconds from ``at``."""

    at: float
    jobs: int
    spread: float


@dataclass(frozen=True)
class Source:
    """One stream of jobs: its arrival pattern, durations, and run-at delay.

    ``delay`` > 0 makes the jobs future-dated: enqueued at the arrival time,
    runnable ``delay`` seconds later.
    """

    pattern: Steady | Diurnal | Burst
    duration: Distribution
    delay: float
    label: str


# --- the trace ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workers:
    """The pool: per-worker concurrency, how long a worker takes to boot, bounds.

    ``stop_timeout`` is flexiqd's (the unit's TimeoutStopSec, set above p99 job
    duration); other fleets keep their own documented timeouts.  CPU: a busy
    slot uses ``cpu_per_slot`` of a worker's CPU, an idle worker ``cpu_idle``.
    """

    concurrency: int
    cold_start: float
    min: int
    max: int
    initial: int
    stop_timeout: float
    cpu_per_slot: float
    cpu_idle: float
    cpu_bound: bool


# How a dependency turns load into latency (``SharedDependency.model``).
CONTENTION, QUEUE = "contention", "queue"
DEPENDENCY_MODELS = (CONTENTION, QUEUE)


@dataclass(frozen=True)
class SharedDependency:
    """A dependency the jobs and a request path share (a database, an API).

    A job holds ``per_job`` units of it during ``share`` of its base duration;
    the request path holds ``request_load`` units all the time.  Load beyond
    ``capacity`` queues: time inside the dependency is multiplied by
    ``slowdown(utilisation)``.  ``declared``: whether flexiqd's policy is told
    about it (an undeclared one is a ceiling to discover).

    ``model`` says how load turns into latency (docs/traces.md):

    - ``contention`` (the standard traces, the random families): mild
      contention below capacity, waiting (``queued``) and ``overload_penalty``
      above it; the request path's latency is ``request_latency`` times the
      same slowdown.
    - ``queue`` (fitted to real ceilings, ``ceiling_fit``): nothing below
      capacity; above it work waits its turn (``queued``) and contention
      adds ``overload_penalty`` per unit of excess utilisation.  The request
      path waits ``request_wait`` seconds per unit of load above
      ``request_wait_from``, on top of ``request_latency``: a request queues
      behind the jobs ahead of it (a slot pool: about a job's time in the
      dependency over its capacity per job; processor sharing: its own work
      over the capacity per job).
    """

    name: str
    capacity: float
    per_job: float
    share: float
    overload_penalty: float
    request_load: float
    request_latency: float
    declared: bool
    model: str = CONTENTION
    request_wait: float = 0.0
    request_wait_from: float = 0.0

    def per_worker(self, concurrency: int) -> float:
        """Units a fully busy worker holds on average (what a pool declares per worker)."""
        return concurrency * self.per_job * self.share

    def load(self, running_jobs: int) -> float:
        """Units held with ``running_jobs`` jobs running next to the request path."""
        return running_jobs * self.per_job * self.share + self.request_load

    def utilisation(self, running_jobs: int) -> float:
        """Load / capacity with ``running_jobs`` jobs running next to the request path."""
        return (running_jobs * self.per_job * self.share + self.request_load) / self.capacity

    def slowdown(self, utilisation: float) -> float:
        """Latency multiplier of time inside the dependency at ``utilisation`` = load / capacity.

        ``contention``: below capacity, mild contention (1 + 0.1 u^2); above it,
        work waits for a free unit (``queued``) and contention adds
        ``overload_penalty`` per unit of excess, so throughput falls past the
        ceiling instead of staying flat.  ``queue``: 1 up to capacity, then
        queued(u) (1 + overload_penalty (u - 1)): throughput flat past the ceiling with
        no penalty, falling with one.
        """
        if self.model == QUEUE:
            if utilisation <= 1.0:
                return 1.0
            return self.queued(utilisation) * (1.0 + self.overload_penalty * (utilisation - 1.0))
        if utilisation <= 1.0:
            return 1.0 + 0.1 * utilisation * utilisation
        return 1.1 * self.queued(utilisation) * (1.0 + self.overload_penalty * (utilisation - 1.0))

    def queued(self, utilisation: float) -> float:
        """How much longer the time inside takes at ``utilisation`` > 1 from waiting alone: until the
        dependency does exactly its capacity's work (the utilisation law: completions x time inside
        <= capacity).  A job spends only ``share`` of its time inside, so past capacity the jobs
        pile up there: the excess over the jobs' share of what the request path leaves them.
        With the whole job inside (share 1), u."""
        jobs_share = self.share * (self.capacity - self.request_load) / self.capacity
        return 1.0 + (utilisation - 1.0) / max(jobs_share, 1e-6)

    def request_time(self, running_jobs: int) -> float:
        """The request path's latency (s) with ``running_jobs`` jobs running."""
        if self.model == QUEUE:
            return self.request_latency + self.request_wait * max(0.0, self.load(running_jobs) - self.request_wait_from)
        return self.request_latency * self.slowdown(self.utilisation(running_jobs))

    def inflation(self, running_jobs: int) -> float:
        """The request path's latency over its latency with the request path alone (3 decimals)."""
        if self.model == QUEUE:
            return round(self.request_time(running_jobs) / self.request_time(0), 3)
        unloaded = self.slowdown(self.request_load / self.capacity)
        return round(self.slowdown(self.utilisation(running_jobs)) / unloaded, 3)


@dataclass(frozen=True)
class Trace:
    name: str
    description: str
    seed: int
    duration: float
    tick_interval: float
    target_age: float
    workers: Workers
    sources: tuple[Source, ...]
    dependency: SharedDependency | None


@dataclass(frozen=True)
class Workload:
    """The realised jobs of a trace, ordered by the time they become runnable.

    Job ``i`` is enqueued at ``enqueued_at[i]``, runnable from
    ``runnable_at[i]`` and takes ``base_duration[i]`` seconds on an unloaded
    dependency.  ``enqueue_order`` is ``enqueued_at`` sorted (for counting
    delayed jobs).  ``scheduled``: for each source with a run-at delay, the
    delay and its jobs' run-at times, sorted (a job is delayed while
    ``now < run_at <= now + delay``: for counting the jobs coming due).
    """

    runnable_at: tuple[float, ...]
    enqueued_at: tuple[float, ...]
    base_duration: tuple[float, ...]
    enqueue_order: tuple[float, ...]
    scheduled: tuple[tuple[float, tuple[float, ...]], ...] = ()

    def __len__(self) -> int:
        return len(self.runnable_at)


# --- loading and validation --------------------------------------------------------------------


def load_trace(path: str | Path) -> Trace:
    """Read and validate the trace file at ``path``; ``TraceError`` on any problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise TraceError(f"{path}: cannot read: {error.strerror or error}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        where = f"line {error.lineno} column {error.colno}"
        raise TraceError(f"{path.name}: not valid JSON: {error.msg} at {where}") from None
    return parse_trace(data, source=path.name)


def parse_trace(data: Any, *, source: str = "trace") -> Trace:
    """Validate a decoded trace; ``source`` prefixes error messages."""
    return _Parser(source).trace(data)


class _Parser:
    """Reads one trace, raising ``TraceError`` with the path to the offending field."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def fail(self, where: str, why: str) -> TraceError:
        return TraceError(f"{self.origin}: {where}: {why}")

    def mapping(self, value: Any, where: str, known: set[str], required: set[str]) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"must be an object, got {_show(value)}")
        for key in value:
            if key not in known:
                raise self.fail(f"{where}.{key}" if where != "trace" else key,
                                f"unknown field (known: {', '.join(sorted(known))})")
        for key in sorted(required):
            if key not in value:
                raise self.fail(where, f"missing required field {key!r}")
        return value

    def number(
        self, value: Any, where: str, *, low: float = 0.0, strict: bool = False, high: float | None = None
    ) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(where, f"must be a number, got {_show(value)}")
        if value < low or (strict and value == low) or (high is not None and value > high):
            bound = f"> {low:g}" if strict else f">= {low:g}"
            if high is not None:
                bound += f" and <= {high:g}"
            raise self.fail(where, f"must be a number {bound}, got {_show(value)}")
        return float(value)

    def integer(self, value: Any, where: str, *, low: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise self.fail(where, f"must be an integer >= {low}, got {_show(value)}")
        return value

    def text(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(where, f"must be a non-empty string, got {_show(value)}")
        return value

    def flag(self, value: Any, where: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(where, f"must be true or false, got {_show(value)}")
        return value

    def trace(self, data: Any) -> Trace:
        known = {"name", "description", "seed", "duration", "tick_interval", "target_age",
                 "workers", "jobs", "arrivals", "dependency"}
        top = self.mapping(data, "trace", known, {"name", "seed", "duration", "target_age", "workers", "arrivals"})
        duration = self.number(top["duration"], "duration", strict=True)
        jobs = self.mapping(top.get("jobs", {}), "jobs", {"duration"}, set())
        default_duration = self.distribution(jobs["duration"], "jobs.duration") if "duration" in jobs else None
        arrivals = top["arrivals"]
        if not isinstance(arrivals, list) or not arrivals:
            raise self.fail("arrivals", f"must be a non-empty list, got {_show(arrivals)}")
        sources = tuple(
            self.source(item, f"arrivals[{i}]", default_duration, duration) for i, item in enumerate(arrivals)
        )
        return Trace(
            name=self.text(top["name"], "name"),
            description=str(top.get("description", "")),
            seed=self.integer(top["seed"], "seed"),
            duration=duration,
            tick_interval=self.number(top.get("tick_interval", 5.0), "tick_interval", strict=True),
            target_age=self.number(top["target_age"], "target_age", strict=True),
            workers=self.workers(top["workers"]),
            sources=sources,
            dependency=None if top.get("dependency") is None else self.dependency(top["dependency"]),
        )

    def workers(self, value: Any) -> Workers:
        known = {"concurrency", "cold_start", "min", "max", "initial", "stop_timeout",
                 "cpu_per_slot", "cpu_idle", "cpu_bound"}
        raw = self.mapping(value, "workers", known, {"concurrency", "max"})
        low = self.integer(raw.get("min", 1), "workers.min")
        high = self.integer(raw["max"], "workers.max", low=1)
        if high < low:
            raise self.fail("workers.max", f"must be >= workers.min ({low}), got {high}")
        initial = self.integer(raw.get("initial", low), "workers.initial")
        if not low <= initial <= high:
            raise self.fail("workers.initial", f"must be within [{low}, {high}], got {initial}")
        return Workers(
            concurrency=self.integer(raw["concurrency"], "workers.concurrency", low=1),
            cold_start=self.number(raw.get("cold_start", 5.0), "workers.cold_start"),
            min=low,
            max=high,
            initial=initial,
            stop_timeout=self.number(raw.get("stop_timeout", 90.0), "workers.stop_timeout"),
            cpu_per_slot=self.number(raw.get("cpu_per_slot", 0.05), "workers.cpu_per_slot", high=1.0),
            cpu_idle=self.number(raw.get("cpu_idle", 0.02), "workers.cpu_idle", high=1.0),
            cpu_bound=self.flag(raw.get("cpu_bound", False), "workers.cpu_bound"),
        )

    def source(self, value: Any, where: str, default: Distribution | None, span: float) -> Source:
        if not isinstance(value, dict):
            raise self.fail(where, f"must be an object, got {_show(value)}")
        kind = value.get("kind")
        common = {"kind", "duration", "delay", "label"}
        if kind == "steady":
            raw = self.mapping(value, where, common | {"rate", "start", "end"}, {"rate"})
            start, end = self.span(raw, where, span)
            rate = self.number(raw["rate"], f"{where}.rate", strict=True)
            pattern: Steady | Diurnal | Burst = Steady(rate, start, end)
        elif kind == "diurnal":
            raw = self.mapping(value, where, common | {"base", "peak", "period", "phase", "start", "end"},
                               {"base", "peak", "period"})
            start, end = self.span(raw, where, span)
            base = self.number(raw["base"], f"{where}.base")
            peak = self.number(raw["peak"], f"{where}.peak", strict=True)
            if peak < base:
                raise self.fail(f"{where}.peak", f"must be >= base ({base:g}), got {_show(raw['peak'])}")
            period = self.number(raw["period"], f"{where}.period", strict=True)
            phase = self.number(raw.get("phase", 0.0), f"{where}.phase")
            pattern = Diurnal(base, peak, period, phase, start, end)
        elif kind == "burst":
            raw = self.mapping(value, where, common | {"at", "jobs", "spread"}, {"at", "jobs"})
            at = self.number(raw["at"], f"{where}.at")
            if at >= span:
                raise self.fail(f"{where}.at", f"must be before the trace's duration ({span:g}), got {_show(at)}")
            pattern = Burst(at, self.integer(raw["jobs"], f"{where}.jobs", low=1),
                            self.number(raw.get("spread", 0.0), f"{where}.spread"))
        else:
            raise self.fail(f"{where}.kind", f"must be one of burst, diurnal, steady, got {_show(kind)}")
        if "duration" in raw:
            duration = self.distribution(raw["duration"], f"{where}.duration")
        elif default is not None:
            duration = default
        else:
            raise self.fail(f"{where}.duration", "missing, and the trace has no jobs.duration default")
        return Source(
            pattern=pattern,
            duration=duration,
            delay=self.number(raw.get("delay", 0.0), f"{where}.delay"),
            label=str(raw.get("label", kind)),
        )

    def span(self, raw: Mapping[str, Any], where: str, span: float) -> tuple[float, float]:
        start = self.number(raw.get("start", 0.0), f"{where}.start")
        end = self.number(raw.get("end", span), f"{where}.end")
        if end <= start:
            raise self.fail(f"{where}.end", f"must be after start ({start:g}), got {end:g}")
        return start, min(end, span)

    def distribution(self, value: Any, where: str) -> Distribution:
        if not isinstance(value, dict):
            raise self.fail(where, f"must be an object, got {_show(value)}")
        kind = value.get("kind")
        if kind == "constant":
            raw = self.mapping(value, where, {"kind", "value"}, {"value"})
            return Constant(self.number(raw["value"], f"{where}.value", strict=True))
        if kind == "lognormal":
            raw = self.mapping(value, where, {"kind", "median", "p99"}, {"median", "p99"})
            median = self.number(raw["median"], f"{where}.median", strict=True)
            p99 = self.number(raw["p99"], f"{where}.p99", strict=True)
            if p99 <= median:
                raise self.fail(f"{where}.p99", f"must be above the median ({median:g}), got {_show(raw['p99'])}")
            return LogNormal(median, p99)
        if kind == "exponential":
            raw = self.mapping(value, where, {"kind", "mean"}, {"mean"})
            return Exponential(self.number(raw["mean"], f"{where}.mean", strict=True))
        if kind == "mixture":
            raw = self.mapping(value, where, {"kind", "components"}, {"components"})
            items = raw["components"]
            if not isinstance(items, list) or not items:
                raise self.fail(f"{where}.components", f"must be a non-empty list, got {_show(items)}")
            components = []
            for i, item in enumerate(items):
                spot = f"{where}.components[{i}]"
                if not isinstance(item, dict) or "weight" not in item:
                    raise self.fail(spot, "must be an object with a weight and a distribution")
                weight = self.number(item["weight"], f"{spot}.weight", strict=True)
                components.append((weight, self.distribution({k: v for k, v in item.items() if k != "weight"}, spot)))
            return Mixture(tuple(components))
        raise self.fail(f"{where}.kind", f"must be one of constant, exponential, lognormal, mixture, got {_show(kind)}")

    def dependency(self, value: Any) -> SharedDependency:
        known = {"name", "capacity", "per_job", "share", "overload_penalty", "request_load",
                 "request_latency", "declared", "model", "request_wait", "request_wait_from"}
        raw = self.mapping(value, "dependency", known, {"name", "capacity", "share"})
        capacity = self.number(raw["capacity"], "dependency.capacity", strict=True)
        request_load = self.number(raw.get("request_load", 0.0), "dependency.request_load")
        if request_load >= capacity:
            raise self.fail(
                "dependency.request_load", f"must be below the capacity ({capacity:g}), got {request_load:g}"
            )
        model = raw.get("model", CONTENTION)
        if model not in DEPENDENCY_MODELS:
            raise self.fail("dependency.model", f"must be one of {', '.join(DEPENDENCY_MODELS)}, got {_show(model)}")
        if model != QUEUE:
            for field in ("request_wait", "request_wait_from"):
                if field in raw:
                    raise self.fail(f"dependency.{field}", f"only for model {QUEUE!r} (the model is {model!r})")
        return SharedDependency(
            name=self.text(raw["name"], "dependency.name"),
            capacity=capacity,
            per_job=self.number(raw.get("per_job", 1.0), "dependency.per_job", strict=True),
            share=self.number(raw["share"], "dependency.share", high=1.0),
            overload_penalty=self.number(raw.get("overload_penalty", 0.5), "dependency.overload_penalty"),
            request_load=request_load,
            request_latency=self.number(raw.get("request_latency", 0.01), "dependency.request_latency", strict=True),
            declared=self.flag(raw.get("declared", True), "dependency.declared"),
            model=model,
            request_wait=self.number(raw.get("request_wait", 0.0), "dependency.request_wait"),
            request_wait_from=self.number(raw.get("request_wait_from", 0.0), "dependency.request_wait_from"),
        )


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# --- realisation -------------------------------------------------------------------------------


def realise(trace: Trace) -> Workload:
    """The trace's jobs for one run: deterministic in ``trace.seed``.

    Each source draws from its own generator (seeded from the trace seed and
    the source's index), so editing one source leaves the others' jobs as
    they were.
    """
    jobs: list[tuple[float, float, float]] = []  # (runnable_at, enqueued_at, base_duration)
    scheduled: list[tuple[float, tuple[float, ...]]] = []
    for index, source in enumerate(trace.sources):
        rng = random.Random(f"{trace.seed}:{index}")
        first = len(jobs)
        for enqueued in _arrival_times(source.pattern, rng):
            if enqueued < trace.duration:
                jobs.append((enqueued + source.delay, enqueued, source.duration.sample(rng)))
        if source.delay > 0:
            scheduled.append((source.delay, tuple(sorted(job[0] for job in jobs[first:]))))
    jobs.sort()
    return Workload(
        runnable_at=tuple(job[0] for job in jobs),
        enqueued_at=tuple(job[1] for job in jobs),
        base_duration=tuple(job[2] for job in jobs),
        enqueue_order=tuple(sorted(job[1] for job in jobs)),
        scheduled=tuple(scheduled),
    )


def _arrival_times(pattern: Steady | Diurnal | Burst, rng: random.Random) -> list[float]:
    if isinstance(pattern, Burst):
        if pattern.jobs == 1 or pattern.spread == 0:
            return [pattern.at] * pattern.jobs
        step = pattern.spread / pattern.jobs
        return [pattern.at + i * step for i in range(pattern.jobs)]
    times = []
    peak = pattern.rate if isinstance(pattern, Steady) else pattern.peak
    t = pattern.start
    while True:
        t += rng.expovariate(peak)
        if t >= pattern.end:
            return times
        # Thinning: a diurnal source keeps each candidate with probability rate(t) / peak.
        if isinstance(pattern, Steady) or rng.random() * peak <= pattern.rate_at(t):
            times.append(t)
