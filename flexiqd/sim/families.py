"""Workloads drawn at random from families shaped like what users run.

A policy tuned to a handful of traces fails on the next one; ``bench
policies --random N`` judges it on workloads it never saw.  Each family draws
its shape (load pattern, job-duration distribution, target, pool, dependency)
from a seeded generator, so ``draw(family, seed)`` is the same trace on every
machine, and the sample of ``sample(n, seed)`` is fixed by ``n`` and ``seed``.

The families:

- ``heavy_tail``: steady or diurnal load, lognormal durations with sigma up to
  2 (p99 up to ~100 x the median) or exponential ones;
- ``two_class``: most jobs short, 1-20 % of them 100-10,000 x longer;
- ``diurnal``: a daily-like swing of the arrival rate, mixed durations;
- ``flash_crowd``: a trickle, then a crowd, against a declared dependency;
- ``hidden_ceiling``: the same against a dependency nobody declared, its
  knee at a random worker count;
- ``scheduled``: batches enqueued ahead with a run-at, of random size and time;
- ``square_wave``: load that flips between high and low at a random period,
  with a short age target;
- ``quota``: a declared dependency whose capacity is below what the load
  needs at its peak;
- ``slow_bursts``: bursts of 50-300 jobs of 10-60 s on a trickle of short ones.

Every pool's ``max_workers`` leaves room above what the peak needs, so a
policy that misses the target does so by its own decisions, not its bounds.
"""

from __future__ import annotations

import math
import random
from typing import Callable

from .trace import (
    Burst,
    Constant,
    Distribution,
    Diurnal,
    Exponential,
    LogNormal,
    Mixture,
    SharedDependency,
    Source,
    Steady,
    Trace,
    Workers,
)

# Arrivals stay below this many jobs/s, so that a run of every policy (the oracle's
# look-ahead most of all) takes seconds: the shapes, not the volume, are what is tried.
MAX_RATE = 40.0

# What the daemon's tick and a unit's start cost are drawn from (seconds): the daemon
# ticks every second by default, a worker unit starts in 0.3-0.9 s, a slow app's in seconds.
TICKS = (1.0, 2.0, 5.0)
COLD_STARTS = (0.5, 1.0, 2.0, 5.0)


def _lognormal(rng: random.Random, median: float, sigma: float) -> LogNormal:
    """A lognormal of this median and sigma (the trace format gives it by its p99)."""
    return LogNormal(median, median * math.exp(2.3263478740408408 * sigma))


def _heavy(rng: random.Random) -> Distribution:
    median = rng.choice((0.05, 0.2, 0.5, 1.0, 2.0, 5.0))
    if rng.random() < 0.25:
        return Exponential(median * rng.uniform(1.0, 3.0))
    return _lognormal(rng, median, rng.uniform(0.5, 2.0))


def _two_class(rng: random.Random) -> Distribution:
    short = rng.choice((0.02, 0.05, 0.1, 0.5, 1.0))
    longer = min(600.0, short * 10 ** rng.uniform(2, 4))
    share = rng.uniform(0.01, 0.2)
    return Mixture(((1 - share, _lognormal(rng, short, 0.3)), (share, _lognormal(rng, longer, 0.3))))


def _pool(rng: random.Random, peak_slots: float, durations: float, *, initial: int | None = None) -> Workers:
    """A pool with room above ``peak_slots`` busy slots; stop timeout above the p99 duration."""
    concurrency = rng.choice((1, 2, 4, 8))
    need = max(1, math.ceil(peak_slots / concurrency))
    high = max(8, math.ceil(need * rng.uniform(1.6, 3.0)))
    low = rng.choice((0, 1, 1, 2))
    return Workers(
        concurrency=concurrency, cold_start=rng.choice(COLD_STARTS), min=low, max=high,
        initial=max(low, min(high, initial if initial is not None else low)),
        stop_timeout=max(60.0, 3 * durations), cpu_per_slot=0.05, cpu_idle=0.02, cpu_bound=False)


def _trace(name: str, rng: random.Random, seed: int, duration: float, target: float, workers: Workers,
           sources: tuple[Source, ...], dependency: SharedDependency | None = None, description: str = "") -> Trace:
    return Trace(name=name, description=description, seed=seed, duration=duration,
                 tick_interval=rng.choice(TICKS), target_age=target, workers=workers, sources=sources,
                 dependency=dependency)


def heavy_tail(rng: random.Random, seed: int) -> Trace:
    duration = rng.choice((1200.0, 1800.0))
    dist = _heavy(rng)
    peak = min(rng.uniform(10, 120) / dist.mean, MAX_RATE)
    peak_slots = peak * dist.mean
    if rng.random() < 0.5:
        pattern: Steady | Diurnal = Steady(peak, 0.0, duration)
    else:
        pattern = Diurnal(peak * rng.uniform(0.1, 0.4), peak, duration * rng.uniform(0.5, 1.0), 0.0, 0.0, duration)
    workers = _pool(rng, peak_slots, _p99(dist))
    target = rng.choice((30.0, 60.0, 120.0))
    return _trace(f"heavy_tail-{seed}", rng, seed, duration, target, workers,
                  (Source(pattern, dist, 0.0, "jobs"),), description=f"{type(dist).__name__} durations")


def two_class(rng: random.Random, seed: int) -> Trace:
    duration = rng.choice((1200.0, 1800.0))
    dist = _two_class(rng)
    rate = min(rng.uniform(10, 150) / dist.mean, MAX_RATE)
    peak_slots = rate * dist.mean
    workers = _pool(rng, peak_slots, _p99(dist))
    target = rng.choice((30.0, 60.0))
    return _trace(f"two_class-{seed}", rng, seed, duration, target, workers,
                  (Source(Steady(rate, 0.0, duration), dist, 0.0, "jobs"),))


def diurnal(rng: random.Random, seed: int) -> Trace:
    duration = rng.choice((1800.0, 2400.0))
    dist = _heavy(rng) if rng.random() < 0.5 else _two_class(rng)
    peak = min(rng.uniform(15, 120) / dist.mean, MAX_RATE)
    peak_slots = peak * dist.mean
    base = peak * rng.uniform(0.05, 0.3)
    pattern = Diurnal(base, peak, duration * rng.uniform(0.4, 1.0), duration * rng.uniform(0, 0.5), 0.0, duration)
    workers = _pool(rng, peak_slots, _p99(dist))
    return _trace(f"diurnal-{seed}", rng, seed, duration, rng.choice((30.0, 60.0)), workers,
                  (Source(pattern, dist, 0.0, "jobs"),))


def _flash(rng: random.Random, seed: int, declared: bool) -> Trace:
    duration = 1800.0
    dist = _lognormal(rng, rng.choice((0.5, 1.0, 2.0)), rng.uniform(0.2, 0.8))
    concurrency = rng.choice((1, 2, 4))
    share = rng.uniform(0.3, 0.9)
    knee_workers = rng.randint(4, 30)  # where the dependency runs out
    capacity = float(knee_workers * concurrency) * share + rng.uniform(0, 5)
    request_load = capacity * rng.uniform(0.05, 0.3)
    capacity += request_load
    dependency = SharedDependency(
        name="db", capacity=capacity, per_job=1.0, share=share, overload_penalty=rng.uniform(0.2, 1.0),
        request_load=request_load, request_latency=0.01, declared=declared)
    trickle = min(knee_workers * concurrency * rng.uniform(0.05, 0.3) / dist.mean, MAX_RATE / 4)
    # Mostly a crowd the ceiling can serve within minutes; now and then one it cannot.
    crowd_rate = min(knee_workers * concurrency * rng.uniform(0.6, 1.6) / dist.mean, MAX_RATE)
    start = rng.uniform(200, 600)
    length = rng.uniform(60, 300)
    sources = (Source(Steady(trickle, 0.0, duration), dist, 0.0, "trickle"),
               Source(Steady(crowd_rate, start, start + length), dist, 0.0, "crowd"))
    workers = Workers(concurrency=concurrency, cold_start=rng.choice(COLD_STARTS), min=1,
                      max=max(12, int(knee_workers * rng.uniform(2.5, 4))), initial=1,
                      stop_timeout=max(60.0, 3 * _p99(dist)), cpu_per_slot=0.05, cpu_idle=0.02, cpu_bound=False)
    name = "flash_crowd" if declared else "hidden_ceiling"
    return _trace(f"{name}-{seed}", rng, seed, duration, rng.choice((30.0, 60.0, 120.0)), workers, sources,
                  dependency, description=f"ceiling at about {knee_workers} workers")


def flash_crowd(rng: random.Random, seed: int) -> Trace:
    return _flash(rng, seed, declared=True)


def hidden_ceiling(rng: random.Random, seed: int) -> Trace:
    return _flash(rng, seed, declared=False)


def scheduled(rng: random.Random, seed: int) -> Trace:
    duration = 1800.0
    dist = _heavy(rng) if rng.random() < 0.5 else _lognormal(rng, rng.choice((0.5, 2.0, 10.0)), 0.4)
    trickle = min(rng.uniform(1, 10) / dist.mean, MAX_RATE / 4)
    trickle_slots = trickle * dist.mean
    sources = [Source(Steady(trickle, 0.0, duration), dist, 0.0, "trickle")]
    target = rng.choice((30.0, 60.0, 120.0))
    peak_slots = trickle_slots
    for index in range(rng.randint(1, 4)):
        jobs = rng.randint(50, 2000)
        delay = rng.uniform(60, 600)
        at = rng.uniform(0, duration - delay - 120)
        sources.append(Source(Burst(at, jobs, rng.uniform(0, 10)), dist, delay, f"batch {index + 1}"))
        peak_slots = max(peak_slots, trickle_slots + jobs * dist.mean / target)
    workers = _pool(rng, peak_slots, _p99(dist))
    return _trace(f"scheduled-{seed}", rng, seed, duration, target, workers, tuple(sources))


def square_wave(rng: random.Random, seed: int) -> Trace:
    duration = 1800.0
    dist = _lognormal(rng, rng.choice((0.1, 0.5, 1.0, 2.0)), rng.uniform(0.2, 1.0))
    high_slots = min(rng.uniform(10, 80), MAX_RATE * dist.mean)
    low_slots = high_slots * rng.uniform(0.0, 0.2)
    period = rng.uniform(60, 600)
    sources = []
    t = 0.0
    while t < duration:
        end = min(duration, t + period / 2)
        sources.append(Source(Steady(high_slots / dist.mean, t, end), dist, 0.0, "high"))
        if low_slots > 0 and end < duration:
            sources.append(Source(Steady(low_slots / dist.mean, end, min(duration, end + period / 2)), dist, 0.0,
                                  "low"))
        t += period
    workers = _pool(rng, high_slots, _p99(dist))
    return _trace(f"square_wave-{seed}", rng, seed, duration, rng.choice((10.0, 15.0, 30.0)), workers,
                  tuple(sources), description=f"period {period:.0f}s")


def quota(rng: random.Random, seed: int) -> Trace:
    duration = 1800.0
    dist = _lognormal(rng, rng.choice((0.2, 1.0, 3.0)), rng.uniform(0.2, 1.0))
    concurrency = rng.choice((1, 2, 4, 8))
    share = rng.uniform(0.3, 1.0)
    peak_slots = min(rng.uniform(20, 120), MAX_RATE * dist.mean)
    capacity = peak_slots * share * rng.uniform(0.4, 0.9)  # less than the peak needs
    request_load = capacity * rng.uniform(0.05, 0.3)
    dependency = SharedDependency(
        name="db", capacity=capacity + request_load, per_job=1.0, share=share,
        overload_penalty=rng.uniform(0.2, 1.0), request_load=request_load, request_latency=0.01, declared=True)
    peak = peak_slots / dist.mean
    pattern = Diurnal(peak * rng.uniform(0.1, 0.4), peak, duration * rng.uniform(0.5, 1.0), 0.0, 0.0, duration)
    workers = Workers(concurrency=concurrency, cold_start=rng.choice(COLD_STARTS), min=1,
                      max=max(8, math.ceil(peak_slots / concurrency * 2)), initial=1,
                      stop_timeout=max(60.0, 3 * _p99(dist)), cpu_per_slot=0.05, cpu_idle=0.02, cpu_bound=False)
    return _trace(f"quota-{seed}", rng, seed, duration, rng.choice((30.0, 60.0, 120.0)), workers,
                  (Source(pattern, dist, 0.0, "jobs"),), dependency)


def slow_bursts(rng: random.Random, seed: int) -> Trace:
    duration = 1800.0
    short = _lognormal(rng, rng.choice((0.05, 0.2, 0.5)), 0.5)
    slow = _lognormal(rng, rng.uniform(10, 60), rng.uniform(0.1, 0.5))
    sources = [Source(Steady(min(rng.uniform(1, 8) / short.mean, MAX_RATE / 4), 0.0, duration), short, 0.0,
                      "trickle")]
    every = rng.uniform(120, 400)
    at, index, biggest = rng.uniform(30, every), 0, 0
    while at < duration - 60:
        jobs = rng.randint(50, 300)
        biggest = max(biggest, jobs)
        sources.append(Source(Burst(at, jobs, rng.uniform(0, 20)), slow, 0.0, f"slow burst {index + 1}"))
        at += every * rng.uniform(0.7, 1.3)
        index += 1
    target = rng.choice((30.0, 60.0, 120.0))
    workers = _pool(rng, biggest * slow.mean / (target + slow.mean), _p99(slow))
    return _trace(f"slow_bursts-{seed}", rng, seed, duration, target, workers, tuple(sources))


def _p99(dist: Distribution) -> float:
    """The 99th percentile of ``dist`` (of its longest component, for a mixture)."""
    if isinstance(dist, Constant):
        return dist.value
    if isinstance(dist, LogNormal):
        return dist.p99
    if isinstance(dist, Exponential):
        return dist.mean * math.log(100)
    return max(_p99(component) for _, component in dist.components)


FAMILIES: dict[str, Callable[[random.Random, int], Trace]] = {
    "heavy_tail": heavy_tail, "two_class": two_class, "diurnal": diurnal, "flash_crowd": flash_crowd,
    "hidden_ceiling": hidden_ceiling, "scheduled": scheduled, "square_wave": square_wave, "quota": quota,
    "slow_bursts": slow_bursts,
}


def draw(family: str, seed: int) -> Trace:
    """The workload of ``family`` drawn with ``seed`` (its trace seed is ``seed`` too)."""
    return FAMILIES[family](random.Random(f"{family}:{seed}"), seed)


def sample(count: int, seed: int = 0, families: tuple[str, ...] | None = None) -> list[Trace]:
    """``count`` workloads, the families taken in turn, each drawn with its own seed from ``seed``."""
    names = families or tuple(FAMILIES)
    rng = random.Random(f"sample:{seed}")
    return [draw(names[i % len(names)], rng.randrange(1_000_000)) for i in range(count)]
