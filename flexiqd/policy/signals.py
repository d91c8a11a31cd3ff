"""Stage 1, signals: each turns the observation into a worker count it would want.

A signal returns None when it has no opinion (the age signal with an empty
queue, the CPU signal for an IO-bound pool), so it cannot hold a pool up.
Sizing goes through measured per-worker throughput (Little's law), not a
blind ratio of the metric to its target.  Estimates that need more than one
instant (mean running jobs, throughput, the base arrival rate) come from the
load samples the history keeps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .config import PoolPolicy
from .economics import lead_time, start_cost, tick
from .types import LoadSample, Observation, PoolMetrics, SignalRecommendation

# When the oldest job is already close to (or past) its target, the backlog
# still gets at least this fraction of the target to drain: a smaller slack
# would ask for an unbounded number of workers that could not boot in time.
MIN_SLACK_FRACTION = 0.25

# Job durations and the base arrival rate are estimated over this long a
# history.  Durations change slowly, and over one 60 s rate window a pool of
# minute-long jobs completes too few of them for Little's law to be more than
# noise.  The arrival rate over it counts a burst once -- as the backlog it
# left -- instead of again as a rate that will not last.
ESTIMATION_HORIZON = 300.0

# Running jobs are averaged over this long for the utilisation signal: at one
# instant the count swings with every start and end.  Short, so that it
# describes now: a 120 s mean read a pool idle for a minute as busy.  The mean
# is compared with the slots of the same samples, and an idle pool (nothing
# running, nothing runnable) is idle whatever the window says.
UTILISATION_WINDOW = 30.0

# Recommendations are ceilings of float arithmetic; this absorbs rounding noise
# so that exactly 3 workers' worth of load does not become 4.
_EPSILON = 1e-9
_MOST_WORKERS = 1_000_000


def record_load(load: tuple[LoadSample, ...], now: float, obs: Observation) -> tuple[LoadSample, ...]:
    """``load`` plus this tick's sample, without samples older than any estimate needs."""
    metrics = obs.metrics
    assert metrics is not None
    keep = max(ESTIMATION_HORIZON, UTILISATION_WINDOW, metrics.rate_window or 0.0)
    kept = tuple(sample for sample in load if sample.at > now - keep)
    sample = LoadSample(
        now, obs.active, metrics.running, metrics.completion_rate, metrics.arrival_rate, metrics.runnable_depth
    )
    return kept + (sample,)


def recent(load: tuple[LoadSample, ...], window: float | None) -> list[LoadSample]:
    """The samples within ``window`` of the newest (only the newest without a window)."""
    if not load:
        return []
    if window is None:
        return [load[-1]]
    newest = load[-1].at
    return [sample for sample in load if sample.at > newest - window]


# Little's law decides the mean duration once its window has seen this many
# completions; before that the store's percentiles and the jobs in flight do.
MIN_LITTLE_COMPLETIONS = 20


def busy_and_rate(load: tuple[LoadSample, ...], window: float,
                  rate_window: float | None = None) -> tuple[float, float, float] | None:
    """(mean running jobs, mean completion rate, seconds covered) over the last ``window`` seconds.

    Time-weighted: each sample's running count stands for the time until the
    next sample, so this tick's (``load[-1]``) stands for nothing yet -- the
    jobs a burst just started have not had the time to complete, and
    counting them would read a burst of short jobs as slow ones.  When
    ``window`` is the store's ``rate_window``, the newest sample's completion
    rate is of exactly that span; over a longer one the samples' rates are
    averaged the same way.  None when no earlier sample falls in the window.
    """
    if len(load) < 2:
        return None
    now = load[-1].at
    busy = rate = covered = 0.0
    for sample, following in zip(load, load[1:]):
        start = max(sample.at, now - window)
        span = following.at - start
        if span <= 0:
            continue
        busy += sample.running * span
        rate += (following.completion_rate or 0.0) * span  # a rate measured up to the span's end
        covered += span
    if covered <= 0:
        return None
    if rate_window is not None and window == rate_window and load[-1].completion_rate is not None:
        return busy / covered, load[-1].completion_rate, covered
    return busy / covered, rate / covered, covered


def job_duration(metrics: PoolMetrics, load: tuple[LoadSample, ...], floor: float = 0.0) -> float | None:
    """The mean job duration, seconds, from what the workers are doing; None when nothing tells.

    Little's law: the mean running jobs over the mean completion rate of the
    same span is the mean duration, whatever the distribution of durations --
    a tail of long jobs counts by the slots it holds, which is what a worker
    count must pay for.  Over the rate window when it saw
    ``MIN_LITTLE_COMPLETIONS`` completions, else over ``ESTIMATION_HORIZON``
    (minute-long jobs complete too rarely for one window).  No percentile of
    finished jobs clamps it: the jobs that finish first in a burst are its
    short ones, and a median says nothing of a mean.

    Until then: the mean of the jobs just finished (from their p50 and p95),
    never shorter than the jobs in flight have already run on average --
    erring long, which costs a few idle slots, not the age target; before
    anything finished, twice that mean age (jobs started evenly over a
    duration D are D/2 old on average), never less than ``floor`` (the lead
    time), so the first tick of a burst does not size the pool on how many
    milliseconds its jobs have run.
    """
    for window in (metrics.rate_window or ESTIMATION_HORIZON, ESTIMATION_HORIZON):
        measured = busy_and_rate(load, window, metrics.rate_window)
        if measured is None:
            break
        busy, rate, covered = measured
        if busy > 0 and rate > 0 and rate * covered >= MIN_LITTLE_COMPLETIONS:
            return busy / rate
    in_flight = metrics.in_flight_age
    finished = finished_mean(metrics)
    if finished is not None and finished > 0:
        return max(finished, in_flight or 0.0)
    if in_flight is not None:
        return max(2 * in_flight, floor) or None
    return None


def finished_mean(metrics: PoolMetrics) -> float | None:
    """The mean duration of the jobs just finished, from their p50 and p95 (None without both).

    Job durations are skewed (a lognormal is the usual model): the mean is
    p50 x exp(s^2 / 2) with s = ln(p95 / p50) / 1.645.  It describes the jobs
    the store's percentiles cover (the latest completions, at most a few
    minutes old), so it follows a change of job mix within minutes.
    """
    p50, p95 = metrics.duration_p50, metrics.duration_p95
    if not p50 or p50 <= 0:
        return None
    if not p95 or p95 <= p50:
        return p50
    spread = math.log(p95 / p50) / 1.645
    return p50 * math.exp(spread * spread / 2)


def per_worker_throughput(
    metrics: PoolMetrics, concurrency: int, load: tuple[LoadSample, ...], floor: float = 0.0
) -> float | None:
    """Jobs/s one fully busy worker completes (concurrency / ``job_duration``), or None when nothing is known."""
    duration = job_duration(metrics, load, floor)
    if duration is None:
        return None
    return concurrency / duration


def base_arrival_rate(metrics: PoolMetrics, load: tuple[LoadSample, ...]) -> float:
    """Median arrival rate over ``ESTIMATION_HORIZON``, never above this tick's rate.

    The median, not the mean: a burst is counted once, as the backlog it
    left; its rate fills a minority of the samples (a 10 s burst lifts a 60 s
    rate for about a minute of the five) and would otherwise be counted again
    as arrivals for five minutes.
    """
    rates = sorted(s.arrival_rate for s in recent(load, ESTIMATION_HORIZON) if s.arrival_rate is not None)
    if not rates:
        return metrics.arrival_rate or 0.0
    middle = len(rates) // 2
    median = rates[middle] if len(rates) % 2 else (rates[middle - 1] + rates[middle]) / 2
    if metrics.arrival_rate is not None:
        # A load that has fallen (a flood's end) is read as fallen at once.
        return min(median, metrics.arrival_rate)
    return median


def jobs_of_draining_workers(obs: Observation) -> int:
    """The store's running jobs that draining workers run: those run their last jobs out and take
    no more, so they hold no slot of the active workers.  At least one each (a draining worker
    with none has exited), at most all that run."""
    assert obs.metrics is not None
    return min(obs.metrics.running, obs.draining)


def jobs_of_active_workers(obs: Observation) -> int:
    """The jobs running on the active workers: the store's running jobs without those of the
    draining workers (``jobs_of_draining_workers``)."""
    assert obs.metrics is not None
    return obs.metrics.running - jobs_of_draining_workers(obs)


def _workers(value: float) -> int:
    # A vanishing throughput estimate must not overflow: any cap is far below this.
    if not value < _MOST_WORKERS:
        return _MOST_WORKERS
    return max(0, math.ceil(value - _EPSILON))


@dataclass(frozen=True)
class SignalInputs:
    """What every signal reads: the observation (with metrics), the policy, and estimates.

    ``throughput``: jobs/s one fully busy worker completes (None: unknown yet).
    ``running``: mean running jobs over ``UTILISATION_WINDOW`` (never more than run now), less
    those the draining workers run now (``jobs_of_draining_workers``).
    ``active``: mean active workers over the rate window (the span a CPU
    utilisation measured over that window is a mean over).
    ``arrivals``: the base arrival rate (jobs/s).
    ``slots``: mean slots of the active workers over the same samples as ``running``.
    ``lead_time``: how long before a job reaches its target the age signal acts.
    ``backlog_throughput``: per-worker throughput of the jobs waiting now, when they are known
    to be slower than the mix ``throughput`` was measured on (None: the same).
    """

    obs: Observation
    metrics: PoolMetrics
    policy: PoolPolicy
    throughput: float | None
    running: float
    active: float
    arrivals: float
    slots: float = 0.0
    lead_time: float = 10.0
    backlog_throughput: float | None = None


# An idle pool: this many samples in a row (this tick's the last) saw no job running
# or runnable.  One instant of nothing running is common under a light load.
IDLE_SAMPLES = 2


def is_idle(load: tuple[LoadSample, ...]) -> bool:
    """Whether the last ``IDLE_SAMPLES`` samples saw nothing running and nothing runnable."""
    last = load[-IDLE_SAMPLES:]
    return len(last) == IDLE_SAMPLES and all(s.running == 0 and s.runnable == 0 for s in last)


def signal_inputs(obs: Observation, policy: PoolPolicy, load: tuple[LoadSample, ...]) -> SignalInputs:
    """The inputs for ``obs`` (whose metrics must be present); ``load`` ends with this tick's sample."""
    metrics = obs.metrics
    assert metrics is not None
    over_rate_window = recent(load, metrics.rate_window)
    over_util_window = recent(load, UTILISATION_WINDOW)
    idle = is_idle(load)
    if idle:
        running = 0.0
    elif over_util_window:
        # The window's mean, but no more than run now: a load that has fallen (a drained
        # burst) is read as fallen at once; a rise waits for the mean.
        mean = sum(s.running for s in over_util_window) / len(over_util_window)
        running = min(mean, float(metrics.running))
    else:
        running = float(metrics.running)
    # The active workers' jobs only: counted as their load, the jobs the draining workers run out
    # undid every scale-down of busy workers with as many new starts.
    running = max(0.0, running - jobs_of_draining_workers(obs))
    if over_util_window:
        slots = obs.concurrency * sum(s.active for s in over_util_window) / len(over_util_window)
    else:
        slots = float(obs.active * obs.concurrency)
    lead = lead_time(policy.targets, start_cost(obs, policy.behavior), tick(obs))
    throughput = per_worker_throughput(metrics, obs.concurrency, load, lead)
    in_flight = metrics.in_flight_age
    backlog_throughput = None
    if throughput is not None and in_flight and obs.concurrency / throughput < in_flight:
        if late_backlog(metrics, lead, policy.targets.age):
            # The backlog is late and the jobs in flight have already run longer than the mean
            # measured so far: a slower mix has arrived (a batch of slow jobs among quick ones)
            # and the estimate has not seen one finish.  Size on what they have run; erring long
            # here costs idle slots for a while, erring short the age target.
            throughput = obs.concurrency / in_flight
        elif pace_contradicts(obs, throughput):
            # Not late yet, but the pool's own completions say the same: the backlog (the jobs
            # like those now in flight) is sized on what they have run; the arrivals keep the
            # mix the estimate was made of.
            backlog_throughput = obs.concurrency / in_flight
    return SignalInputs(
        obs=obs,
        metrics=metrics,
        policy=policy,
        throughput=throughput,
        running=running,
        active=sum(s.active for s in over_rate_window) / len(over_rate_window) if over_rate_window else obs.active,
        arrivals=base_arrival_rate(metrics, load),
        slots=slots,
        lead_time=lead,
        backlog_throughput=backlog_throughput,
    )


def workers_to_start(inputs: SignalInputs, jobs: int, within: float, throughput: float | None = None) -> float:
    """Workers that start ``jobs`` waiting jobs within ``within`` seconds and keep up with arrivals.

    The arrivals keep ``arrivals x D`` slots busy (Little's law, D = concurrency / per-worker
    throughput), at most the jobs running and waiting now.  Every other slot starts one
    waiting job at once if it is free, then one more per duration of the jobs like those
    waiting; the jobs running beyond the arrivals' share still hold theirs.  For quick jobs
    (D much shorter than ``within``) that is the throughput's count, (arrivals + jobs /
    within) / throughput; for slow ones a worker started for the backlog is worth its free
    slots, not the few jobs it would complete in the time (a burst of 30 s jobs with 8 s to
    start in needs a slot each, not four times that).
    ``throughput`` replaces the inputs' estimate for both.
    """
    steady = throughput if throughput is not None else inputs.throughput
    backlog = throughput if throughput is not None else (inputs.backlog_throughput or steady)
    if not steady or steady <= 0 or not backlog or backlog <= 0:
        return float(_MOST_WORKERS)
    concurrency = inputs.obs.concurrency
    # Never more slots for the arrivals than jobs run and wait now: a mean duration measured
    # across a burst of slow jobs outlives the burst by a rate window, and the quick jobs
    # arriving after it would be sized on it (a slot each for jobs that take half a second).
    # A flow that rises shows as more jobs running and waiting by the next tick.
    present = jobs_of_active_workers(inputs.obs) + jobs
    flow_slots = min(inputs.arrivals * concurrency / steady, present)
    waiting_duration = concurrency / backlog
    starts_per_worker = concurrency * (1 + within / waiting_duration)
    others = present - flow_slots
    return flow_slots / concurrency + others / starts_per_worker


# The pool's own recent completions contradict the throughput estimate when a saturated pool
# completed less than this share of what the estimate says it would, over a window in which the
# estimate expects at least ``CONTRADICTION_COMPLETIONS`` (fewer say too little beside noise).
CONTRADICTION_SHARE = 0.5
CONTRADICTION_COMPLETIONS = 20


def pace_contradicts(obs: Observation, throughput: float) -> bool:
    """Whether a saturated pool (every slot busy, jobs waiting) completed far fewer jobs over the
    store's recent window than ``throughput`` per worker says it would: the jobs now running are
    slower than the ones the estimate was made of."""
    metrics = obs.metrics
    assert metrics is not None
    window = metrics.recent_window
    if not window or metrics.runnable_depth == 0 or obs.active == 0:
        return False
    running = jobs_of_active_workers(obs)
    if running < obs.active * obs.concurrency:
        return False
    expected = running / (obs.concurrency / throughput) * window
    return expected >= CONTRADICTION_COMPLETIONS and metrics.recent_completions < CONTRADICTION_SHARE * expected


def age_signal(inputs: SignalInputs) -> SignalRecommendation | None:
    """Workers to drain the backlog before its oldest job reaches the age target.

    slack = target - half the oldest age - lead time (never below a quarter
    of the target): the backlog arrived over the oldest job's age, so every
    job in it keeps its target if it starts at the pace that starts the
    middle one in time; workers = ``workers_to_start(depth, slack)`` (the
    arrivals' slots, and the slots that start the backlog within the slack).
    It looks ahead: a backlog that will not start in time asks
    for workers before its oldest job is late.  Without a throughput
    estimate, a job within ``lead_time`` of the target grows the pool in
    proportion to its age.
    """
    metrics, targets, current = inputs.metrics, inputs.policy.targets, inputs.obs.current
    if metrics.runnable_depth == 0:
        return None
    age = metrics.oldest_runnable_age
    relation = ">" if age > targets.age else "<="
    seen = f"oldest job {age:.1f}s {relation} target {targets.age:.1f}s"
    lead = inputs.lead_time
    if inputs.throughput is None:
        if age <= targets.age - lead:
            return None
        wanted = max(current + 1, _workers(current * age / (targets.age - lead)))
        return SignalRecommendation("age", wanted, seen)
    # The backlog's jobs arrived between ``age`` ago and now: its mean job has waited about
    # half the oldest one's age (a burst enqueued at once is caught by the safety net).
    slack = max(targets.age - age / 2 - lead, targets.age * MIN_SLACK_FRACTION)
    wanted = _workers(workers_to_start(inputs, metrics.runnable_depth, slack))
    detail = f"{seen}, {metrics.runnable_depth} runnable to start within {slack:.1f}s"
    return SignalRecommendation("age", wanted, detail)


def drain_signal(inputs: SignalInputs) -> SignalRecommendation | None:
    """Workers to keep up with arrivals and drain the backlog within the drain target.

    workers = ``workers_to_start(depth, target drain time)``.
    No opinion without a backlog: then the utilisation signal already says
    what keeping up takes, from the jobs actually running.
    """
    metrics = inputs.metrics
    if inputs.throughput is None or metrics.runnable_depth == 0:
        return None
    target = inputs.policy.targets.effective_drain_time
    wanted = _workers(workers_to_start(inputs, metrics.runnable_depth, target))
    if metrics.completion_rate:
        drain = f"time to drain {metrics.runnable_depth / metrics.completion_rate:.1f}s"
    else:
        drain = f"{metrics.runnable_depth} runnable, nothing completing yet"
    return SignalRecommendation("drain", wanted, f"{drain}, target {target:.1f}s")


def depth_signal(inputs: SignalInputs) -> SignalRecommendation | None:
    """KEDA-style ceil(depth / target depth per worker); off unless the target is set."""
    target = inputs.policy.targets.depth_per_worker
    if target is None:
        return None
    depth = inputs.metrics.runnable_depth
    return SignalRecommendation("depth", _workers(depth / target), f"{depth} runnable, target {target:g} per worker")


def utilisation_signal(inputs: SignalInputs) -> SignalRecommendation | None:
    """Workers for the active workers' running jobs (``SignalInputs.running``) to fill the target
    share of the slots (the mean slots over the same samples, in the detail)."""
    obs, target, running = inputs.obs, inputs.policy.targets.utilisation, inputs.running
    wanted = _workers(running / (obs.concurrency * target))
    if inputs.metrics.runnable_depth > 0 and inputs.throughput is not None:
        # Jobs waiting keep every slot busy: utilisation then reads 1.0 at any size and
        # would add a worker per tick.  The age and drain signals size a backlog.
        wanted = min(wanted, obs.current)
    slots = inputs.slots
    utilisation = running / slots if slots else 0.0
    return SignalRecommendation(
        "util", wanted, f"utilisation {utilisation:.2f} ({running:.1f}/{round(slots, 1):g} slots), target {target:.2f}"
    )


def cpu_signal(inputs: SignalInputs) -> SignalRecommendation | None:
    """The HPA's ceil(workers x cpu / target), for pools declared ``cpu_bound`` only.

    The workers are the mean active count over the rate window, the span the
    CPU figure is a mean over: multiplying by the count of this instant after
    a scale-up would count the newcomers' idle boot as load and grow again.
    """
    policy, cpu = inputs.policy, inputs.metrics.cpu_utilisation
    if not policy.cpu_bound or cpu is None or inputs.active == 0:
        return None
    target = policy.targets.cpu
    return SignalRecommendation("cpu", _workers(inputs.active * cpu / target), f"cpu {cpu:.2f}, target {target:.2f}")


def saturation_signal(inputs: SignalInputs) -> SignalRecommendation | None:
    """Double a saturated pool while nothing tells how fast it works (a cold start).

    More jobs waiting than free slots means the pool is too small: once the
    workers have claimed, every slot is busy and jobs still wait.  It is known
    at the burst's commit, before any claim; until a job completes there is no
    throughput to size the pool with, and the age signal would wait until the
    oldest job nears its target.  Doubling (the rate limit still applies)
    answers a burst at once instead of after the first completion; once a
    throughput is known the age and drain signals size it.
    Never fewer than the workers already asked for: those still starting are
    what the waiting jobs need, so a pool whose workers are all still starting
    is held as it is.
    """
    obs, metrics = inputs.obs, inputs.metrics
    if inputs.throughput is not None or metrics.runnable_depth == 0 or obs.current == 0:
        return None
    slots = obs.active * obs.concurrency
    free = max(0, slots - jobs_of_active_workers(obs))
    if metrics.runnable_depth <= free:
        return None  # the free slots take every waiting job
    # Double what is busy, not what is booting: workers still starting are the capacity
    # already on its way, and doubling them too would answer a boot with more boots.  Nor
    # fewer than them: stopping a worker that is still starting throws its start away while
    # the jobs it was started for wait (the down window is a start cost long, a boot on a
    # busy host or behind a slow connection longer).
    wanted = max(2 * obs.active, obs.current)
    if obs.active == 0:
        detail = f"{obs.starting} workers starting, {metrics.runnable_depth} runnable, no throughput known yet"
    else:
        detail = (f"{metrics.runnable_depth} runnable for {free} free slots of {slots}, "
                  f"no throughput known yet")
    return SignalRecommendation("saturation", wanted, detail)


def coming_due_signal(inputs: SignalInputs) -> SignalRecommendation | None:
    """Workers for delayed jobs coming due soon, started before they become runnable.

    ``coming_due`` jobs become runnable within ``coming_due_within``
    seconds; workers started now are up by then, so the batch gets the whole
    age target to start in: workers = ``workers_to_start(coming due + depth,
    age target)``.  Without a throughput estimate each
    slot is assumed to start one job per age target (the slowest plausible
    reading that still keeps the target).
    """
    metrics, policy = inputs.metrics, inputs.policy
    if metrics.coming_due <= 0:
        return None
    age = policy.targets.age
    throughput = inputs.throughput if inputs.throughput is not None else inputs.obs.concurrency / age
    wanted = _workers(workers_to_start(inputs, metrics.coming_due + metrics.runnable_depth, age, throughput))
    return SignalRecommendation(
        "due", wanted,
        f"{metrics.coming_due} jobs come due within {metrics.coming_due_within:g}s, to start within {age:g}s",
    )


def from_zero_signal(inputs: SignalInputs) -> SignalRecommendation | None:
    """A pool with no workers and runnable jobs wants at least one."""
    depth = inputs.metrics.runnable_depth
    if inputs.obs.current > 0 or depth == 0:
        return None
    return SignalRecommendation("zero", 1, f"{depth} runnable and no workers")


# The safety net's growth per tick: while the oldest job is over its target, and
# while it is on course to be (within the lead time).
NET_GROWTH_LATE = 2.0
NET_GROWTH_DUE = 1.5


def late_backlog(metrics: PoolMetrics, lead: float, age_target: float) -> bool:
    """Whether the oldest runnable job is over ``age_target``, or will be within ``lead`` seconds."""
    return metrics.runnable_depth > 0 and metrics.oldest_runnable_age + lead >= age_target


def backlog_is_late(inputs: SignalInputs) -> bool:
    """``late_backlog`` for the signals' inputs."""
    return late_backlog(inputs.metrics, inputs.lead_time, inputs.policy.targets.age)


def safety_net_signal(inputs: SignalInputs) -> SignalRecommendation | None:
    """Grow by a factor every tick while the backlog is late, whatever the estimates say.

    The other signals size the pool through estimates of how fast a worker
    works, and an estimate can be wrong on a workload it was never tried on
    (a tail of long jobs, a change of mix).  The oldest job's age cannot be:
    while it is over the target (x ``NET_GROWTH_LATE``), or within the lead
    time of it (x ``NET_GROWTH_DUE``), the pool grows from the workers that
    are up -- the ones still starting are growth already on its way -- until
    a cap, a limit or a measured ceiling binds.  ``decide`` also never
    scales a pool in while this holds.
    """
    if not backlog_is_late(inputs):
        return None
    metrics, obs, target = inputs.metrics, inputs.obs, inputs.policy.targets.age
    late = metrics.oldest_runnable_age > target
    factor = NET_GROWTH_LATE if late else NET_GROWTH_DUE
    wanted = max(obs.current, math.ceil(obs.active * factor - _EPSILON), 1)  # never below current: no scale-in
    relation = "over" if late else "within the lead time of"
    return SignalRecommendation(
        "safety", wanted,
        f"oldest job {metrics.oldest_runnable_age:.1f}s {relation} target {target:g}s: "
        f"{obs.active} working workers x {factor:g}")


def sustained_need(inputs: SignalInputs, raw: int) -> int:
    """The part of ``raw`` that keeps up with arrivals, without draining the backlog.

    Without a backlog that is all of ``raw``: the age and drain signals have
    no opinion and the others read the jobs that arrivals keep running.  With
    one, the age and drain signals add the backlog's share and the
    utilisation and CPU signals read a pool the backlog keeps busy; keeping
    up then takes the base arrival rate over the per-worker throughput, at
    the utilisation target (what the utilisation signal says of that load
    once the backlog is gone).  Never more than ``raw``; ``raw`` while no
    throughput is known.
    """
    if inputs.metrics.coming_due > 0 and inputs.throughput is not None:
        keep_up = _workers(inputs.arrivals / (inputs.throughput * inputs.policy.targets.utilisation))
        return min(raw, keep_up)
    if inputs.metrics.runnable_depth == 0 or inputs.throughput is None:
        return raw
    keep_up = _workers(inputs.arrivals / (inputs.throughput * inputs.policy.targets.utilisation))
    return min(raw, keep_up)


Signal = Callable[[SignalInputs], "SignalRecommendation | None"]

# In this order: on a tie, the earlier signal is named the winner.
SIGNALS: tuple[Signal, ...] = (age_signal, drain_signal, depth_signal, utilisation_signal, cpu_signal,
                               saturation_signal, coming_due_signal, from_zero_signal, safety_net_signal)


def recommend_all(inputs: SignalInputs) -> tuple[SignalRecommendation, ...]:
    """Every signal with an opinion, in ``SIGNALS`` order."""
    opinions = (signal(inputs) for signal in SIGNALS)
    return tuple(opinion for opinion in opinions if opinion is not None)
