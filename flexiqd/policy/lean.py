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
drain and utilisation signals are capped at it (``cap_to_lean``), so the pool
may run busier than the utilisation target, and keep a backlog, while the age
target holds.  Never:

- more than one worker short of what the arrivals need (a pool further short
  falls behind faster than one worker more can catch up once the horizon has
  passed);
- fewer workers than hold the jobs running now (a worker stopped mid-job keeps
  its slots until its jobs end: a pool with a few 600 s jobs among quick ones
  otherwise cycled through a dozen draining workers);
- while arrivals rise (the last minute's rate ``RISE`` times the base rate:
  the count a crowd needs is not known yet);
- with an explicit ``targets.drain_time``: the operator asked for every backlog
  to drain within it, and a lean pool keeps one on purpose.

A backlog kept on purpose is not a ceiling's evidence: while the pool holds
or shrinks on the lean count, the knee takes no count, and growth off it (within
two ticks) is neither a step nor capped (``knee``).

Pure.
"""

from __future__ import annotations

import math

from .signals import SignalInputs
from .types import SignalRecommendation

# The signals the lean count caps: the ones that size the pool from its arrivals and backlog.
# The safety net, work coming due and a pool with no workers are not capped.
CAPPED_SIGNALS = frozenset({"age", "drain", "util"})

# Jobs arriving over this many lead times must start in time too: a worker asked for once the
# lean count no longer holds is claiming within one lead time, and the second is the margin.
HORIZON_LEADS = 2.0

# Random arrivals over the horizon: this many standard deviations (Poisson) more of them.
SIGMAS = 2.0

# Arrivals over the last rate window this many times the base rate are a rise, not noise (a
# 60 s count of 4 jobs/s spreads by about 6 %).
RISE = 1.25

# The search for the fewest workers stops here: a pool this large is not run lean.
_MOST = 100_000


def lean_count(inputs: SignalInputs) -> int | None:
    """The fewest workers that keep every job within the age target over the horizon (see the
    module), or None when the pool does not run lean."""
    metrics, policy = inputs.metrics, inputs.policy
    per_worker = inputs.backlog_throughput or inputs.throughput
    if policy.targets.drain_time is not None or not inputs.throughput or inputs.arrivals <= 0:
        return None
    rate = max(inputs.arrivals, metrics.arrival_rate or 0.0)
    if rate > RISE * inputs.arrivals:
        return None
    lead = inputs.lead_time
    start_within = policy.targets.age - lead
    waited = metrics.oldest_runnable_age if metrics.runnable_depth else 0.0
    horizon = HORIZON_LEADS * lead
    more = SIGMAS * math.sqrt(rate * horizon)
    concurrency = inputs.obs.concurrency
    fewest = max(1, math.ceil(rate / inputs.throughput - 1e-9) - 1, math.ceil(metrics.running / concurrency - 1e-9))
    for workers in range(fewest, _MOST):
        pace = workers * per_worker
        ahead = metrics.runnable_depth + max(0.0, rate - pace) * horizon + more
        # The last of them starts once every job ahead of it has: first come, first served.
        if waited + ahead / pace <= start_within:
            return workers
    return None


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
