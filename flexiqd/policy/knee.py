"""Ceiling discovery: find the worker count past which more workers stop adding throughput.

Some ceilings are declared (a dependency's capacity); others are found only by
trying.  A ceiling here is a measurement, never an inference from durations
alone (they change with the job mix):

- While the pool is saturated (at least as many jobs wait as run, so its
  completion rate measures what it can do rather than what arrives), each decision samples
  the completion rate against the number of workers that were busy on
  average over the same span (``signals.busy_and_rate``): for short jobs over
  the last few seconds, as soon as a backlog has lasted that long; for long
  ones over the rate window, once the backlog has lasted ``settle_time`` and
  the busy count held steady (a ramp's completions lag its starts).
- A sample at ``n`` workers whose completions rose less than half as much as
  the extra workers would add at a smaller count ``m``'s pace (and less than
  ``min_throughput_gain``, if that is more) -- by more than the counting noise
  of either -- while the jobs that finished took more than
  ``max_duration_rise`` longer (their p50: a slower dependency slows every
  job; a batch of slow jobs among quick ones cuts completions before any of
  them finishes), shows that the extra workers only queue on something shared.  The pool is then held at the count
  of the best throughput measured, never below it (the knee).
- ``reprobe_interval`` seconds later it may try a quarter more workers (at
  least one); while the oldest job is over its target, as soon as a new
  sample can settle (twice ``settle_time``).  A sample there that does better
  moves the knee up to it, and the next step may be tried at once; one that
  does not confirms the knee.  A knee with no sample for ``sample_max_age`` is
  forgotten: whatever was shared may have changed since.

Completions measure capacity only while the jobs are alike: where their
durations spread widely (p95 over ``MAX_SPREAD`` x p50) a batch of slow jobs
among quick ones cuts completions as a ceiling would, so no knee is looked
for there (a declared dependency still caps).  Without any shared dependency
completions keep rising with workers, so no knee is found, and a false one
(noise) is re-probed and lifted.
"""

from __future__ import annotations

import math
from dataclasses import replace

from .config import KneeConfig
from .signals import busy_and_rate
from .types import KneeState, LoadSample, Observation, ThroughputSample

# A sample counts only over a rate window with at least this many completions: the
# rate of a few dozen long jobs swings by more than any gain worth measuring.
MIN_COMPLETIONS = 50

# The busy count is steady when its lowest sample in the window is at least this
# share of its highest.
STEADY_SHARE = 0.85

# How many standard deviations of the completion counts (Poisson) a shortfall
# must exceed to count as evidence.
NOISE_SIGMAS = 2.0

# Extra workers that add less than this share of what they would at a smaller
# count's pace show a ceiling.
EFFICIENCY = 0.5

# Jobs whose p95 is more than this many times their p50 are too unlike each other for a
# completion count to tell a ceiling from a change of mix: no knee is looked for.
MAX_SPREAD = 4.0

# Over the recent window, jobs must be this many times shorter than the window: a
# ramp's completions lag its starts by about one duration.
LAG_SHARE = 5.0

# Over the recent window, the finished jobs' p50 must rise by at least this much.
FAST_RISE = 0.5

# A re-probe tries this share more workers than the knee (at least one more).
REPROBE_STEP = 0.25


def steady(load: tuple[LoadSample, ...], window: float) -> bool:
    """Whether the running count stayed within ``STEADY_SHARE`` over the last ``window`` seconds."""
    now = load[-1].at
    running = [s.running for s in load if s.at >= now - window]
    return len(running) >= 2 and min(running) >= STEADY_SHARE * max(running) > 0


def _noise(rate: float, window: float) -> float:
    """One standard deviation of a completion rate counted over ``window`` seconds."""
    return math.sqrt(max(rate, 0.0) * window) / window


def ceiling_shown(sample: ThroughputSample, smaller: ThroughputSample, config: KneeConfig, window: float,
                  rise: float | None = None) -> bool:
    """Whether ``sample`` (more workers) shows no throughput gain over ``smaller``, beyond noise,
    while its finished jobs took more than ``rise`` (default ``config.max_duration_rise``) longer."""
    margin = NOISE_SIGMAS * math.hypot(_noise(sample.completion_rate, window), _noise(smaller.completion_rate, window))
    expected = max(config.min_throughput_gain, EFFICIENCY * (sample.workers - smaller.workers) / smaller.workers)
    gained = sample.completion_rate - smaller.completion_rate * (1 + expected)
    rise = config.max_duration_rise if rise is None else rise
    slower = sample.duration_p50 > smaller.duration_p50 * (1 + rise)
    return gained + margin < 0 and slower


def best(samples: tuple[ThroughputSample, ...], gain: float) -> ThroughputSample:
    """The fewest workers that complete within ``gain`` of the most completions measured
    (more workers that add less than that are not better)."""
    most = max(kept.completion_rate for kept in samples)
    return min((kept for kept in samples if kept.completion_rate * (1 + gain) >= most), key=lambda kept: kept.workers)


def saturated(load: tuple[LoadSample, ...], window: float) -> bool:
    """Whether at least as many jobs waited as ran at every tick of the last ``window`` seconds.

    Only then does the completion rate measure what the workers can do: a
    pool that keeps up with its arrivals completes what arrives, whatever its
    size, and a few jobs waiting now and then do not make it the bottleneck.
    """
    now = load[-1].at
    return all(s.runnable >= max(1, s.running) for s in load if s.at >= now - window)


def homogeneous(metrics) -> bool:
    """Whether the jobs are alike enough (p95 within ``MAX_SPREAD`` x p50, and the jobs in flight
    not far older than the finished ones took) for completions to measure capacity: where
    durations spread widely, a change of the mix (a batch of slow jobs among quick ones) cuts
    completions as a ceiling would, with no ceiling at all."""
    p50, p95 = metrics.duration_p50, metrics.duration_p95
    if not (p50 and p95) or p95 > MAX_SPREAD * p50:
        return False
    # Jobs in flight that have run far longer than the finished ones took are a new mix
    # (slow jobs that have not finished yet), not a slower dependency.
    return metrics.running_age_mean is None or metrics.running_age_mean <= MAX_SPREAD * p95


def _measure(state: KneeState, obs: Observation, config: KneeConfig, now: float,
             load: tuple[LoadSample, ...]) -> tuple[ThroughputSample, float] | None:
    """What the saturated pool completes now, per busy worker count, and the span its completions
    were counted over; None when it cannot tell yet.

    Short jobs are measured over the store's recent window (the last few
    seconds) as soon as the backlog has lasted that long, so a ceiling shows
    while a burst is still being answered; a ramp's completions lag its starts
    by about one job duration, which must then be short against the window
    (or the busy count steady over it).
    Longer jobs are measured over the rate window, once the backlog has lasted
    ``settle_time`` and the busy count held steady over the window.
    """
    metrics = obs.metrics
    assert metrics is not None and state.backlog_since is not None
    if not homogeneous(metrics):
        return None
    backlog_for = now - state.backlog_since
    recent = metrics.recent_window
    if recent and backlog_for >= recent and saturated(load, recent) and metrics.recent_completions >= MIN_COMPLETIONS:
        measured = busy_and_rate(load, recent)
        rate = metrics.recent_completions / recent
        if measured is not None and measured[0] > 0 and metrics.recent_duration_p50 and (
                measured[0] / rate * LAG_SHARE <= recent or steady(load, recent)):
            return _sample(measured[0], rate, metrics.recent_duration_p50, obs.concurrency, now, recent)
    window = metrics.rate_window or 0.0
    if not window or backlog_for < max(config.settle_time, window) or not steady(load, window):
        return None
    if not saturated(load, window):
        return None
    measured = busy_and_rate(load, window, window)
    if measured is None or measured[1] * window < MIN_COMPLETIONS or not metrics.duration_p50:
        return None
    return _sample(measured[0], measured[1], metrics.duration_p50, obs.concurrency, now, window)


def _sample(busy: float, rate: float, p50: float, concurrency: int, now: float,
            window: float) -> tuple[ThroughputSample, float] | None:
    workers = round(busy / concurrency)
    if workers < 1 or rate <= 0:
        return None
    return ThroughputSample(workers, rate, p50, now), window


def update_knee(state: KneeState, obs: Observation, config: KneeConfig, now: float,
                load: tuple[LoadSample, ...]) -> KneeState:
    """The knee state after observing ``obs`` at ``now``; ``load`` ends with this tick's sample."""
    metrics = obs.metrics
    if not config.enabled or metrics is None:
        return state
    if state.held_since is not None and now - state.held_since > config.sample_max_age:
        newest = max((kept.at for kept in state.samples), default=None)
        if newest is None or now - newest > config.sample_max_age:
            state = replace(state, held_at=None, held_since=None)
    if metrics.runnable_depth == 0:
        return replace(state, backlog_since=None)
    if state.backlog_since is None:
        return replace(state, backlog_since=now)
    measured = _measure(state, obs, config, now, load)
    if measured is None:
        return state
    sample, window = measured
    workers = sample.workers
    fresh = tuple(kept for kept in state.samples if kept.workers != workers and now - kept.at <= config.sample_max_age)
    samples = tuple(sorted(fresh + (sample,)))
    state = replace(state, samples=samples)
    smaller = [kept for kept in fresh if kept.workers < workers]
    # A p50 of the last few seconds' completions moves by a fifth with chance alone.
    rise = config.max_duration_rise if window == metrics.rate_window else max(config.max_duration_rise, FAST_RISE)
    if any(ceiling_shown(sample, kept, config, window, rise) for kept in smaller):
        top = best(tuple(kept for kept in samples if kept.workers <= workers), config.min_throughput_gain)
        if state.held_at == top.workers and workers <= state.held_at:
            return state  # the same knee seen again from below: its re-probe stays due on time
        return replace(state, held_at=top.workers, held_since=now)
    if state.held_at is not None and workers > state.held_at and smaller:
        if sample.completion_rate > max(kept.completion_rate for kept in smaller) * (1 + config.min_throughput_gain):
            # The probe helped: hold there, and let the next step be tried straight away.
            return replace(state, held_at=workers, held_since=now - config.reprobe_interval)
    return state


def knee_cap(state: KneeState, config: KneeConfig, now: float, late: bool = False) -> int | None:
    """The knee as a cap: the held count, or a step more once a re-probe is due; None if unknown.

    ``late``: the oldest job is over its target -- a re-probe is due as soon as
    a sample at the new count can settle.
    """
    if not config.enabled or state.held_at is None or state.held_since is None:
        return None
    interval = min(config.reprobe_interval, 2 * config.settle_time) if late else config.reprobe_interval
    if now - state.held_since >= interval:
        return state.held_at + max(1, math.ceil(state.held_at * REPROBE_STEP))
    return state.held_at
