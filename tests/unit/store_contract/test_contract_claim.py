"""Claim: which jobs a worker leases, in what order, and never one job twice.

Part of the store's contract: it runs on both dialects through the ``backend`` fixture
(tests/unit/conftest.py).  Time is always the ``now=`` argument: nothing here sleeps or
reads a clock.
"""

from __future__ import annotations

from flexiqd.queue import JobState, NewJob

from contract_support import T0, claim, enqueue, ids_of


def test_claim_order_is_priority_then_run_at_then_id(backend):
    spec = [(0, 5.0), (1, 9.0), (0, 1.0), (1, 2.0), (-1, 0.0), (0, 1.0), (1, 2.0), (2, 50.0)]
    ids = backend.enqueue([NewJob(task="t", priority=p, run_at=T0 + r) for p, r in spec], now=T0)
    expected = [job_id for job_id, _ in sorted(zip(ids, spec), key=lambda x: (-x[1][0], x[1][1], x[0]))]
    now = T0 + 100
    one_by_one = [job.id for _ in ids for job in claim(backend, limit=1, now=now)]
    assert one_by_one == expected


def test_claim_returns_its_batch_in_claim_order(backend):
    ids = backend.enqueue([NewJob(task="t", priority=i % 3, run_at=T0 - i) for i in range(12)], now=T0)
    by_order = sorted(ids, key=lambda job_id: (-(ids.index(job_id) % 3), -ids.index(job_id)))
    assert ids_of(claim(backend, limit=12)) == by_order


def test_claim_leases_and_counts_an_attempt(backend):
    [job_id] = enqueue(backend)
    [job] = claim(backend, "w1", now=T0 + 2, lease=15)
    assert job.id == job_id
    assert (job.state, job.lease_owner, job.lease_expires, job.attempts, job.started_at) == (
        JobState.RUNNING, "w1", T0 + 17, 1, T0 + 2)
    assert backend.get(job_id) == job


def test_claim_respects_its_limit_and_never_hands_out_a_job_twice(backend):
    ids = enqueue(backend, 10)
    first = claim(backend, "w1", limit=3)
    second = claim(backend, "w2", limit=4)
    third = claim(backend, "w3", limit=100)
    assert [len(first), len(second), len(third)] == [3, 4, 3]
    assert sorted(ids_of(first + second + third)) == ids
    assert claim(backend, "w4") == []
    assert claim(backend, "w4", limit=0) == []


def test_claim_prefers_queues_in_the_order_given_and_ignores_others(backend):
    low = enqueue(backend, 3, queue="low")
    high = enqueue(backend, 2, queue="high", now=T0 + 1)
    other = enqueue(backend, 2, queue="other")
    got = claim(backend, limit=4, queues=("high", "low"), now=T0 + 2)
    assert ids_of(got) == high + low[:2]
    assert {backend.get(job_id).state for job_id in other} == {JobState.QUEUED}


def test_delayed_jobs_are_not_claimable_nor_runnable_before_run_at(backend):
    [job_id] = enqueue(backend, delay=60)
    assert claim(backend, now=T0 + 59.999) == []
    stats = backend.stats("default", now=T0 + 59.999)
    assert (stats.runnable, stats.delayed, stats.oldest_runnable_age) == (0, 1, 0.0)
    stats = backend.stats("default", now=T0 + 60)
    assert (stats.runnable, stats.delayed) == (1, 0)
    assert ids_of(claim(backend, now=T0 + 60)) == [job_id]


def test_stats_say_when_the_next_delayed_job_comes_due(backend):
    assert backend.stats("default", now=T0).next_due is None
    enqueue(backend, delay=60)
    [sooner] = enqueue(backend, delay=20)
    enqueue(backend, delay=5, queue="other")
    assert backend.stats("default", now=T0).next_due == T0 + 20
    claim(backend, now=T0 + 20)  # the first comes due and runs: the next is the other one
    assert backend.stats("default", now=T0 + 20).next_due == T0 + 60
    assert backend.get(sooner).state is JobState.RUNNING
    claim(backend, now=T0 + 60)
    assert backend.stats("default", now=T0 + 60).next_due is None


def test_a_job_coming_due_right_after_a_claim_is_claimed_by_the_next(backend):
    # A worker's claims look for due jobs only now and then while they find work; one that
    # finds none looks all the same, however recently the last one looked.
    [job_id] = enqueue(backend, delay=0.01)
    assert claim(backend, now=T0) == []
    assert ids_of(claim(backend, now=T0 + 0.01)) == [job_id]
    [second] = enqueue(backend, delay=0.02, now=T0 + 0.01)
    [third] = enqueue(backend, now=T0 + 0.01)
    assert ids_of(claim(backend, limit=2, now=T0 + 0.03)) == [third, second]
