"""The autoscaler does not scale up for jobs waiting on a dependency: more workers would
not start them sooner.  Stats come from a real store, through the daemon's own mapping
(``PoolMetrics.from_queues``) into the real policy."""

from __future__ import annotations

from flexiqd.policy import PoolMetrics
from flexiqd.policy import Observation, PoolPolicy
from flexiqd.queue import ClaimRequest, NewJob, Outcome
from flexiqd.queue.limits import DependencyLimit

from test_policy_support import run

T0 = 1_700_000_000.0
LIMIT = DependencyLimit("partner_api", concurrency=3)


def _backlog(backend, *, deferred: bool):
    """500 jobs enqueued; one worker claimed 4 and ran 3 inside the full dependency.  With
    ``deferred`` the other jobs were claimed, refused and deferred: all wait for the dependency."""
    backend.enqueue([NewJob(task="t", payload=i) for i in range(500)], now=T0)
    jobs = backend.claim(ClaimRequest("w1", ("default",), 500 if deferred else 3, 600), now=T0)
    refusals = {job.id: backend.admit("w1", job.id, [LIMIT], now=T0) for job in jobs}
    assert sum(r is None for r in refusals.values()) == 3
    backend.settle("w1", [Outcome.defer(i, r) for i, r in refusals.items() if r is not None], now=T0)


def _decisions(backend):
    ticks = []
    for second in range(0, 10):
        now = T0 + second
        # The waits of a full dependency are short (its jobs keep coming back): ask with a
        # horizon that covers them all, as a long lead time would.
        stats = backend.stats("default", now=now, horizon=3600)
        observation = Observation(pool="default", active=1, starting=0, draining=0, concurrency=4,
                                  metrics=PoolMetrics.from_queues([stats]))
        ticks.append((now, observation))
    return run(PoolPolicy(min_workers=1, max_workers=20), ticks), stats


def test_a_backlog_all_waiting_for_a_dependency_does_not_scale_the_pool_up(backend):
    _backlog(backend, deferred=True)
    decisions, stats = _decisions(backend)
    assert stats.waiting_for_dependency > 400 and stats.runnable == 0 and stats.coming_due == 0
    assert [d.desired for d in decisions] == [1] * len(decisions), [d.line() for d in decisions]


def test_the_same_backlog_runnable_does_scale_it_up(backend):
    _backlog(backend, deferred=False)
    decisions, stats = _decisions(backend)
    assert stats.runnable == 497 and stats.waiting_for_dependency == 0
    assert max(d.desired for d in decisions) > 1
