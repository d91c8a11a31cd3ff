"""Running lean: no more workers than the age target needs.

The signals size a pool to keep up with its arrivals at the utilisation
target, and to drain a backlog as it comes.  Where the arrivals need a
fraction of a worker more than a whole count (1.35 workers' worth of jobs),
that holds the next whole count and its idle slots all the time, while the age
target would let the pool run one worker fewer, let a backlog build within the
target, and add the worker back for a while when the backlog would otherwise
be late (the saw-tooth a clairvoyant scaler runs: a trickle that needs 1.35
workers of 4 slots held 2, and about 1.35 on average is enough).

``lean_count`` is the fewest workers with which every job -- the ones waiting
now and the ones that arrive over the next ``HORIZON_LEADS`` lead times (the
time a worker asked for later takes to claim a job), ``SIGMAS`` Poisson
deviations more -- still starts within the age target less the lead time, at
the measured per-worker throughput, first come first served.  The age,
drain, utilisation and from-zero signals are capped at it (``cap_to_lean``),
so the pool may run busier than the utilisation target, and keep a backlog,
while the age target holds.

- A worker is given back only while the fewer would hold a lead time longer:
  otherwise the pool gives it back at one tick and asks for it again at the
  next.
- A pool that may scale to zero pauses with no worker while one asked for a
  lead time later still starts every job in time (``pause``), and gives its
  last worker back only for a pause of at least a lead time: a shorter one
  saves less than the start costs.

Never:

- more than one worker short of what the arrivals need (a pool further short
  falls behind faster than one worker more can catch up once the horizon has
  passed);
- fewer workers than hold the jobs running now, once they have run longer than
  a tick (a worker stopped mid-job keeps its slots until its jobs end: a pool
  with a few 600 s jobs among quick ones otherwise cycled through a dozen
  draining workers; quick jobs end before the next tick);
- while arrivals rise: the last minute's rate ``RISE`` times the base rate and
  the rate ``RISE_LOOKBACK`` seconds ago (the count a crowd needs is not known
  yet; a load that stepped up and has stayed there is level again once the last
  minute has settled);
- with an explicit ``targets.drain_time``: the operator asked for every backlog
  to drain within it, and a lean pool keeps one on purpose.

A backlog kept on purpose is not a ceiling's evidence: while the pool holds
or shrinks on the lean count, the knee takes no count, and growth off it (within
two ticks) is neither a step nor capped (``knee``).

Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .signals import SignalInputs
from .types import LoadSample, SignalRecommendation

# The signals the lean count caps: the ones that size the pool from its arrivals and backlog.
# The safety net, work coming due and a pool with no workers are not capped.
CAPPED_SIGNALS = frozenset({"age", "drain", "util", "zero"})

# Jobs arriving over this many lead times must start in time too: a worker asked for once the
# lean count no longer holds is claiming within one lead time, and the second is the margin.
HORIZON_LEADS = 2.0

# Random arrivals over the horizon: this many standard deviations (Poisson) more of them.
SIGMAS = 2.0

# Arrivals over the last rate window this many times the base rate, and the rate this long ago,
# are a rise, not noise (a 60 s count of 4 jobs/s spreads by about 6 %).
RISE = 1.25
RISE_LOOKBACK = 30.0

# The search for the fewest workers stops here: a pool this large is not run lean.
_MOST = 100_000


@dataclass(frozen=True)
class _Queue:
    """The jobs ahead of a worker count: ``rate`` arrivals a second, each worker starting
    ``per_worker`` of them a second; a job must start within ``start_within`` seconds of
    becoming runnable; the arrivals over ``horizon`` seconds count, ``more`` of them for chance."""

    rate: float
    per_worker: float
    lead: float
    start_within: float
    horizon: float
    more: float

    def last_start(self, workers: int, depth: float) -> float:
        """Seconds until ``workers`` have started the ``depth`` jobs waiting and the arrivals over
        the horizon they fall behind by: first come, first served, the last starts once every
        job ahead of it has."""
        pace = workers * self.per_worker
        return (depth + max(0.0, self.rate - pace) * self.horizon + self.more) / pace

    def in_time(self, workers: int, waited: float, depth: float) -> bool:
        """Whether ``workers`` start every job in time: ``depth`` waiting, the oldest ``waited``
        seconds old, and the arrivals over the horizon."""
        return waited + self.last_start(workers, depth) <= self.start_within

    def pause(self, waited: float, depth: float) -> float:
        """How long the pool may run no worker before it asks for one that still starts every job
        in time (the worker claims a lead time after it is asked for; the jobs arriving meanwhile
        wait too); negative when that is already too late."""
        late_by = self.lead + self.last_start(1, depth + self.rate * self.lead)
        return (self.start_within - waited - late_by) / (1 + self.rate / self.per_worker)


def lean_count(inputs: SignalInputs, load: tuple[LoadSample, ...] = ()) -> int | None:
    """The fewest workers that keep every job within the age target over the horizon (see the
    module), or None when the pool does not run lean.  ``load`` ends with this tick's sample."""
    metrics, policy, current = inputs.metrics, inputs.policy, inputs.obs.current
    if policy.targets.drain_time is not None or not inputs.throughput or inputs.arrivals <= 0:
        return None
    rate = max(inputs.arrivals, metrics.arrival_rate or 0.0)
    if rising(rate, inputs.arrivals, load):
        return None
    lead = inputs.lead_time
    queue = _Queue(rate=rate, per_worker=inputs.backlog_throughput or inputs.throughput, lead=lead,
                   start_within=policy.targets.age - lead, horizon=HORIZON_LEADS * lead,
                   more=SIGMAS * math.sqrt(rate * HORIZON_LEADS * lead))
    waited = metrics.oldest_runnable_age if metrics.runnable_depth else 0.0
    depth = metrics.runnable_depth
    fewest = fewest_lean(inputs, rate)
    # Only a pool that may scale to zero pauses, and it gives its last worker back only for a
    # pause of at least a lead time.
    if fewest == 0 and policy.floor == 0 and queue.pause(waited, depth) >= (0.0 if current == 0 else lead):
        return 0
    for workers in range(max(1, fewest), _MOST):
        if workers < current:
            # Fewer than run now must hold a lead time longer (the backlog grows meanwhile).
            grows = max(0.0, rate - workers * queue.per_worker) * lead
            if queue.in_time(workers, waited + lead, depth + grows):
                return workers
        elif queue.in_time(workers, waited, depth):
            return workers
    return None


def rising(rate: float, base: float, load: tuple[LoadSample, ...]) -> bool:
    """Whether the arrivals' ``rate`` is ``RISE`` times both the ``base`` rate and the rate
    ``RISE_LOOKBACK`` seconds ago (``load``: the recent samples, this tick's last)."""
    if not load:
        return rate > RISE * base
    then = [sample.arrival_rate for sample in load
            if sample.arrival_rate is not None and sample.at <= load[-1].at - RISE_LOOKBACK]
    return rate > RISE * max(base, then[-1] if then else 0.0)


def fewest_lean(inputs: SignalInputs, rate: float) -> int:
    """The fewest workers the lean count may be: one short of what ``rate`` arrivals need, and
    the workers the running jobs fill once they have run longer than a tick."""
    fewest = max(0, math.ceil(rate / inputs.throughput - 1e-9) - 1)
    metrics = inputs.metrics
    if metrics.running_age_mean is None or metrics.running_age_mean > (inputs.obs.tick or 1.0):
        # Such jobs keep a stopped worker's slots for a while yet; quicker ones free them before
        # the next tick.
        fewest = max(fewest, math.ceil(metrics.running / inputs.obs.concurrency - 1e-9))
    return fewest


def cap_to_lean(recommendations: tuple[SignalRecommendation, ...],
                lean: int | None) -> tuple[SignalRecommendation, ...]:
    """``recommendations`` with the capped signals' counts at most ``lean`` (said in their detail)."""
    if lean is None:
        return recommendations
    noun = "worker keeps" if lean == 1 else "workers keep"
    return tuple(
        rec._replace(workers=lean, detail=f"{rec.detail}; {lean} {noun} every job within the age target")
        if rec.signal in CAPPED_SIGNALS and rec.workers > lean else rec
        for rec in recommendations)
