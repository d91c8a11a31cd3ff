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

An undeclared dependency shows first as job durations rising with the number
of busy workers, before the completion rate flattens.  So every decision
also records, while jobs wait (every slot busy, so busy workers / p50 is
what they can do), the p50 duration per busy worker count -- from the first
tick of a backlog, not after ``settle_time``, and from the jobs that finished
in the last few seconds (``recent_duration_p50``) as soon as enough did; a count whose jobs take more than ``EARLY_DURATION_RISE`` longer than
at a smaller count, and whose workers together complete less than
``EARLY_EFFICIENCY`` of what the extra workers would add at the smaller
count's pace (workers / p50, Little's law), holds the pool at the smaller
count at once -- without waiting for ``settle_time`` -- and the re-probe works
as above.
"""

from __future__ import annotations

from dataclasses import replace

from .config import KneeConfig
from .types import KneeState, Observation, ThroughputSample

# The duration rule's thresholds: the workers added past a smaller count must
# add at least this share of what they would at that count's pace...
EARLY_EFFICIENCY = 0.5
# ...judged only when the p50 rose by more than this (a p50 over one rate
# window moves by a few tens of percent with the job mix alone).
EARLY_DURATION_RISE = 0.5
# ...and only from a p50 over at least this many completions.
EARLY_MIN_COMPLETIONS = 100

# The throughput rule samples only a rate window with at least this many
# completions: the p50 of a dozen minute-long jobs swings by more than
# ``max_duration_rise`` from one window to the next.
MIN_COMPLETIONS = 30


def duration_knee(samples: tuple[ThroughputSample, ...], sample: ThroughputSample, config: KneeConfig) -> int | None:
    """The count to hold at when ``sample``'s durations show a hidden ceiling (None: they do not).

    Compares ``sample`` (n workers, p50 D(n)) with every smaller count m:
    the pace of n workers is n / D(n); at m's pace the n - m extra workers
    would add (n - m) / D(m).  When D(n) > D(m) x (1 + EARLY_DURATION_RISE)
    and the gain n / D(n) - m / D(m) is below ``EARLY_EFFICIENCY`` of that,
    the ceiling lies between: hold at the best such m (the most jobs/s).
    """
    worse = []
    for smaller in samples:
        if smaller.workers >= sample.workers or smaller.duration_p50 <= 0:
            continue
        if sample.duration_p50 <= smaller.duration_p50 * (1 + EARLY_DURATION_RISE):
            continue
        gain = sample.workers / sample.duration_p50 - smaller.workers / smaller.duration_p50
        extra = (sample.workers - smaller.workers) / smaller.duration_p50
        if gain < EARLY_EFFICIENCY * extra:
            worse.append(smaller)
    if not worse:
        return None
    return max(worse, key=lambda kept: (kept.workers / kept.duration_p50, -kept.workers)).workers


def _durations_now(metrics, concurrency: int, busy: float, recent_busy: float | None) -> tuple[int, float] | None:
    """(busy workers, p50 duration) for the duration rule; None when too few jobs finished to tell.

    The jobs that finished in the last few seconds ran with about as many
    workers as are busy now: their p50, with the busy count of the same
    seconds, is the first to show durations rising.  The p50 of the whole
    sample (up to minutes of completions) is the fallback while too few
    jobs finished recently.
    """
    if (recent_busy is not None and metrics.recent_duration_p50
            and metrics.recent_completions >= EARLY_MIN_COMPLETIONS):
        workers, p50 = round(recent_busy / concurrency), metrics.recent_duration_p50
    else:
        finished = (metrics.completion_rate or 0.0) * (metrics.rate_window or 0.0)
        if finished < EARLY_MIN_COMPLETIONS:
            return None
        workers, p50 = round(busy / concurrency), metrics.duration_p50
    if not p50 or workers < 1:
        return None
    return workers, p50


def update_knee(state: KneeState, obs: Observation, config: KneeConfig, now: float, busy: float,
                recent_busy: float | None = None) -> KneeState:
    """The knee state after observing ``obs`` at ``now``.

    ``busy`` is the mean number of running jobs over the rate window;
    ``recent_busy`` over the metrics' recent window.
    """
    metrics = obs.metrics
    if not config.enabled or metrics is None:
        return state
    if state.held_since is not None and now - state.held_since > config.sample_max_age:
        newest = max((kept.at for kept in state.samples), default=None)
        if newest is None or now - newest > config.sample_max_age:
            state = replace(state, held_at=None, held_since=None)
    durations_now = _durations_now(metrics, obs.concurrency, busy, recent_busy)
    if metrics.runnable_depth > 0 and durations_now is not None:
        workers, p50 = durations_now
        observed = ThroughputSample(workers, metrics.completion_rate or 0.0, p50, now)
        kept = tuple(d for d in state.durations if d.workers != workers and now - d.at <= config.sample_max_age)
        state = replace(state, durations=tuple(sorted(kept + (observed,))))
        if state.held_at is None or workers > state.held_at:
            # Found early, or lowered when a count above the held one shows its durations rising.
            early = duration_knee(kept, observed, config)
            if early is not None and (state.held_at is None or early < state.held_at or workers > state.held_at):
                state = replace(state, held_at=early, held_since=now)
    if metrics.runnable_depth == 0:
        return replace(state, backlog_since=None)
    if state.backlog_since is None:
        return replace(state, backlog_since=now)
    if now - state.backlog_since < config.settle_time or not metrics.completion_rate or not metrics.duration_p50:
        return state
    if metrics.completion_rate * (metrics.rate_window or 0.0) < MIN_COMPLETIONS:
        return state  # a p50 of a handful of long jobs is noise, not a knee
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
