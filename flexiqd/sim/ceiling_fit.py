"""The dependency model fitted to a real ceiling's knee sweep (bench/ceiling_bench.py's JSON).

A sweep point is a fleet of ``workers`` x ``concurrency`` jobs in flight on a
kept-full backlog: its throughput (jobs/s) and the request path's p95.  The
simulator's ``queue`` model (``trace.SharedDependency``) has, per kind:

- ``hold``: the seconds of the dependency a job uses (its work when nothing
  else runs: the time a connection or thread is held; the CPU seconds of its
  statement, uncapped).  Measured directly by the bench, not fitted.
- ``capacity``: units of that work done at once (8 connections; 0.5 CPU).
- ``overload_penalty``: how much past the capacity each unit of excess
  utilisation slows the work down (0: throughput flat past the knee).
- ``overhead``: a job's seconds outside the dependency (claiming it, recording
  it): the median over the sweep's points below the knee that still scale with
  the workers (0 when there is none: a ceiling one worker reaches hides it).
- the request path, fitted to the sweep's request p95 (so the model's request
  latency is that p95 at a given load): ``request_latency``, its p95 below the
  ceiling (without points there: at rest); nearer and past it a line through
  the other points, ``request_wait`` s per unit of load, leaving
  ``request_latency`` at ``request_wait_from`` units.  Requests queue behind the
  jobs in flight: for a slot pool about a job's hold over the capacity per
  unit; for a shared CPU the request's own work over the capacity, times the
  scheduler's tail.

Pure: numbers in, numbers out; the caller reads and writes the files.
"""

from __future__ import annotations

import math
from statistics import median
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from .trace import QUEUE, SharedDependency

# A first sweep point under this fraction of the best throughput is below the ceiling:
# its duration tells the job's time outside the dependency.
UNSATURATED = 0.8
# A sweep point whose load is at most this fraction of the fitted capacity is one where the
# request path does not queue yet (its p95 is the request path's own).
QUIET = 0.9
_CAPACITY_STEPS = 400   # grid over [0.5, 1.5] x best throughput x hold
_PENALTY_STEPS = 400    # grid over [0, MAX_PENALTY]
MAX_PENALTY = 0.5


class FitError(ValueError):
    """A recorded run that cannot be fitted; the message names the kind and the field."""


@dataclass(frozen=True)
class SweepPoint:
    workers: int
    jobs_per_s: float
    request_p95: float  # seconds


@dataclass(frozen=True)
class CeilingFit:
    """The fitted model of one kind of ceiling, and how well it reproduces the sweep."""

    kind: str
    concurrency: int
    hold: float
    overhead: float
    capacity: float
    overload_penalty: float
    request_load: float
    request_latency: float
    request_wait: float
    request_wait_from: float
    knee: int                      # the sweep's knee (workers), as the bench measured it
    points: tuple[SweepPoint, ...]

    @property
    def base(self) -> float:
        """A job's whole duration, unloaded."""
        return self.overhead + self.hold

    def dependency(self, name: str = "dep") -> SharedDependency:
        """The fitted dependency, undeclared (nobody tells flexiqd the ceiling)."""
        return SharedDependency(
            name=name, capacity=self.capacity, per_job=1.0, share=self.hold / self.base,
            overload_penalty=self.overload_penalty, request_load=self.request_load,
            request_latency=self.request_latency, declared=False, model=QUEUE,
            request_wait=self.request_wait, request_wait_from=self.request_wait_from)

    def throughput(self, workers: int) -> float:
        """The model's jobs/s with ``workers`` busy workers (all slots full)."""
        return queue_throughput(workers * self.concurrency, self.base, self.hold, self.capacity,
                                self.overload_penalty, self.request_load)

    def request_p95(self, workers: int) -> float:
        """The model's request latency (s) with ``workers`` busy workers."""
        return self.dependency().request_time(workers * self.concurrency)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["base"] = self.base
        data["points"] = [
            {"workers": p.workers, "jobs_per_s": p.jobs_per_s, "model_jobs_per_s": round(self.throughput(p.workers), 2),
             "request_p95_ms": round(p.request_p95 * 1000, 1),
             "model_request_p95_ms": round(self.request_p95(p.workers) * 1000, 1)}
            for p in self.points]
        return data


def queue_throughput(in_flight: int, base: float, hold: float, capacity: float, penalty: float,
                     request_load: float) -> float:
    """Jobs/s of a closed loop of ``in_flight`` jobs, each stretched as the engine stretches it."""
    share = hold / base
    dep = SharedDependency("fit", capacity, 1.0, share, penalty, request_load, 0.001, False, model=QUEUE)
    duration = base * ((1.0 - share) + share * dep.slowdown(dep.utilisation(in_flight)))
    return in_flight / duration


def sweep_points(kind: str, recorded: Mapping[str, Any]) -> tuple[SweepPoint, ...]:
    """The sweep of one kind's entry of the bench's JSON."""
    try:
        raw = recorded["sweep"]["points"]
        points = tuple(SweepPoint(int(p["workers"]), float(p["jobs_per_s"]), float(p["request"]["p95_ms"]) / 1000)
                       for p in raw)
    except (KeyError, TypeError, ValueError) as error:
        raise FitError(f"{kind}: sweep.points: not a recorded knee sweep ({error!r})") from None
    if len(points) < 3:
        raise FitError(f"{kind}: sweep.points: at least 3 points needed, got {len(points)}")
    return points


def job_hold(kind: str, recorded: Mapping[str, Any], settings: Mapping[str, Any]) -> float:
    """Seconds of the dependency one job uses, as the bench measured or calibrated it.

    A CPU job's statement is calibrated to ``job_ms`` of CPU uncapped (its unloaded time
    under the cap is that over the cap); a connection or a thread is held for the job's
    operation, measured unloaded.
    """
    if kind == "cpu":
        return float(settings["job_ms"]) / 1000
    try:
        return float(recorded["dependency"]["details"]["job_unloaded_ms"]) / 1000
    except (KeyError, TypeError, ValueError):
        raise FitError(f"{kind}: dependency.details.job_unloaded_ms: missing") from None


def fit_kind(kind: str, recorded: Mapping[str, Any], settings: Mapping[str, Any]) -> CeilingFit:
    """Fit the ``queue`` model to one kind's sweep (see the module docstring)."""
    points = sweep_points(kind, recorded)
    concurrency = int(settings["concurrency"])
    hold = job_hold(kind, recorded, settings)
    best = max(p.jobs_per_s for p in points)
    try:
        knee = int(recorded["sweep"]["knee"])
    except (KeyError, TypeError, ValueError):
        raise FitError(f"{kind}: sweep.knee: missing or not a worker count") from None
    overhead = _outside(points, concurrency, hold, knee, best)
    request_load = float(settings["probe_rate"]) * float(settings["probe_ms"]) / 1000
    capacity, penalty = _fit_throughput(points, concurrency, overhead + hold, hold, best, request_load)
    share = hold / (overhead + hold)
    loads = [p.workers * concurrency * share + request_load for p in points]
    at_rest = recorded.get("request_idle", {}).get("p95_ms")
    quiet = [load <= QUIET * capacity for load in loads]
    latency, wait, wait_from = _fit_requests(loads, [p.request_p95 for p in points], quiet,
                                             None if at_rest is None else float(at_rest) / 1000)
    return CeilingFit(kind=kind, concurrency=concurrency, hold=hold, overhead=overhead, capacity=capacity,
                      overload_penalty=penalty, request_load=request_load, request_latency=latency,
                      request_wait=wait, request_wait_from=wait_from, knee=knee,
                      points=points)


def _outside(points: tuple[SweepPoint, ...], concurrency: int, hold: float, knee: int, best: float) -> float:
    """A job's seconds outside the dependency, from the points that still scale with the workers.

    Below the ceiling a job's duration is its hold plus what it spends outside.  A
    saturated point says nothing of it (there the job waits for the dependency too): a
    first point already near the best throughput means none of them does; later points
    count while their throughput per worker stays near the first one's.
    """
    first = min(points, key=lambda p: p.workers)
    if first.jobs_per_s >= UNSATURATED * best:
        return 0.0
    per_worker = first.jobs_per_s / first.workers
    outside = [p.workers * concurrency / p.jobs_per_s - hold for p in points
               if p.workers < knee and p.jobs_per_s / p.workers >= UNSATURATED * per_worker]
    return max(0.0, median(outside))


def _fit_throughput(points: tuple[SweepPoint, ...], concurrency: int, base: float, hold: float, best: float,
                    request_load: float) -> tuple[float, float]:
    """(capacity, penalty) minimising the squared relative error of the sweep's throughputs."""
    nominal = best * hold  # the capacity if the best point were exactly at it
    fitted = (nominal, 0.0)
    least = math.inf
    for i in range(_CAPACITY_STEPS + 1):
        capacity = nominal * (0.5 + i / _CAPACITY_STEPS)
        if capacity <= request_load:
            continue
        previous = math.inf
        for j in range(_PENALTY_STEPS + 1):
            penalty = MAX_PENALTY * j / _PENALTY_STEPS
            error = 0.0
            for point in points:
                model = queue_throughput(point.workers * concurrency, base, hold, capacity, penalty, request_load)
                error += (model / point.jobs_per_s - 1.0) ** 2
            if error < least:
                least, fitted = error, (capacity, penalty)
            elif error > previous and error > least * 4:
                break  # past this capacity's best penalty, and far off: more only grows the error
            previous = error
    return fitted


def _fit_requests(loads: list[float], p95s: list[float], below: list[bool], at_rest: float | None
                  ) -> tuple[float, float, float]:
    """(latency, wait per unit, wait from): latency = max(a0, a + b load), as a + b max(0, load - L0).

    a0 is the request path's p95 below the ceiling (the ``below`` points, under 90 % of
    the fitted capacity; without any, the request path at rest); the line, fitted to
    the other points (least relative squares), is where requests queue behind the
    jobs.  The hinge L0 is where the line leaves a0.
    """
    quiet = [y for y, under in zip(p95s, below) if under]
    floor = median(quiet) if quiet else (at_rest if at_rest is not None else min(p95s))
    loaded = [(x, y) for x, y, under in zip(loads, p95s, below) if not under]
    if len(loaded) < 2:
        return floor, 0.0, 0.0
    a, b = _weighted_line([x for x, _ in loaded], [y for _, y in loaded])
    if b <= 0:
        return floor, 0.0, 0.0
    return floor, b, max(0.0, (floor - a) / b)


def _weighted_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """a, b minimising sum(((a + b x) / y - 1)^2): relative errors, so every point counts alike."""
    w = [1.0 / (y * y) for y in ys]
    s0 = sum(w)
    s1 = sum(wi * x for wi, x in zip(w, xs))
    s2 = sum(wi * x * x for wi, x in zip(w, xs))
    t0 = sum(wi * y for wi, y in zip(w, ys))
    t1 = sum(wi * x * y for wi, x, y in zip(w, xs, ys))
    det = s0 * s2 - s1 * s1
    if det <= 1e-18:
        return t0 / s0, 0.0
    return (t0 * s2 - t1 * s1) / det, (s0 * t1 - s1 * t0) / det
