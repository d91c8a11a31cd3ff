"""Settle: how an attempt ends (ack, release, fail, dead), once, and only by its owner.

Part of the store's contract: it runs on both dialects through the ``backend`` fixture
(tests/unit/conftest.py).  Time is always the ``now=`` argument: nothing here sleeps or
reads a clock.
"""

from __future__ import annotations

import pytest

from flexiqd.errors import PayloadError
from flexiqd.queue import ClaimRequest, JobState, Outcome

from contract_support import LEASE, T0, claim, enqueue, ids_of, outcomes


def test_ack_finishes_the_job_and_keeps_its_result(backend):
    [job_id] = enqueue(backend)
    claim(backend, "w1")
    assert backend.settle("w1", [Outcome.ack(job_id, {"ok": [1, 2]})], now=T0 + 4) == [job_id]
    job = backend.get(job_id)
    assert (job.state, job.result, job.error, job.finished_at) == (JobState.DONE, {"ok": [1, 2]}, None, T0 + 4)
    assert (job.lease_owner, job.lease_expires) == (None, None)
    assert claim(backend, "w2", now=T0 + 100) == []
    assert backend.cancel(job_id, now=T0 + 5) is False


def test_release_makes_the_job_runnable_at_once_without_using_an_attempt(backend):
    [job_id] = enqueue(backend, max_attempts=1)
    for i in range(5):
        now = T0 + i
        [job] = claim(backend, f"w{i}", now=now)
        assert (job.id, job.attempts) == (job_id, 1)
        assert backend.settle(f"w{i}", [Outcome.release(job_id)], now=now) == [job_id]
        job = backend.get(job_id)
        assert (job.state, job.attempts, job.lease_owner) == (JobState.QUEUED, 0, None)
        assert job.run_at <= now
        assert backend.stats("default", now=now).runnable == 1
    assert outcomes(backend, job_id) == ["release"] * 5


def test_fail_retries_later_with_backoff_then_dead_letters_keeping_the_error(backend):
    [job_id] = enqueue(backend, max_attempts=3)
    now = T0
    for attempt in (1, 2):
        [job] = claim(backend, "w1", now=now)
        assert job.attempts == attempt
        assert backend.settle("w1", [Outcome.fail(job_id, f"boom {attempt}")], now=now) == [job_id]
        job = backend.get(job_id)
        assert job.state is JobState.QUEUED
        assert now < job.run_at <= now + 300  # backed off, bounded
        assert job.error == f"boom {attempt}"
        assert claim(backend, "w2", now=now) == []
        stats = backend.stats("default", now=now)
        assert (stats.runnable, stats.delayed, stats.running) == (0, 1, 0)
        now = job.run_at
    claim(backend, "w1", now=now)
    assert backend.settle("w1", [Outcome.fail(job_id, "boom 3")], now=now) == [job_id]
    job = backend.get(job_id)
    assert (job.state, job.attempts, job.error, job.finished_at) == (JobState.DEAD, 3, "boom 3", now)
    assert backend.stats("default", now=now + 1000).dead == 1
    assert claim(backend, "w1", now=now + 1000) == []
    assert outcomes(backend, job_id) == ["fail", "fail", "fail"]


def test_dead_outcome_dead_letters_at_once(backend):
    [job_id] = enqueue(backend, max_attempts=10)
    claim(backend, "w1")
    assert backend.settle("w1", [Outcome.dead(job_id, "unknown task t")], now=T0 + 1) == [job_id]
    job = backend.get(job_id)
    assert (job.state, job.attempts, job.error) == (JobState.DEAD, 1, "unknown task t")


def test_settling_a_job_held_by_another_owner_is_ignored(backend):
    [job_id] = enqueue(backend)
    claim(backend, "w1")
    for outcome in (Outcome.ack(job_id), Outcome.fail(job_id, "x"), Outcome.dead(job_id, "x"),
                    Outcome.release(job_id)):
        assert backend.settle("w2", [outcome], now=T0 + 1) == []
    job = backend.get(job_id)
    assert (job.state, job.lease_owner, job.attempts) == (JobState.RUNNING, "w1", 1)
    assert backend.executions(job_id=job_id) == []


def test_settling_queued_unknown_or_finished_jobs_is_ignored(backend):
    done, queued = enqueue(backend, 2)
    claim(backend, "w1", limit=1)
    assert backend.settle("w1", [Outcome.ack(done)], now=T0 + 1) == [done]
    assert backend.settle("w1", [Outcome.ack(done), Outcome.ack(queued), Outcome.ack(12345)],
                          now=T0 + 2) == []
    assert backend.get(queued).state is JobState.QUEUED
    assert outcomes(backend, done) == ["ack"]
    assert backend.settle("w1", [], now=T0 + 2) == []


def test_after_expiry_and_reclaim_the_second_owners_ack_wins(backend):
    [job_id] = enqueue(backend)
    claim(backend, "w1", lease=10)
    [job] = claim(backend, "w2", now=T0 + 11, lease=10)
    assert job.id == job_id
    # w1 comes back late: its ack is dropped, whatever the order of the two acks.
    assert backend.settle("w1", [Outcome.ack(job_id, "from w1")], now=T0 + 12) == []
    assert backend.renew("w1", [job_id], 30, now=T0 + 12) == []
    assert backend.get(job_id).state is JobState.RUNNING
    assert backend.settle("w2", [Outcome.ack(job_id, "from w2")], now=T0 + 13) == [job_id]
    assert backend.settle("w1", [Outcome.ack(job_id, "from w1")], now=T0 + 14) == []
    job = backend.get(job_id)
    assert (job.state, job.result, job.attempts) == (JobState.DONE, "from w2", 2)
    assert [(r["worker"], r["outcome"], r["attempt"]) for r in backend.executions(job_id=job_id)] == [
        ("w1", "lost", 1), ("w2", "ack", 2)]
    stats = backend.stats("default", now=T0 + 14)
    assert stats.completion_rate * stats.window == pytest.approx(1)


def test_a_late_ack_counts_until_the_lease_is_recovered(backend):
    kept, lost = enqueue(backend, 2)
    claim(backend, "w1", lease=10)
    # Expired but not yet recovered: nobody else has the job, so the work done is kept.
    assert backend.settle("w1", [Outcome.ack(kept)], now=T0 + 20) == [kept]
    assert backend.recover_expired(now=T0 + 21) == 1
    # Recovered: the job is queued again and the late ack must not finish it under its new run.
    assert backend.settle("w1", [Outcome.ack(lost)], now=T0 + 22) == []
    assert (backend.get(kept).state, backend.get(lost).state) == (JobState.DONE, JobState.QUEUED)


def test_an_outcome_repeated_in_one_call_is_applied_once(backend):
    [job_id] = enqueue(backend)
    claim(backend, "w1")
    assert backend.settle("w1", [Outcome.ack(job_id, 1), Outcome.ack(job_id, 2),
                                 Outcome.fail(job_id, "late")], now=T0 + 1) == [job_id]
    job = backend.get(job_id)
    assert (job.state, job.result, job.error) == (JobState.DONE, 1, None)
    assert outcomes(backend, job_id) == ["ack"]
    stats = backend.stats("default", now=T0 + 1)
    assert stats.completion_rate * stats.window == pytest.approx(1)
    assert stats.failure_rate == 0


def test_a_result_that_is_not_json_settles_nothing(backend):
    first, second = enqueue(backend, 2)
    claim(backend, "w1")
    with pytest.raises(PayloadError):
        backend.settle("w1", [Outcome.ack(first), Outcome.ack(second, object())], now=T0 + 1)
    assert {backend.get(j).state for j in (first, second)} == {JobState.RUNNING}
    assert backend.executions() == []


def test_settle_and_claim_settles_then_claims_in_one_call(backend):
    first, second, third = enqueue(backend, 3)
    claim(backend, "w1", limit=1)
    request = ClaimRequest(owner="w1", queues=("default",), limit=2, lease_seconds=LEASE)
    settled, claimed = backend.settle_and_claim("w1", [Outcome.ack(first)], request, now=T0 + 1)
    assert settled == [first]
    assert ids_of(claimed) == [second, third]
    assert backend.get(first).state is JobState.DONE
    settled, claimed = backend.settle_and_claim(
        "w1", [Outcome.ack(second), Outcome.ack(first)], None, now=T0 + 2)
    assert (settled, claimed) == ([second], [])
    # Settling someone else's job settles nothing; the claim still happens (nothing is left).
    settled, claimed = backend.settle_and_claim(
        "w2", [Outcome.ack(third)], ClaimRequest(owner="w2", queues=("default",), limit=2), now=T0 + 3)
    assert (settled, claimed) == ([], [])
    assert backend.get(third).lease_owner == "w1"


def test_settle_and_claim_hands_a_released_job_to_the_same_call(backend):
    [job_id] = enqueue(backend, max_attempts=1)
    claim(backend, "w1")
    request = ClaimRequest(owner="w2", queues=("default",), limit=1)
    settled, claimed = backend.settle_and_claim("w1", [Outcome.release(job_id)], request, now=T0 + 1)
    assert settled == [job_id]
    assert [(j.id, j.lease_owner, j.attempts) for j in claimed] == [(job_id, "w2", 1)]
