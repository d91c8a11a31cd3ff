"""Ceiling discovery: find the worker count past which more workers stop adding throughput.

Some ceilings are declared (a dependency's capacity); most are not, and are
found by measuring.  The evidence is throughput alone: the jobs completed per
second against the workers busy, whatever happens to the durations.  At a
ceiling durations stretch -- that is what a ceiling does -- so a longer p50
is no sign of a new job mix and no reason to doubt the count.

- A **sample** is the completion rate of a saturated pool (jobs waiting at
  every tick, its slots busy) at a steady count of working workers, counted
  from the store's per-second completions (``PoolMetrics.completion_series``)
  once the jobs started before the count settled have had the time to end
  (one mean duration, Little's law).
- The pool grows in **probing steps**.  While a backlog waits and the count
  now can be measured within the probe budget (a share of the age target),
  growth waits for its sample; a step from ``n`` to ``m`` workers is then
  judged on the sample at ``m``: it **pays** when completions rose by at least
  ``EFFICIENCY`` of what the extra workers would add at ``n``'s pace, and then
  the next step may double the pool (from one or two workers, quadruple it:
  their counts are slow, and a larger step's verdict needs fewer completions).
  One that does not (beyond the counting noise: the per-second counts' own
  spread, at least a Poisson count's) shows
  the extra workers only queue on something shared: the pool is held at the
  count of the best measured throughput (the knee: the fewest
  workers that no larger count beats by ``min_throughput_gain`` beyond the
  noise of both counts) and shrinks back to it.  Steps are coarse, and
  throughput peaks where the capacity runs out: the count just past it completes
  within a per cent of the one just under it, so the best count measured is as
  often over the capacity as under it.  The knee is then **trimmed**: the count
  one fewer (none measured below it: its half, judged on a count as long as the
  step from it would need) is held and measured (counted until its noise is
  within half a worker's pace, or as long as a step's verdict), and kept while
  it completes as much as the best within the counting noise -- then one fewer
  again; the first that clearly does not ends the trim, and the fewest that did
  is held.  When the step that reached the best clearly added less than its
  workers' share, the ceiling lies inside it, and the first count tried is where
  the smaller count's pace per worker reaches the best rate (``flattened_at``).
  A knee held again (a re-probe's verdict) next to the count a trim found short
  is not trimmed again.
- A step whose verdict stays **unclear** (counted as long as it may be, neither
  paid nor short) lets growth go on, and the next step is judged against the
  count the unclear one started from: small steps (the tenth more workers the
  age signal asks for) each stay within the counting noise, and their gains
  add up until one is clear.  One that added less than a quarter of its share
  (``added_nothing``: beyond one standard error, on counts of at least
  ``FLAT_MIN_COMPLETIONS`` each) shows a ceiling all the same.  A step past the
  reach of that count (judged against its own start) shows a ceiling too when it
  clearly falls short of that count (``shows_ceiling_since_unclear``): shortfalls
  add up as gains do.
- Growth **up to a count already measured** without a ceiling (within
  ``sample_max_age``: a count that clearly paid over a smaller one, and that no
  smaller one shows a ceiling in) is not probed again: the next backlog of a load
  that comes and goes starts what it needs at once, and the steps begin past it.
- A step is judged against the count it starts from, so growth waits (within
  the probe budget) until that count has ``START_SHARE`` of the completions the
  step's verdict needs: a second's count of a slow pace cannot show that a step
  added nothing.
- Where a step cannot be judged within the budget (long jobs, few
  completions) growth is not held: the safety net and the signals size the
  pool, and samples taken later at steady counts still show a ceiling.  Nor
  does growth wait at a count whose first count cannot be had within the budget
  (``count_fits``: one worker of 3 s jobs needs half a minute for ten) -- judged
  on the count's own completions once it has some (``own_duration``: the store's
  durations may be another count's), before that on jobs lasting at least what
  those in flight have run, and not before the backlog's first tick
  has passed -- a whole tick, from the first decision a worker is up to count
  it (new work wakes the loop between ticks).  The first count is then taken at
  the fewest workers whose count fits once they have started (``fitting_count``);
  only where none does (jobs as long as the budget) does growth go on uncounted:
  a pool that jumps uncounted has no smaller count to compare with.  A backlog
  that would outlast the age target even at the most workers the pool may have
  gives its first count the same share of that time instead (``crowd_budget``), up
  to the age target: a count at fewer workers, before they queue on whatever is shared.
- A pool that reached **the most it may have** without a count (it grew past its
  first count: jobs too long to count in time, a stalled server, unlike durations)
  has nothing smaller to compare with, and more workers are not allowed: when its
  oldest job is late there all the same, it is compared **downwards** (``descent``).
  Once its count at the maximum is had, half the workers are counted -- once at most a
  quarter of the half is still stopping, one of the larger count's mean durations on, less
  a job for each worker still stopping then -- and the pair is judged as a step from the
  half would be.  When the maximum shows a ceiling over
  the half, the knee is held as after a step and searched below (a count with none
  measured under it tries its half); otherwise the pool goes back up (a maximum that
  clearly paid is not probed again).  A verdict still unclear when the count has run as
  long as a step's goes the way it leans.  Only where the half's count can be had within
  the probe budget, and once per ``sample_max_age``.
- Only **alike jobs** are counted: a change of mix cuts completions as a ceiling
  does.  A first count and a step from a fresh one, seconds apart, need the
  store's recent window alike (``alike_now``: p95 within ``MAX_SPREAD`` x p50,
  where the window spans a few jobs); counts compared minutes apart need the
  last minutes' alike (``homogeneous``), and those minutes span other counts.
- A knee is **re-probed** rarely and in small steps: ``reprobe_interval``
  seconds after it was found or confirmed (sooner, ``2 x settle_time`` and at
  most the age target, while the oldest job is late; twice as long after each
  re-probe that confirmed it) a quarter more workers (at least one) are tried,
  once the knee's own count is fresh (or a second interval has passed): the
  re-probe is a step from it, whatever the spread of the durations.  A step that
  pays shows the knee was not there: it is forgotten, and growth goes on in
  steps -- unless a count of more workers taken within ``settle_time`` shows the
  ceiling over the re-probe's count (``ceiling_above``): the knee is then held
  there.  One that does not pay confirms it.  One whose count stays unclear goes the
  way it leans: at or above what it must gain, the knee is forgotten; short of
  it, the knee stands until the next re-probe -- spaced as after a confirmation when
  the count leans flat (``leans_flat``: under ``FLAT_SHARE`` of its workers' share).
  A re-probe begun with no fresh count of the knee has no step: its count, once it
  clearly completes more than the knee's own, forgets the knee all the same.  A knee
  with no sample for ``sample_max_age`` is forgotten: whatever was shared may
  have changed since.
- A knee whose **own pace falls**: the pool saturated at the held count or above
  completing less than half what the held count did (``held_pace_fell``) says
  the jobs changed, not the dependency (at a ceiling the knee's count keeps its
  pace): the knee and its counts are forgotten.  So are they when a **step's jobs in
  flight age** past ``MIX_AGE_FACTOR`` x the step's growth x their age when it began
  (``jobs_changed``): a ceiling stretches each job by at most the step's growth, and
  jobs that age further are other jobs (a burst of slow ones among quick ones), whose
  count would read as a ceiling.  The step is not judged.
- A pool **held lean** (``lean``: fewer workers than its arrivals need, its backlog kept
  within the age target on purpose) is not counted while it holds or shrinks there, and
  its growth off the lean count (within two ticks) is neither a step nor capped: a kept
  backlog says nothing of what more workers would add.
- A pool that **other hosts of a fleet serve too** is not measured: the store
  counts their completions with this host's, against workers this host does not
  run.  Its evidence is forgotten; a fleet's shared ceiling is declared (a
  global dependency).

Pure: time is an argument, nothing is read or remembered outside ``KneeState``.
"""

from __future__ import annotations

import math
from dataclasses import replace

from .config import KneeConfig
from .types import KneeDescent, KneeProbe, KneeState, KneeTrim, LoadSample, Observation, ThroughputSample

# Extra workers that add less than this share of what they would at a smaller
# count's pace show a ceiling; at least this share, the step paid.
EFFICIENCY = 0.5

# A step whose count stays unclear as long as it may be counted, and that added less than this
# share of what its workers would at the smaller count's pace, shows a ceiling all the same.
FLAT_SHARE = 0.25

# ... judged only on counts of at least this many completions each (one standard error of 30 is
# under a fifth of the count).
FLAT_MIN_COMPLETIONS = 30

# How many standard deviations of the completion counts (Poisson) a shortfall
# must exceed to count as evidence of a ceiling.
NOISE_SIGMAS = 2.0

# A sample needs this many completions over at least this many whole seconds.
MIN_COMPLETIONS = 10
MIN_SPAN = 1

# Working slots at least this share busy: the workers are all at work.
BUSY_SHARE = 0.8

# Growth waits for a sample at most this share of the age target (and never when
# that is less than two ticks: a step could not be judged in time).
PROBE_BUDGET_SHARE = 0.4

# A re-probe tries this share more workers than the knee (at least one more).
REPROBE_STEP = 0.25

# A step's verdict counts at most this many completions (it waits no longer than its window).
MAX_VERDICT_COMPLETIONS = 400

# A step's count lasts at most this long (the store's series covers the recent window).
RECENT_WINDOW_CAP = 13.0

# A step that paid lets the next one go up to this many times the count.
STEP_GROWTH = 2.0

# ... and from a pool this small, this many times: a doubling's verdict needs 64 completions,
# a quadrupling's 29, and one or two workers of second-long jobs count 64 in half a minute.
SMALL_STEP_GROWTH = 4.0
SMALL_POOL = 2


def step_reach(workers: int) -> int:
    """The most workers a step from ``workers`` may reach."""
    return math.ceil(workers * (SMALL_STEP_GROWTH if workers <= SMALL_POOL else STEP_GROWTH))


# The count a step starts from needs this share of the completions the step's own count needs
# for its verdict (the step's count can run longer; a wait for more costs a whole second of
# a fast pace at every first step).
START_SHARE = 0.5

# A descent counts this share of the workers (rounded up) ...
DESCENT_SHARE = 0.5

# ... from when at most this share of that count is still stopping.
DESCENT_STOPPING_SHARE = 0.25


def steady_since(load: tuple[LoadSample, ...], slots_per_worker: int) -> float | None:
    """Since when the pool has been saturated at its current working count: jobs waiting and
    its slots busy at every sample (``load`` ends with this tick's).  None when it is not now."""
    if not load:
        return None
    current = load[-1].active

    def saturated(sample: LoadSample) -> bool:
        # At least as many jobs waiting as running: only then do completions measure what the
        # workers can do rather than what arrives.
        return (sample.active == current and sample.runnable >= max(1, sample.running)
                and sample.running >= BUSY_SHARE * current * slots_per_worker)

    return trailing_since(load, saturated) if current > 0 else None


def trailing_since(load: tuple[LoadSample, ...], holds) -> float | None:
    """The time of the first of the latest samples for which ``holds`` is true at every one
    (``load`` ends with this tick's); None when it is not true of this tick's."""
    since = None
    for sample in reversed(load):
        if not holds(sample):
            break
        since = sample.at
    return since


def completions_between(series: tuple[tuple[int, int], ...], start: float,
                        now: float) -> tuple[int, int, float] | None:
    """(completions, whole seconds, the variance of the per-second counts) from the first whole
    second at or after ``start`` to the last second that has ended by ``now``; None when no whole
    second lies between."""
    first, last = math.ceil(start), math.floor(now)
    if last - first < MIN_SPAN:
        return None
    by_second = dict(series)
    counts = [by_second.get(second, 0) for second in range(first, last)]
    mean = sum(counts) / len(counts)
    variance = sum((count - mean) ** 2 for count in counts) / max(1, len(counts) - 1)
    return sum(counts), len(counts), variance


def mean_duration(load: tuple[LoadSample, ...], metrics) -> float | None:
    """The jobs' mean duration by Little's law over the recent samples (running / completions) once
    they saw ``MIN_COMPLETIONS``, else their recent p50 (a burst's first seconds: the few jobs done
    over a window that mostly came before it would read as long ones); None before anything completed."""
    if metrics.recent_completions >= MIN_COMPLETIONS and metrics.recent_window:
        window = metrics.recent_window
        now = load[-1].at
        samples = [s for s in load if s.at > now - window]
        running = sum(s.running for s in samples) / len(samples)
        # Each sample stands for a tick; a pool younger than the window (made with its crowd, or
        # a daemon just restarted) has samples of a few seconds only, and its completions spread
        # over the whole window read 50 ms jobs as 1.5 s ones: counted over its samples' span.
        spacing = (now - samples[0].at) / (len(samples) - 1) if len(samples) > 1 else window
        covered = now - samples[0].at + spacing
        if covered >= window:
            rate = metrics.recent_completions / window
        else:
            counted = completions_between(metrics.completion_series, now - covered, now)
            rate = counted[0] / counted[1] if counted is not None and counted[0] >= MIN_COMPLETIONS else 0.0
        if rate > 0:
            return running / rate
    return metrics.recent_duration_p50 or metrics.duration_p50


# A count's own durations stand for the store's only when under this share of them: early in a
# count the short jobs end first (a heavy tail's first seconds read 0.6 x its mean, and a count
# taken that early took the claims' rush for a pace, then a ceiling that was not there), so only
# a wider gap says the store's were read at another count.
OWN_DURATION_SHARE = 0.5


def own_duration(load: tuple[LoadSample, ...], series: tuple[tuple[int, int], ...], now: float) -> float | None:
    """The jobs' mean duration at the pool's current count, from its own completions since it
    began at that count with jobs waiting (Little's law: the slots busy over those seconds per
    completion: its completions from the second it began in, over the time since it began);
    None before one ended or a tick passed.  Not over the whole of that second: a crowd's first
    look came 0.87 s into it, nothing had run before, and 0.2 s jobs read 0.41 s.  (A pool busy
    before it began has a few of that second's completions counted in: erring short, which only
    waits longer for a count, within the probe budget.)

    The store's durations were read at other counts: right after a crowd's pool of 30 on a
    half-CPU database, 0.2 s jobs read 2.5 s long at one worker, and its first count looked
    too slow to wait for -- the pool went straight to 30 and never had a count to compare."""
    if not load:
        return None
    current = load[-1].active
    since = trailing_since(load, lambda sample: sample.active == current and sample.runnable > 0)
    if since is None or since >= now:
        return None
    completions = sum(count for second, count in series if second >= math.floor(since))
    if completions <= 0:
        return None
    running = [sample.running for sample in load if sample.at >= since]
    return sum(running) / len(running) * (now - since) / completions


def probe_budget(obs: Observation, target_age: float) -> float:
    """How long growth may wait for a sample: a share of the age target, 0 when two ticks do not fit."""
    budget = PROBE_BUDGET_SHARE * target_age
    return budget if budget >= 2 * (obs.tick or 1.0) else 0.0


def crowd_budget(obs: Observation, target_age: float, duration: float, most: int | None) -> float:
    """``PROBE_BUDGET_SHARE`` of the time the backlog needs even at the most workers the pool may
    have (``duration`` a job, no ceiling), at most the age target itself; 0 where the probe
    budget is (two ticks do not fit) or the most is not known.  (Unbounded, 400 jobs of 10 s
    at a 10 s target waited 40 s for a count at 8 workers of 40.)"""
    metrics = obs.metrics
    if not probe_budget(obs, target_age) or most is None or duration <= 0 or metrics is None:
        return 0.0
    drain = (metrics.runnable_depth + metrics.running) * duration / max(1, most * obs.concurrency)
    return min(target_age, PROBE_BUDGET_SHARE * drain)


def counted_since(state: KneeState, since: float | None) -> bool:
    """Whether a count was taken since ``since`` (None: never)."""
    return since is not None and any(kept.at >= since for kept in state.samples)


def counted_below(state: KneeState, workers: int) -> bool:
    """Whether a count of fewer than ``workers`` workers is kept."""
    return any(kept.workers < workers for kept in state.samples)


def count_fits(obs: Observation, duration: float, budget: float) -> bool:
    """Whether a count of the pool at its current size can be had within ``budget`` seconds: its
    jobs (of ``duration``, 0 when unknown) started before the count end first, then its slots
    complete ``MIN_COMPLETIONS`` at one job a duration each.  One worker of 3 s jobs takes half a
    minute for its count: a crowd waiting for it waited out the whole budget at one worker."""
    counting = budget - duration - MIN_SPAN - (obs.tick or 1.0)
    if counting < 0:
        return False
    if duration <= 0:
        return True
    slots = max(1, obs.active * obs.concurrency)
    return slots * counting / duration >= MIN_COMPLETIONS


def fitting_count(obs: Observation, duration: float, budget: float) -> int | None:
    """The fewest workers (more than the pool has) whose count ``count_fits`` within ``budget``
    seconds, once they have started (a worker's start cost, else a tick); None when none does
    (jobs too long for the budget whatever the count)."""
    tick = obs.tick or 1.0
    counting = budget - duration - MIN_SPAN - tick - (obs.start_cost or tick)
    if counting <= 0 or duration <= 0:
        return None
    slots = math.ceil(MIN_COMPLETIONS * duration / counting)
    return max(obs.active + 1, math.ceil(slots / obs.concurrency))


def steady_count(obs: Observation, load: tuple[LoadSample, ...], now: float,
                 lag: float | None) -> tuple[int, int, float] | None:
    """``completions_between`` over the pool's current steady count, from ``lag`` seconds after the
    count settled (the jobs started before then have ended) and within the store's recent window;
    None when the pool is not saturated at a steady count, or workers stop."""
    metrics = obs.metrics
    since = steady_since(load, obs.concurrency)
    if metrics is None or since is None or lag is None or obs.draining:
        # While workers stop, their last jobs end among the others' (or not at all): a count
        # then is of neither size -- one taken right after a hold read half the rate.
        return None
    start = max(since + lag, math.floor(now) - (metrics.recent_window or 0.0) + 1)
    return completions_between(metrics.completion_series, start, now)


def measure(obs: Observation, load: tuple[LoadSample, ...], now: float,
            lag: float | None) -> ThroughputSample | None:
    """The completion rate of the pool at its current steady count (``steady_count``); None when
    it cannot tell."""
    counted = steady_count(obs, load, now, lag)
    if counted is None or counted[0] < MIN_COMPLETIONS:
        return None
    return counted_sample(load[-1].active, counted, lag, now)


def counted_sample(workers: int, counted: tuple[int, int, float], duration: float, now: float,
                   less: int = 0) -> ThroughputSample:
    """The sample of ``counted`` (``completions_between``'s completions, seconds and per-second
    variance) at ``workers``, ``less`` completions taken off."""
    completions, seconds, variance = counted
    completions -= less
    # Jobs of unlike lengths end in bunches: their counts spread wider than a Poisson count's.
    error = max(math.sqrt(completions), math.sqrt(variance * seconds)) / seconds
    return ThroughputSample(workers, completions / seconds, duration, now, completions, error)


def wanted_rate(smaller: ThroughputSample, workers: int, share: float = EFFICIENCY) -> float:
    """What ``workers`` must complete for their step from ``smaller`` to pay: ``share`` (by default
    ``EFFICIENCY``) of what the extra workers would add at ``smaller``'s pace."""
    return smaller.completion_rate * (1 + share * (workers - smaller.workers) / smaller.workers)


def counted_seconds(sample: ThroughputSample) -> float:
    """How long ``sample``'s count ran: its completions at its rate."""
    return sample.completions / max(sample.completion_rate, 1e-9)


def noise(sample: ThroughputSample) -> float:
    """``NOISE_SIGMAS`` standard errors of ``sample``'s completion rate: as its per-second counts
    spread, at least a Poisson count's of ``sample.completions``."""
    count = max(sample.completions, 1)
    poisson = math.sqrt(count) * sample.completion_rate / count
    return NOISE_SIGMAS * max(poisson, sample.error or 0.0)


# A held count whose pace falls below this share of the pace it was held at (the whole window's
# count, beyond its own noise) no longer describes the knee.  Half: a hold released by mistake
# costs one step that does not pay; a hold kept on other jobs' counts holds a late backlog
# for minutes.
PACE_FELL_SHARE = 0.5


# ... and only once jobs do end at the new pace (one is enough: two slots of minute-long jobs end
# about one in 15 s): a count with nothing ending is a dependency that hangs, not slower jobs.
MIN_FELL_COMPLETIONS = 1


def held_pace_fell(state: KneeState, obs: Observation, load: tuple[LoadSample, ...], now: float,
                   lag: float | None) -> bool:
    """Whether the pool, saturated at its held count or above (a re-probe), now completes far
    less than the held count did when it was held (the count since it settled, at most the
    store's recent window, beyond its own noise).

    At a ceiling the knee's own count keeps its pace, and a quarter more about keeps it too; jobs
    that changed do not (two slots held by 200 s jobs re-probing a knee found on 1 s ones
    could take no count at all, and stayed at 2 workers for 20 minutes).  Counted whatever
    the number of completions: slow jobs may end too rarely for a sample, and that rarity is the
    evidence."""
    if state.held_at is None or not state.held_rate or obs.active < state.held_at:
        return False
    counted = steady_count(obs, load, now, lag)
    if counted is None:
        return False
    completions, seconds, _ = counted
    if completions < MIN_FELL_COMPLETIONS:
        return False  # nothing ends: a dependency that hangs, not slower jobs -- more workers would not help
    highest = (completions + NOISE_SIGMAS * math.sqrt(completions)) / seconds
    return highest < PACE_FELL_SHARE * state.held_rate


def added_nothing(sample: ThroughputSample, start: ThroughputSample) -> bool:
    """Whether a step from ``start`` whose count stayed unclear as long as it could be counted
    added less than ``FLAT_SHARE`` of its workers' share, beyond one standard error of both counts
    -- each of at least ``FLAT_MIN_COMPLETIONS``: two counts of a dozen heavy-tailed jobs differ
    by a third within their noise, and such a verdict held a pool at 5 workers for ten minutes
    while its oldest job waited 400 s against a 120 s target."""
    if not counted_enough(sample, start):
        return False
    return sample.completion_rate + math.hypot(noise(sample), noise(start)) / NOISE_SIGMAS \
        < wanted_rate(start, sample.workers, FLAT_SHARE)


def counted_enough(sample: ThroughputSample, start: ThroughputSample) -> bool:
    """Whether both counts hold at least ``FLAT_MIN_COMPLETIONS`` jobs: enough to be far from luck."""
    return min(sample.completions, start.completions) >= FLAT_MIN_COMPLETIONS


def leans_flat(sample: ThroughputSample, start: ThroughputSample) -> bool:
    """Whether a step from ``start`` whose count stayed unclear added less than ``FLAT_SHARE`` of its
    workers' share by its counts alone, within their noise: not a verdict (``added_nothing``
    is), only the way it leans."""
    return sample.completion_rate < wanted_rate(start, sample.workers, FLAT_SHARE)


def clearly_paid(sample: ThroughputSample, smaller: ThroughputSample) -> bool:
    """Whether ``sample`` completes what its step from ``smaller`` must, beyond the counting noise."""
    margin = math.hypot(noise(sample), noise(smaller))
    return sample.completion_rate - margin >= wanted_rate(smaller, sample.workers)


def shows_ceiling(sample: ThroughputSample, smaller: ThroughputSample) -> bool:
    """Whether ``sample`` (more workers, measured apart from any step) falls short of what it
    should complete over ``smaller`` beyond the counting noise of both."""
    margin = math.hypot(noise(sample), noise(smaller))
    return sample.completion_rate + margin < wanted_rate(smaller, sample.workers)


# A step's jobs in flight may age this many times the step's own share of workers past those in
# flight when it began, before the step is read as counting other jobs.  A ceiling stretches each
# job by at most the step's share (the same completions, that many more slots holding them);
# twice that leaves room for the noise of a mean age.
MIX_AGE_FACTOR = 2.0


def jobs_changed(probe: KneeProbe, metrics) -> bool:
    """Whether the jobs in flight are far older than a ceiling would make those the step began on:
    ``MIX_AGE_FACTOR`` x the step's growth x their mean age then -- at least half their mean
    duration (two jobs just claimed read younger than the jobs they stand for)."""
    age = metrics.in_flight_age
    if probe.start_age is None or age is None:
        return False
    then = max(probe.start_age, probe.start.duration / 2)
    growth = probe.to_workers / max(probe.start.workers, 1)
    return then > 0 and age > MIX_AGE_FACTOR * growth * then


def shows_ceiling_since_unclear(state: KneeState, sample: ThroughputSample, probe: KneeProbe) -> bool:
    """Whether ``sample`` shows a ceiling over the count the unclear step before ``probe`` started
    from (a step past that one's reach is judged from its own start): the gains of unclear steps
    add up, and so do their shortfalls -- three steps of slow jobs from 12 workers to 37, each
    within its noise of the one before, completed 6.3 jobs/s against 12's 5.6.  Only on counts
    of at least ``FLAT_MIN_COMPLETIONS`` each, as ``added_nothing``: a step six times a lucky
    count of a dozen heavy-tailed jobs held a pool at one worker past its age target."""
    earlier = state.unclear_from
    return earlier is not None and earlier.workers < probe.start.workers \
        and counted_enough(sample, earlier) and shows_ceiling(sample, earlier)


def ceiling_above(state: KneeState, sample: ThroughputSample, config: KneeConfig,
                  now: float) -> ThroughputSample | None:
    """The count of the fewest workers more than ``sample``'s, counted within ``settle_time``,
    that shows a ceiling over it; None when none does (an older count may describe a
    dependency that has changed since)."""
    above = [kept for kept in state.samples
             if kept.workers > sample.workers and now - kept.at <= config.settle_time
             and shows_ceiling(kept, sample)]
    return min(above, key=lambda kept: kept.workers, default=None)


def verdict_completions(probe: KneeProbe) -> int:
    """Completions a step's sample should count for its verdict: enough that the counting noise is
    well inside the gain it must show (a small step needs more)."""
    return step_completions(probe.start.workers, probe.to_workers)


def step_completions(start: int, to_workers: int) -> int:
    """Completions each count of a step from ``start`` to ``to_workers`` workers should have."""
    # The full gain and the least that pays lie EFFICIENCY x gain apart; two sigmas of the
    # count must fit in that gap.
    gain = (to_workers - start) / start
    gap = EFFICIENCY * gain / (1 + gain)
    return max(MIN_COMPLETIONS, min(MAX_VERDICT_COMPLETIONS, math.ceil((NOISE_SIGMAS / gap) ** 2)))


def clearly_better(more: ThroughputSample, fewer: ThroughputSample, gain: float) -> bool:
    """Whether ``more`` completes more than ``gain`` above ``fewer`` beyond one standard error of
    both counts."""
    error = math.hypot(noise(more), noise(fewer)) / NOISE_SIGMAS
    return more.completion_rate - error > fewer.completion_rate * (1 + gain)


def best(samples: tuple[ThroughputSample, ...], gain: float) -> ThroughputSample:
    """The fewest workers that no count of more workers beats by more than ``gain``, beyond the
    counting noise (more workers that add less than that are not better: at a ceiling two short
    counts of the same rate differ by their noise, and the larger must not win on it)."""
    ordered = sorted(samples, key=lambda kept: kept.workers)
    for fewer in ordered:
        if not any(clearly_better(more, fewer, gain) for more in ordered if more.workers > fewer.workers):
            return fewer
    return ordered[-1]


def update_knee(state: KneeState, obs: Observation, config: KneeConfig, now: float,
                load: tuple[LoadSample, ...], target_age: float = 60.0, kept_lean: bool = False,
                most: int | None = None) -> KneeState:
    """The knee state after observing ``obs`` at ``now``; ``load`` ends with this tick's sample.
    ``kept_lean``: the pool holds or shrinks on the lean count (``lean``) this tick.
    ``most``: the most workers the pool may have (None: no descent)."""
    metrics = obs.metrics
    if obs.other_hosts:
        return KneeState()  # completions of workers this host does not run: nothing to compare
    if not config.enabled or metrics is None or not metrics.series_reported:
        return state  # without the store's per-second completions there is nothing to count
    if state.held_at is not None and state.held_since is not None and now - state.held_since > config.sample_max_age:
        newest = max((kept.at for kept in state.samples), default=None)
        if newest is None or now - newest > config.sample_max_age:
            state = _forgotten(state)
    if metrics.runnable_depth == 0:
        return replace(state, backlog_since=None, probe=None, waiting_since=None, unclear_from=None,
                       descent=None, count_at=None)
    if state.backlog_since is None and obs.active > 0:
        # The backlog's first look is the first tick a worker is up to count it: one that came
        # while the pool's only worker was still starting had its look then, with nothing to
        # count, and the next tick grew 1 -> 30 on the CPU-capped server uncounted.
        state = replace(state, backlog_since=now)
    if kept_lean:
        # A backlog kept on purpose: its count shows what the pool chose to run, not what
        # more workers would add (counted, a heavy tail's noise held a lean pool at a
        # false knee for three minutes).
        return replace(state, lean_at=now, probe=None, waiting_since=None, descent=None, count_at=None)
    if state.descent is not None:
        return _descending(state, obs, config, now, load, target_age)
    if state.probe is None:
        # A step begun: more workers asked for than a fresh sample's count.
        last = _latest(state.samples)
        # Only a step the knee let through (at most ``step_reach`` of the count): a larger jump
        # came from rules that found the jobs unlike (a new mix), and a count at it would be
        # judged against a pace of other jobs.
        # Nor one back to a count measured without a ceiling (``proven``) -- unless it re-probes
        # a knee: that step is judged whatever was measured before, and whatever the spread of
        # the durations (past a ceiling they stretch, and the knee's own count is fresh: nothing
        # else compares the re-probe's count as closely).
        measured = proven(state, config, now)
        if (last is not None and last.workers < obs.current <= step_reach(last.workers)
                and (measured is None or state.held_at is not None or obs.current > measured.workers)
                and fresh_count(last, obs, now, target_age) and (alike_now(metrics) or state.held_at is not None)
                and (state.held_at is None or last.workers >= state.held_at)
                and not lean_recently(state, obs, now)):
            start = step_base(state, last, obs.current)
            state = replace(state, probe=KneeProbe(start=start, to_workers=obs.current, since=now, lag=last.duration,
                                                   start_age=metrics.in_flight_age))
    probe = state.probe
    if probe is not None and jobs_changed(probe, metrics):
        # Other jobs than the step began on: its count would be of them, not of more workers (a
        # burst of 40 s jobs on a trickle of 0.5 s ones read as a ceiling at one worker, and
        # held the burst there a minute past its target), and so is every count kept.  Counted
        # afresh from here, as when a held count's pace falls.
        state, probe = _counted_afresh(state), None
    # Growing, no knee held: the durations read before the count began (at other counts) may
    # overstate this count's.  (A held count's are read at it.)
    own = own_duration(load, metrics.completion_series, now) if probe is None and state.held_at is None else None
    lag = probe.lag if probe is not None else _unless_far_shorter(mean_duration(load, metrics), own)
    sample = measure(obs, load, now, lag)
    if probe is None and held_pace_fell(state, obs, load, now, lag):
        # The held count itself now completes far less than when the knee was found: what the
        # jobs do has changed since (a batch of slow jobs among quick ones), and every count kept
        # describes other jobs.  Counted afresh from here, growth in steps again.
        return _counted_afresh(state)
    if sample is None:
        if probe is not None and _overdue(probe, obs, now, target_age):
            return replace(state, probe=None)  # no verdict in time: growth is not held for it
        # Jobs running, a backlog at least as deep, and no sample yet at this count: growth waits
        # for one (within the probe budget), whether or not every slot has claimed yet -- unless
        # the jobs are too long to be counted in time (before one ends: twice what they have run).
        # The jobs in flight last at least what they have run: a burst of 37 s jobs on a trickle
        # of 0.5 s ones read the trickle's durations, waited to count 68 workers that nothing
        # would end on in time, and its oldest job went 7 s past the target.
        in_flight = metrics.running_age_mean or 0.0
        expected = max(lag, in_flight) if lag is not None else 2 * in_flight
        # Nothing running yet while workers are up and jobs have just come (a crowd's first
        # tick, its oldest job at most two ticks old: a busy host claims late): the claims are
        # on their way, and the count at this size is a tick away.  Only that tick: workers that
        # do not claim by the next have something else holding them.
        claiming = (metrics.running == 0 and obs.active > 0 and state.backlog_since == now
                    and metrics.oldest_runnable_age <= 2 * (obs.tick or 1.0))
        # On the backlog's first look the count's own pace is a tick away, and the durations read
        # before it may be another count's: growth waits that tick (within the probe budget) --
        # the whole tick: new work wakes the loop, and a decision a third of a second after the
        # first look, two jobs claimed and none ended, read them as too slow to count and grew
        # 1 -> 30 on the CPU-capped server.
        budget = probe_budget(obs, target_age)
        first_look = (state.backlog_since is not None and now - state.backlog_since < (obs.tick or 1.0)
                      and budget > 0)
        # Whether the count fits is judged on its own pace once it has one: the store's durations
        # reach back before the crowd (in a reconstruction of a daemon's run that went 1 -> 30
        # uncounted on the CPU-capped server, 0.22 s jobs at one worker read 0.36 s, and a count
        # with eleven completions already seemed out of reach).
        countable = (probe is None and not obs.draining and (metrics.running > 0 or claiming)
                     and metrics.runnable_depth >= metrics.running
                     and (alike_now(metrics) or metrics.recent_completions < MIN_COMPLETIONS))
        duration = own if own is not None else expected
        if countable and not counted_since(state, state.backlog_since):
            # A backlog's first count may take a share of the time the backlog needs even at the
            # most workers, when that is longer: two slots of 0.6 s jobs at a 10 s target fit no
            # count within 4 s at any size but 21 workers on a pool of 8 connections, whose
            # jobs then queued past the count's wait (1 -> 21 -> 30 uncounted, requests 68 s).
            budget = max(budget, crowd_budget(obs, target_age, duration, most))
        fits = first_look or count_fits(obs, duration, budget)
        # Too slow to count here even so (8 s jobs on 4 slots, a 12 s budget): the first count is
        # taken at the fewest workers whose count fits, not skipped -- a pool that grew 1 -> 30
        # uncounted on a pool of 8 connections held the request path at 9 s for its first 20 s.
        count_at = None if fits or not countable else fitting_count(obs, duration, budget)
        if not countable or not (fits or count_at is not None):
            state = replace(state, waiting_since=None, count_at=None, waiting_budget=None)
        elif state.waiting_since is None:
            state = replace(state, waiting_since=now, count_at=count_at, waiting_budget=budget)
        else:
            state = replace(state, count_at=count_at, waiting_budget=max(budget, state.waiting_budget or 0.0))
        return state
    fresh = kept_besides(state, sample, config, now)
    state = replace(state, samples=tuple(sorted(fresh + (sample,))), waiting_since=None, count_at=None,
                    waiting_budget=None)
    if probe is not None:
        if sample.workers < probe.to_workers:
            if sample.workers == probe.start.workers and sample.completions > probe.start.completions:
                # Still at the count the step starts from, while its workers start: a longer count.
                state = replace(state, probe=probe._replace(start=sample, lag=sample.duration))
            return state
        # A ceiling only beyond the counting noise of both counts; a step that paid as soon as
        # that is as clear; otherwise count on, and a count that stays unclear lets the step
        # stand (holding a pool that lacks no capacity costs the age target; a ceiling missed
        # here is found by the next step or re-probe).
        window = metrics.recent_window or 0.0
        ceiling = shows_ceiling(sample, probe.start) or shows_ceiling_since_unclear(state, sample, probe)
        if not ceiling and not clearly_paid(sample, probe.start) and not _overdue(probe, obs, now, target_age) \
                and sample.completions < verdict_completions(probe) \
                and counted_seconds(sample) < window - 2:
            return state  # counting on
        state = replace(state, probe=None, unclear_from=None)
        if ceiling or added_nothing(sample, probe.start):
            confirmed = state.confirmed + 1 if state.held_at is not None else 0
            return replace(_held(state, sample.workers, config, now), confirmed=confirmed)
        if state.held_at is not None:
            if sample.completion_rate >= wanted_rate(probe.start, sample.workers):
                # A re-probe that paid (or leans that way, unclear): the knee was not where it
                # was held (or has moved).  Forget it: growth goes on in steps that may double
                # while they pay -- unless a count of more workers, taken within settle_time,
                # shows the ceiling over the re-probe's: the knee moved up to the re-probe, no
                # further (a re-probe from a trimmed 3 that paid at 4 stepped on to 8, where a
                # count 26 s before had shown the ceiling over 4: six seconds past a real pool
                # of connections, a request p95 1.6 x the fixed fleet's).
                above = ceiling_above(state, sample, config, now)
                if above is not None:
                    return replace(_held(state, above.workers, config, now), confirmed=0)
                return _forgotten(state)
            # Unclear, and short of what it must gain: the knee stands, re-probed again after
            # the interval.  Forgotten, a ceiling that lies inside the re-probe (one that still
            # creeps up past its capacity) was grown past again, at times to the pool's maximum.
            # One that leans flat spaces the next as a confirmation does: a late backlog at a
            # real ceiling re-probed every 30 s, each count unclear, spent 18 s of every 48
            # a quarter past the capacity.
            confirmed = state.confirmed + 1 if leans_flat(sample, probe.start) else state.confirmed
            return replace(state, held_since=now, confirmed=confirmed)
        if not clearly_paid(sample, probe.start):
            # Unclear: the next step is judged from where this one started, so that the gains
            # of small steps (a tenth more workers each, as the age signal asks) add up until
            # one is clear -- each judged alone stays within the noise, and growth went on
            # past the ceiling to twice it.
            return replace(state, unclear_from=probe.start)
        return state
    if state.trim is not None and sample.workers == state.held_at:
        # A count tried below the best: held, and one fewer tried, unless a larger count beats it
        # -- judged once the count can tell a worker's difference (a few per cent at twenty
        # workers: a short count's noise would let the trim walk down past the knee), or once it
        # is as long as a step's verdict.  A half, with nothing measured under it, is judged as
        # the step from it to the best would be: it need not tell one worker apart.
        halved = not counted_below(state, sample.workers)
        if trim_counted(sample) or sample.completions >= MAX_VERDICT_COMPLETIONS \
                or (halved and sample.completions >= step_completions(sample.workers, state.trim.best)) \
                or counted_seconds(sample) >= min(RECENT_WINDOW_CAP, (metrics.recent_window or 0.0) - 2):
            return _held(state, state.trim.best, config, now, state.trim)
        return state
    # Apart from a step, counts taken minutes apart may straddle a change of job mix (a batch of
    # slow jobs among quick ones cuts completions as a ceiling would): only alike jobs compare.
    smaller = [kept for kept in fresh if kept.workers < sample.workers]
    if homogeneous(metrics) and not lean_recently(state, obs, now) \
            and any(shows_ceiling(sample, kept) for kept in smaller):
        return _held(state, sample.workers, config, now)
    held = next((kept for kept in smaller if kept.workers == state.held_at), None)
    if held is not None and clearly_paid(sample, held):
        # A re-probe that began while the jobs looked unlike has no step to judge it, and its
        # count would cap the pool for good: a count past the knee that clearly completes more
        # than the knee's own shows the knee was not there, as a re-probe that paid does.
        return _forgotten(state)
    if not smaller and descent_due(state, sample, obs, config, now, target_age, most):
        descent = KneeDescent(start=sample, to_workers=descent_count(sample.workers), since=now)
        return replace(state, descent=descent, descended_at=now)
    return state


def descent_count(workers: int) -> int:
    """The workers a descent from ``workers`` counts."""
    return max(1, math.ceil(workers * DESCENT_SHARE))


def descent_due(state: KneeState, sample: ThroughputSample, obs: Observation, config: KneeConfig,
                now: float, target_age: float, most: int | None) -> bool:
    """Whether the pool, counted at ``sample`` with nothing smaller to compare, is compared
    downwards: at the most it may have and late all the same, no knee held nor step under way,
    no descent within ``sample_max_age``, its count long enough to judge the half against (as a
    step's start), and the half's count (at ``sample``'s pace per worker: no ceiling) had within the probe
    budget.  Short of its maximum the pool steps up instead: a step that pays costs nothing."""
    if most is None or sample.workers < max(2, most) or state.held_at is not None \
            or state.probe is not None or state.trim is not None or lean_recently(state, obs, now):
        return False
    if obs.metrics is None or obs.metrics.oldest_runnable_age <= target_age:
        return False  # the maximum keeps the backlog within its target: a half could only cost it
    if state.descended_at is not None and now - state.descended_at <= config.sample_max_age:
        return False
    half = descent_count(sample.workers)
    budget = probe_budget(obs, target_age)
    counting = budget - (obs.tick or 1.0)
    if counting <= 0 or sample.completion_rate * half / sample.workers * counting < MIN_COMPLETIONS:
        return False
    window = obs.metrics.recent_window or 0.0
    return (sample.completions >= START_SHARE * step_completions(half, sample.workers)
            or counted_seconds(sample) >= min(budget, window - 2))


def _descending(state: KneeState, obs: Observation, config: KneeConfig, now: float,
                load: tuple[LoadSample, ...], target_age: float) -> KneeState:
    """The knee state during a descent (``descent_due``): the half counted from the first tick the
    pool is down to it, then judged as a step from it to the count it descended from."""
    descent = state.descent
    assert descent is not None
    if descent.counting_from is None and obs.active <= descent.to_workers \
            and obs.draining <= DESCENT_STOPPING_SHARE * descent.to_workers:
        # Counted once most of the stopping workers have gone (they hold the dependency while
        # they finish), not all: at a ceiling their last jobs run stretched, and a pool of 84
        # of 2 s jobs took half a minute to stop its last ten.  Then, as a step's count, once
        # the jobs begun at the larger count have had the time to end (one of its mean durations).
        descent = descent._replace(counting_from=now + descent.start.duration, stopping=obs.draining)
        state = replace(state, descent=descent)
    elif descent.counting_from is not None and now <= descent.counting_from:
        # Each worker still stopping when the count begins ends at most one job among the half's.
        descent = descent._replace(stopping=obs.draining)
        state = replace(state, descent=descent)
    sample = descent_sample(descent, obs, load, now)
    if sample is None:
        return replace(state, descent=None) if _descent_overdue(descent, obs, now, target_age) else state
    state = replace(state, samples=tuple(sorted(kept_besides(state, sample, config, now) + (sample,))))
    top = descent.start
    ceiling = shows_ceiling(top, sample)
    assert obs.metrics is not None  # update_knee returns before a descent without metrics
    window = obs.metrics.recent_window or 0.0
    if not ceiling and not clearly_paid(top, sample) and not _descent_overdue(descent, obs, now, target_age) \
            and sample.completions < step_completions(sample.workers, top.workers) \
            and counted_seconds(sample) < window - 2:
        return state  # counting on
    state = replace(state, descent=None)
    # Unclear, it goes the way it leans, as a re-probe does: the maximum short of what its extra
    # workers must add over the half holds (on a real pool of 8 connections, 30 workers read 16.0
    # jobs/s against the half's 13.6, within the noise of bunched completions: back up at 30 for
    # one more count, 15 workers restarted and given back).
    if ceiling or added_nothing(top, sample) or top.completion_rate < wanted_rate(sample, top.workers):
        return _held(state, top.workers, config, now)
    return state  # the maximum paid, or leans that way: back up (``proven`` when it clearly paid)


def descent_sample(descent: KneeDescent, obs: Observation, load: tuple[LoadSample, ...],
                   now: float) -> ThroughputSample | None:
    """The half's count since ``counting_from``, less what its stopping workers may have ended (a
    rate that errs low: a ceiling it shows is there); None before ``MIN_COMPLETIONS``, or
    when the pool is not saturated at the half."""
    metrics = obs.metrics
    since = steady_since(load, obs.concurrency)
    if descent.counting_from is None or metrics is None or since is None or obs.active != descent.to_workers:
        return None
    counted = completions_between(metrics.completion_series, max(since, descent.counting_from), now)
    if counted is None or counted[0] - descent.stopping < MIN_COMPLETIONS:
        return None
    return counted_sample(descent.to_workers, counted, 0.0, now, less=descent.stopping)


def _descent_overdue(descent: KneeDescent, obs: Observation, now: float, target_age: float) -> bool:
    """Whether a descent has waited as long as it may: for its stopping workers, twice the mean
    duration it descended from and a tick, then as long as a step's count (the verdict wait, or
    the half's count at the pace per worker it descended from, at most ``RECENT_WINDOW_CAP``)."""
    tick = obs.tick or 1.0
    if descent.counting_from is None:
        return now - descent.since > 2 * descent.start.duration + tick
    pace = descent.start.completion_rate * descent.to_workers / descent.start.workers
    counting = min(step_completions(descent.to_workers, descent.start.workers) / max(pace, 1e-9),
                   RECENT_WINDOW_CAP)
    return now - descent.counting_from > max(_verdict_wait(obs, target_age), counting)


# Jobs whose p95 is more than this many times their p50 are too unlike each other for counts
# taken apart in time to tell a ceiling from a change of mix.
MAX_SPREAD = 4.0


def homogeneous(metrics) -> bool:
    """Whether the jobs of the last minutes are alike (p95 within ``MAX_SPREAD`` x p50, none in
    flight far older): what counts taken minutes apart need."""
    return _alike(metrics.duration_p50, metrics.duration_p95, metrics)


# The recent window speaks for the jobs of now only where its p95 is at most this share of it:
# a window shorter than a job holds the few that ended first (a burst of 50 s jobs counted on its
# first completions, then a step counted before its own jobs ended: a ceiling that was not there).
RECENT_SPAN_SHARE = 0.5


def alike_now(metrics) -> bool:
    """Whether the jobs of the store's recent window are alike (as ``homogeneous``), once it saw
    ``MIN_COMPLETIONS`` and spans a few of them (``RECENT_SPAN_SHARE``); else the last
    minutes' are judged.  What a first count and a step from a fresh one need: their counts
    are seconds apart.  The minutes span other counts, and at a ceiling durations stretch with
    the count -- a crowd right after a pool of 30 had run on a half-CPU database read 0.1 s
    and 7 s jobs as unlike, and went 1 -> 30 uncounted."""
    p50, p95 = metrics.recent_duration_p50, metrics.recent_duration_p95
    window = metrics.recent_window or 0.0
    if metrics.recent_completions < MIN_COMPLETIONS or not (p50 and p95) or p95 > RECENT_SPAN_SHARE * window:
        return homogeneous(metrics)
    return _alike(p50, p95, metrics)


def _alike(p50: float | None, p95: float | None, metrics) -> bool:
    if not (p50 and p95) or p95 > MAX_SPREAD * p50:
        return False
    return metrics.running_age_mean is None or metrics.running_age_mean <= MAX_SPREAD * p95


def lean_recently(state: KneeState, obs: Observation, now: float) -> bool:
    """Whether the pool was held lean within the last two ticks: growth off a lean count is the
    age target calling the worker back, not a step into the unknown."""
    return state.lean_at is not None and now - state.lean_at <= 2 * (obs.tick or 1.0)


def _forgotten(state: KneeState) -> KneeState:
    """``state`` without its knee (and the trim under way): growth goes on in steps."""
    return replace(state, held_at=None, held_since=None, trim=None, confirmed=0)


def _counted_afresh(state: KneeState) -> KneeState:
    """``state`` without its knee, its counts, a step under way or a wait for a first count: the
    jobs changed, and every count describes other jobs."""
    return replace(_forgotten(state), samples=(), probe=None, unclear_from=None, waiting_since=None,
                   count_at=None)


def step_base(state: KneeState, last: ThroughputSample, to_workers: int | None = None) -> ThroughputSample:
    """The count a step to ``to_workers`` (None: the least step past ``last``) is judged against:
    the start of the last step when that one stayed unclear (and the new one is at most a
    doubling from it), else the latest count."""
    base = state.unclear_from
    to_workers = last.workers + 1 if to_workers is None else to_workers
    if base is not None and base.workers < last.workers and to_workers <= step_reach(base.workers):
        return base
    return last


def _overdue(probe: KneeProbe, obs: Observation, now: float, target_age: float) -> bool:
    """Whether a step has waited for its verdict as long as it may: its workers' start, the lag,
    and the time its count needs at the pace it started from (within the verdict wait, at least)."""
    counting = min(verdict_completions(probe) / max(probe.start.completion_rate, 1e-9), RECENT_WINDOW_CAP)
    allowed = (obs.start_cost or 0.0) + probe.lag + max(_verdict_wait(obs, target_age), counting)
    return now - probe.since > allowed


def _verdict_wait(obs: Observation, target_age: float) -> float:
    """How long a sample stays fresh enough to start a step from, and a step may wait for its verdict."""
    return max(probe_budget(obs, target_age), 2 * (obs.tick or 1.0))


def fresh_count(sample: ThroughputSample | None, obs: Observation | None, now: float, target_age: float) -> bool:
    """Whether ``sample`` was counted within the verdict wait: recent enough for a step to start
    from (without an observation, only a count taken now)."""
    wait = _verdict_wait(obs, target_age) if obs is not None else 0.0
    return sample is not None and now - sample.at <= wait


def _unless_far_shorter(read: float | None, own: float | None) -> float | None:
    """The durations ``read`` from the store, or the count's ``own`` where it is under
    ``OWN_DURATION_SHARE`` of them (or none were read)."""
    if own is not None and (read is None or own < OWN_DURATION_SHARE * read):
        return own
    return read


def kept_besides(state: KneeState, sample: ThroughputSample, config: KneeConfig,
                 now: float) -> tuple[ThroughputSample, ...]:
    """The counts kept beside ``sample``: those of other worker counts within ``sample_max_age``."""
    return tuple(kept for kept in state.samples
                 if kept.workers != sample.workers and now - kept.at <= config.sample_max_age)


def _latest(samples: tuple[ThroughputSample, ...]) -> ThroughputSample | None:
    return max(samples, key=lambda kept: kept.at, default=None)


def _held(state: KneeState, upto: int, config: KneeConfig, now: float, trim: KneeTrim | None = None) -> KneeState:
    """The knee at the best throughput measured up to ``upto`` workers (the count that showed the
    ceiling), then trimmed (``trim``: the trim under way, when one of its counts is judged).

    Steps measure a few counts; the best of them may hold a worker or more that adds nothing
    (on a dependency whose throughput creeps up past its capacity, one that keeps it over: the
    best measured is as often just over the capacity as just under it).  So the counts between
    the count measured below the best (the floor) and the best are tried: each that completes as
    much as the best (within the counting noise) is held instead, and one that clearly does not
    becomes the floor.  The next count tried is one fewer than the count held (with no floor
    measured, its half), or, where the step from the floor clearly added less than its workers'
    share, where the floor's pace per worker reaches the held count's rate (``flattened_at``)."""
    measured = tuple(kept for kept in state.samples if kept.workers <= upto)
    counts = {kept.workers: kept for kept in measured}
    if trim is not None and trim.best in counts:
        top, floor = counts[trim.best], trim.floor
    else:
        top = best(measured, config.min_throughput_gain)
        floor = max((count for count in counts if count < top.workers), default=0)
    held = top
    for count in sorted((count for count in counts if floor < count < top.workers), reverse=True):
        if clearly_better(top, counts[count], 0.0):
            floor = count
            break
        held = counts[count]
    held_at = held.workers
    below = counts.get(floor)
    if held_at - 1 > floor:
        # With nothing measured below, the half is tried (a binary search: a pool of 84 that
        # reached its maximum uncounted, trimmed a worker at a time, counts for minutes).
        held_at = max(floor + 1, math.ceil(held_at * DESCENT_SHARE)) if below is None \
            else min(held_at - 1, flattened_at(held, below))
    trimming = KneeTrim(top.workers, floor) if held_at != held.workers else None
    return replace(state, held_at=held_at, held_since=now, held_rate=top.completion_rate, probe=None,
                   trim=trimming)


def trim_counted(sample: ThroughputSample) -> bool:
    """Whether a trimmed count's noise is within half a worker's pace at that count: one worker
    fewer (or more) then shows beyond it.  Four workers of a full pool of connections tell 3 from 4
    in about a second; twenty need the verdict's longest count."""
    return noise(sample) <= 0.5 * sample.completion_rate / max(sample.workers, 1)


def flattened_at(top: ThroughputSample, below: ThroughputSample) -> int:
    """The count inside the step from ``below`` to ``top`` at which ``below``'s pace per worker
    reaches ``top``'s rate, when that step clearly added less than its workers would at
    ``below``'s pace; else ``top``'s count.

    Steps are coarse (a quarter or a doubling), and a ceiling lies somewhere inside the last
    one that paid: its first workers added their share, the rest only queued.  Holding the
    whole step holds those, and on a dependency whose throughput still creeps up past its
    capacity (contention) they keep it over capacity at the knee."""
    if top.completion_rate + math.hypot(noise(top), noise(below)) >= wanted_rate(below, top.workers, 1.0):
        return top.workers
    reached = round(below.workers * top.completion_rate / max(below.completion_rate, 1e-9))
    return min(top.workers, max(below.workers + 1, reached))


def late_reprobe(config: KneeConfig, target_age: float, confirmed: int = 0) -> float:
    """How soon a knee is re-probed while the oldest job is late: ``2 x settle_time``, and within
    the age target (a count is a noisy thing, and a backlog held at a false knee for two
    minutes is two minutes late; a true knee costs one small step past it) -- twice as long
    after each of the ``confirmed`` re-probes in a row that showed the ceiling again (each ran
    a quarter past a real one for its count), up to ``reprobe_interval``."""
    first = min(config.reprobe_interval, 2 * config.settle_time, max(target_age, 1.0))
    return min(config.reprobe_interval, first * 2 ** confirmed)


def knee_counted(state: KneeState, obs: Observation | None, now: float, target_age: float) -> bool:
    """Whether the held count has a count fresh enough for a re-probe's step to start from (the
    latest sample, within the verdict wait).  A re-probe from a stale one has no step: its count
    is then judged against the knee's old, short count apart from any step, and a pool past
    its capacity sat at the re-probe for four minutes, too noisy a comparison to end it."""
    latest = _latest(state.samples)
    return fresh_count(latest, obs, now, target_age) and latest.workers == state.held_at


def proven(state: KneeState, config: KneeConfig, now: float) -> ThroughputSample | None:
    """The sample of the most workers measured (within ``sample_max_age``) that clearly paid over
    a smaller count and that no smaller count shows a ceiling in, or None.  Growth up to it is
    not probed again: a square wave whose every high phase probed from its low (2, 4, 8, 16, 32
    workers, a count each) spent each phase measuring what the last one had measured."""
    recent = sorted((kept for kept in state.samples if now - kept.at <= config.sample_max_age),
                    key=lambda kept: kept.workers)
    for sample in reversed(recent):
        fewer = [kept for kept in recent if kept.workers < sample.workers]
        if any(clearly_paid(sample, kept) for kept in fewer) \
                and not any(shows_ceiling(sample, kept) for kept in fewer):
            return sample
    return None


def knee_cap(state: KneeState, config: KneeConfig, now: float, late: bool = False,
             obs: Observation | None = None, target_age: float = 60.0) -> tuple[int, str] | None:
    """The knee as a cap and the rule that sets it, or None when nothing holds growth.

    ``held``: the measured knee; ``reprobe``: a step past it once a re-probe is
    due (``late``: the oldest job is over its target, so sooner); ``probe``: a
    step under way, held until its sample says whether it paid; ``measuring``:
    the count now, until its first sample (within the probe budget);
    ``step``: the next step after one that paid; ``proven``: back up to the most
    workers measured without a ceiling (``proven``), where a step would hold less.
    """
    if not config.enabled or (obs is not None and obs.other_hosts):
        return None
    if state.descent is not None:
        return state.descent.to_workers, "descending"
    if state.held_at is not None and state.held_since is not None:
        interval = late_reprobe(config, target_age, state.confirmed) if late else config.reprobe_interval
        if state.probe is not None:
            return state.probe.to_workers, "reprobe"
        if now - state.held_since >= interval and (
                knee_counted(state, obs, now, target_age) or now - state.held_since >= 2 * interval):
            return state.held_at + max(1, math.ceil(state.held_at * REPROBE_STEP)), "reprobe"
        return state.held_at, "held"
    if state.probe is not None:
        return state.probe.to_workers, "probe"
    if obs is None or obs.metrics is None or obs.metrics.runnable_depth == 0 or lean_recently(state, obs, now):
        return None
    cap = _growth_cap(state, obs, now, target_age)
    measured = proven(state, config, now)
    if cap is not None and measured is not None and cap[0] < measured.workers:
        return measured.workers, "proven"
    return cap


def _growth_cap(state: KneeState, obs: Observation, now: float, target_age: float) -> tuple[int, str] | None:
    """The cap of growth in steps, no knee held and no step under way (see ``knee_cap``)."""
    budget = probe_budget(obs, target_age)
    last = _latest(state.samples)
    if (fresh_count(last, obs, now, target_age) and last.workers >= obs.active
            and alike_now(obs.metrics)):
        base = step_base(state, last)
        step = max(obs.current, step_reach(base.workers))
        # The step will be judged against this count: a short one (a second of a slow pace) is
        # too noisy to show that the step added nothing.  Count on, while the count can still
        # grow: within the probe budget and the store's recent window.
        if (base is last and step > last.workers
                and last.completions < START_SHARE * step_completions(last.workers, step)
                and counted_seconds(last) < min(budget, (obs.metrics.recent_window or 0.0) - 2)):
            return obs.current, "measuring"
        return step, "step"
    if budget and state.waiting_since is not None \
            and now - state.waiting_since < max(budget, state.waiting_budget or 0.0):
        return max(obs.current, state.count_at or 0), "measuring"
    return None


def describe(state: KneeState, rule: str, workers: int) -> str:
    """The knee cap's rule in words, with the measurements behind it."""
    def rate(sample: ThroughputSample) -> str:
        return f"{sample.workers} workers {sample.completion_rate:.1f} jobs/s"

    by_count = {kept.workers: kept for kept in state.samples}
    if rule == "held" and state.held_at is not None:
        above = [kept for kept in state.samples if kept.workers > state.held_at]
        if state.held_at in by_count:
            more = f"; {rate(max(above, key=lambda kept: kept.at))}" if above else ""
            return f"held at a measured ceiling: {rate(by_count[state.held_at])}{more}"
        # A count tried below the best (trimmed), not counted yet.
        below = [kept for kept in state.samples if kept.workers < state.held_at]
        if below and above:
            start = max(below, key=lambda kept: kept.workers)
            end = min(above, key=lambda kept: kept.workers)
            return (f"held at a measured ceiling: {state.held_at} workers, within the step from "
                    f"{rate(start)} to {rate(end)}")
        if above:
            return (f"held at a measured ceiling: {state.held_at} workers, fewer than "
                    f"{rate(min(above, key=lambda kept: kept.workers))}, until they are measured")
    if rule in ("probe", "reprobe") and state.probe is not None:
        start = state.probe.start
        return f"probing {workers} workers against {rate(start)}"
    if rule == "reprobe":
        return f"re-probing past the ceiling at {state.held_at} workers"
    if rule == "step" and state.samples:
        last = max(state.samples, key=lambda kept: kept.at)
        unclear = state.unclear_from
        if unclear is not None and unclear.workers < last.workers:
            # Past the unclear step's start's reach, the next step is judged against the last count.
            judged = "" if step_base(state, last) is last else f", judged against {unclear.workers}"
            return (f"the step to {last.workers} workers is unclear ({rate(last)}; {rate(unclear)}): "
                    f"up to {workers} next{judged}")
        if not counted_below(state, last.workers):
            return f"counted {rate(last)}: up to {workers} next"
        return f"the step to {last.workers} paid ({rate(last)}): up to {workers} next"
    if rule == "proven":
        return f"up to {workers} workers, measured without a ceiling ({rate(by_count[workers])})" \
            if workers in by_count else rule
    if rule == "descending" and state.descent is not None:
        return (f"measuring {workers} workers against {rate(state.descent.start)}, "
                f"reached without a smaller count")
    if rule == "measuring":
        return f"measuring the throughput of {workers} workers before adding more"
    return rule
