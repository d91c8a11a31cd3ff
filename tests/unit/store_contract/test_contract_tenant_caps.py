"""The tenant-cap contract every job-store backend keeps (``ClaimRequest.tenant_caps`` and
``Stats.held_by_tenant_cap``), run on each one through the ``backend`` fixture.

Time is always the ``now=`` argument: nothing here sleeps or reads a clock.
"""

from __future__ import annotations

import pytest

from flexiqd.queue import ClaimRequest, NewJob, Outcome
from flexiqd.queue.limits import LimitError, TenantCaps

T0 = 1_700_000_000.0
CAPS = TenantCaps({"acme": 2})


def claim(backend, n, owner="w1", *, caps=CAPS, now=T0, lease=30.0, queues=("default",)):
    return backend.claim(ClaimRequest(owner, queues, n, lease, tenant_caps=caps), now=now)


def fill(backend, tenant, n, *, now=T0, queue="default", priority=0):
    return backend.enqueue([NewJob(task="t", payload=i, tenant=tenant, queue=queue, priority=priority)
                            for i in range(n)], now=now)


def tenants_of(jobs):
    return sorted(job.tenant or "" for job in jobs)


def running_of(backend, tenant, queue="default", *, now=T0):
    stats = backend.stats(queue, now=now)
    return stats.tenants[tenant].running if tenant in stats.tenants else 0


def test_a_capped_tenant_never_runs_more_than_its_cap_and_the_others_are_claimed_meanwhile(backend):
    fill(backend, "acme", 10)            # enqueued first: ahead in the claim order
    fill(backend, "globex", 10, now=T0 + 1)
    first = claim(backend, 5, now=T0 + 1)
    assert tenants_of(first) == ["acme"] * 2 + ["globex"] * 3
    second = claim(backend, 5, owner="w2", now=T0 + 1)
    assert tenants_of(second) == ["globex"] * 5  # acme is at its cap across both workers
    assert tenants_of(claim(backend, 5, owner="w3", now=T0 + 1)) == ["globex"] * 2
    assert claim(backend, 5, owner="w4", now=T0 + 1) == []  # acme's 8 others wait for room
    stats = backend.stats("default", now=T0 + 1)
    assert (stats.tenants["acme"].running, stats.tenants["globex"].running) == (2, 10)


def test_a_settled_job_frees_its_tenants_room(backend):
    fill(backend, "acme", 10)
    held = claim(backend, 10)
    assert len(held) == 2
    backend.settle("w1", [Outcome.ack(held[0].id)], now=T0 + 1)
    [again] = claim(backend, 10, now=T0 + 1)
    assert again.tenant == "acme"
    backend.settle("w1", [Outcome.release(held[1].id)], now=T0 + 2)  # a release frees it too
    assert len(claim(backend, 10, now=T0 + 2)) == 1
    assert running_of(backend, "acme", now=T0 + 2) == 2


def test_a_recovered_worker_frees_its_tenants_room(backend):
    fill(backend, "acme", 10)
    assert len(claim(backend, 10, owner="gone", lease=5)) == 2
    assert claim(backend, 10, owner="w2", now=T0 + 1) == []
    assert backend.recover_owner("gone", now=T0 + 2, reason="worker exited") == 2
    assert len(claim(backend, 10, owner="w2", now=T0 + 2)) == 2
    # An expired lease is recovered by the next claim itself, its room freed in the same call.
    assert len(claim(backend, 10, owner="w3", lease=5, now=T0 + 100)) == 2


def test_the_cap_counts_the_tenants_running_jobs_in_every_queue(backend):
    fill(backend, "acme", 3, queue="mail")
    fill(backend, "acme", 3)
    assert len(claim(backend, 1, queues=("mail",))) == 1
    assert tenants_of(claim(backend, 10)) == ["acme"]  # one in mail, one here: at its cap of 2


def test_every_tenant_without_its_own_cap_gets_the_star_cap_and_untenanted_jobs_none(backend):
    caps = TenantCaps({"acme": 3, "*": 1})
    for tenant in ("acme", "globex", "initech", None):
        fill(backend, tenant, 5)
    claimed = claim(backend, 100, caps=caps)
    assert tenants_of(claimed) == [""] * 5 + ["acme"] * 3 + ["globex", "initech"]


def test_a_cap_of_zero_holds_the_tenants_jobs(backend):
    fill(backend, "acme", 3)
    fill(backend, "globex", 1, now=T0 + 1)
    assert tenants_of(claim(backend, 10, caps=TenantCaps({"acme": 0}), now=T0 + 1)) == ["globex"]


def test_without_caps_nothing_is_skipped(backend):
    fill(backend, "acme", 10)
    assert len(claim(backend, 10, caps=None)) == 10


def test_jobs_a_cap_holds_back_are_not_runnable_backlog(backend):
    fill(backend, "acme", 10)
    fill(backend, "globex", 3, now=T0 + 5)
    claim(backend, 3, now=T0 + 10)  # acme's two, one of globex's
    stats = backend.stats("default", now=T0 + 10)
    acme = stats.tenants["acme"]
    assert (acme.running, acme.runnable, acme.held_by_tenant_cap, acme.oldest_runnable_age) == (2, 0, 8, 0)
    globex = stats.tenants["globex"]
    assert (globex.runnable, globex.held_by_tenant_cap, globex.oldest_runnable_age) == (2, 0, 5)
    assert (stats.runnable, stats.held_by_tenant_cap, stats.oldest_runnable_age) == (2, 8, 5)
    assert stats.as_dict()["held_by_tenant_cap"] == 8


def test_a_tenant_below_its_cap_has_only_its_room_runnable(backend):
    fill(backend, "acme", 10)
    claim(backend, 1, caps=TenantCaps({"acme": 4}))
    stats = backend.stats("default", now=T0 + 1)
    assert (stats.tenants["acme"].runnable, stats.tenants["acme"].held_by_tenant_cap) == (3, 6)
    assert stats.tenants["acme"].oldest_runnable_age == 1


def test_the_store_keeps_the_caps_last_claimed_with(backend):
    fill(backend, "acme", 10)
    claim(backend, 1)
    assert backend.stats("default", now=T0).held_by_tenant_cap == 8
    # A claim without caps (a worker without a config file) leaves them as they are ...
    backend.claim(ClaimRequest("w9", ("default",), 0), now=T0)
    claim(backend, 0, caps=None)
    assert backend.stats("default", now=T0).held_by_tenant_cap == 8
    # ... and caps lifted by a reload are lifted in the stats too.
    claim(backend, 1, caps=TenantCaps({}))
    stats = backend.stats("default", now=T0)
    assert (stats.runnable, stats.held_by_tenant_cap) == (8, 0)


def test_a_capped_claim_keeps_the_claim_order(backend):
    fill(backend, "acme", 4, priority=5)
    fill(backend, "globex", 4)
    fill(backend, None, 2, priority=9)
    claimed = claim(backend, 6)
    assert [(job.tenant, job.priority) for job in claimed] == [
        (None, 9), (None, 9), ("acme", 5), ("acme", 5), ("globex", 0), ("globex", 0)]


@pytest.mark.parametrize("caps, key", [({"acme": -1}, "acme.max_running"),
                                       ({"acme": 1.5}, "acme.max_running"),
                                       ({"acme": True}, "acme.max_running"),
                                       ({"": 3}, "tenants")])
def test_a_bad_cap_names_its_key(caps, key):
    with pytest.raises(LimitError) as raised:
        TenantCaps(caps)
    assert raised.value.key == key


def test_with_a_tenant_at_its_cap_the_others_are_claimed_in_claim_order(backend):
    fill(backend, "acme", 2)
    assert len(claim(backend, 2)) == 2  # acme is at its cap from here on
    fill(backend, "acme", 50, now=T0 + 1, priority=9)
    fill(backend, "globex", 3, now=T0 + 2)
    fill(backend, "initech", 2, now=T0 + 3, priority=3)
    fill(backend, None, 1, now=T0 + 4, priority=1)
    claimed = claim(backend, 4, now=T0 + 5)
    assert [(job.tenant, job.priority) for job in claimed] == [
        ("initech", 3), ("initech", 3), (None, 1), ("globex", 0)]
    assert [job.run_at for job in claim(backend, 10, now=T0 + 5)] == [T0 + 2, T0 + 2]


def test_with_more_tenants_than_heads_read_the_claim_walks_past_the_capped_ones(backend, monkeypatch):
    import importlib

    for name in ("flexiqd.queue.sqlite.sql", "flexiqd.queue.postgres.sql"):
        try:
            monkeypatch.setattr(importlib.import_module(name), "_HEADS_MAX", 1)
        except ImportError:  # no psycopg: only the SQLite store runs here
            pass
    test_with_a_tenant_at_its_cap_the_others_are_claimed_in_claim_order(backend)
