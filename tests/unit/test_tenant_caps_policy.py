"""The autoscaler does not scale up for the jobs a tenant cap holds back: more workers would
not start them sooner, while the other tenants' backlog still scales the pool.  Stats come
from a real store, through the daemon's own mapping (``PoolMetrics.from_queues``) into the real policy."""

from __future__ import annotations

from flexiqd.policy import PoolMetrics
from flexiqd.policy import Observation, PoolPolicy
from flexiqd.queue import ClaimRequest, NewJob
from flexiqd.queue.limits import TenantCaps

from test_policy_support import run

T0 = 1_700_000_000.0
CAPS = TenantCaps({"bulk": 4})


def _backlog(backend, tenant_caps):
    """500 jobs of one tenant, enqueued a minute ago; two workers of 4 slots run 4 of them
    (utilisation 0.5: what is asked here is the age and drain signals)."""
    backend.enqueue([NewJob(task="t", payload=i, tenant="bulk") for i in range(500)], now=T0 - 60)
    backend.claim(ClaimRequest("w1", ("default",), 4, 600, tenant_caps=tenant_caps), now=T0)


def _decisions(backend):
    ticks = []
    for second in range(0, 10):
        now = T0 + second
        stats = backend.stats("default", now=now, horizon=3600)
        observation = Observation(pool="default", active=2, starting=0, draining=0, concurrency=4,
                                  metrics=PoolMetrics.from_queues([stats]))
        ticks.append((now, observation))
    return run(PoolPolicy(min_workers=1, max_workers=20), ticks), stats


def test_a_backlog_held_back_by_its_tenants_cap_does_not_scale_the_pool_up(backend):
    _backlog(backend, CAPS)
    decisions, stats = _decisions(backend)
    assert (stats.runnable, stats.held_by_tenant_cap, stats.oldest_runnable_age) == (0, 496, 0)
    assert max(d.desired for d in decisions) <= 2, [d.line() for d in decisions]


def test_the_same_backlog_without_a_cap_does_scale_it_up(backend):
    _backlog(backend, TenantCaps())
    decisions, stats = _decisions(backend)
    assert (stats.runnable, stats.held_by_tenant_cap) == (496, 0)
    assert stats.oldest_runnable_age >= 60
    assert max(d.desired for d in decisions) > 2


def test_another_tenants_backlog_beside_a_capped_one_still_scales_it_up(backend):
    _backlog(backend, CAPS)
    backend.enqueue([NewJob(task="t", payload=i, tenant="shop") for i in range(300)], now=T0 - 60)
    decisions, stats = _decisions(backend)
    assert (stats.runnable, stats.held_by_tenant_cap) == (300, 496)
    assert max(d.desired for d in decisions) > 2
