"""Ceiling discovery: find the worker count past which more workers stop helping.

Some ceilings are declared (a dependency's capacity); others are found only by
trying.  While the pool is saturated -- it has had a backlog for at least
``settle_time``, so its completion rate measures what it can do rather than
what arrives -- every decision samples the completion rate and the p50
duration against the number of workers that were busy on average over the
rate window (both averaged over the same window, so a ramp does not skew the
pair).  A sample at ``n`` workers that completes less than
``min_throughput_gain`` more than the best sample at fewer workers, while its
jobs take more than ``max_duration_rise`` longer, shows that the extra workers
only queue on something shared: the pool is held at that best count (the
knee).  ``reprobe_interval`` seconds later it may try one more worker: a
sample there that does better moves the knee up one and the next step may be
tried at once; one that does not confirms the knee for another interval.  A
knee with no sample for ``sample_max_age`` is forgotten: whatever was shared
may have changed since.
"""

from __future__ import annotations

from dataclasses import replace

from .config import KneeConfig
from .types import KneeState, Observation, ThroughputSample


def update_knee(state: KneeState, obs: Observation, config: KneeConfig, now: float, busy: float) -> KneeState:
    """The knee state after observing ``obs`` at ``now``.

    ``busy`` is the mean number of running jobs over the rate window.
    """
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
    if now - state.backlog_since < config.settle_time or not metrics.completion_rate or not metrics.duration_p50:
        return state
    workers = round(busy / obs.concurrency)
    if workers < 1:
        return state
    sample = ThroughputSample(workers, metrics.completion_rate, metrics.duration_p50, now)
    fresh = tuple(kept for kept in state.samples if kept.workers != workers and now - kept.at <= config.sample_max_age)
    state = replace(state, samples=tuple(sorted(fresh + (sample,))))
    smaller = [kept for kept in fresh if kept.workers < workers]
    if not smaller:
        return state
    best = max(smaller, key=lambda kept: (kept.completion_rate, -kept.workers))
    gain = sample.completion_rate / best.completion_rate - 1
    rise = sample.duration_p50 / best.duration_p50 - 1
    if gain < config.min_throughput_gain and rise > config.max_duration_rise:
        return replace(state, held_at=best.workers, held_since=now)
    if state.held_at is not None and workers > state.held_at and gain >= config.min_throughput_gain:
        # The probe helped: hold one higher, and let the next step be tried straight away.
        return replace(state, held_at=workers, held_since=now - config.reprobe_interval)
    return state


def knee_cap(state: KneeState, config: KneeConfig, now: float) -> int | None:
    """The knee as a cap: the held count, or one more once a re-probe is due; None if unknown."""
    if not config.enabled or state.held_at is None or state.held_since is None:
        return None
    if now - state.held_since >= config.reprobe_interval:
        return state.held_at + 1
    return state.held_at
