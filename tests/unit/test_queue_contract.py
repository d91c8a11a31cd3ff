"""The contract every job-store backend keeps, run on each one (see conftest.BACKENDS).

Time is always the ``now=`` argument: nothing here sleeps or reads a clock.
"""

from __future__ import annotations

import math
import os
import subprocess

import pytest

from flexiqd.errors import JobNotFound, PayloadError, QueueError
from flexiqd.queue import ClaimRequest, JobState, NewJob, Outcome
from flexiqd.queue.owners import owner_name
from flexiqd.queue.types import RECENT_WINDOW

T0 = 1_700_000_000.0
LEASE = 30.0


def enqueue(backend, n=1, *, now=T0, **fields):
    return backend.enqueue([NewJob(task="t", payload=i, **fields) for i in range(n)], now=now)


def claim(backend, owner="w1", limit=100, *, now=T0, queues=("default",), lease=LEASE):
    return backend.claim(ClaimRequest(owner=owner, queues=tuple(queues), limit=limit,
                                      lease_seconds=lease), now=now)


def ids_of(jobs):
    return [job.id for job in jobs]


def all_jobs(backend):
    return backend.list_jobs(limit=1_000_000)


def outcomes(backend, job_id):
    return [row["outcome"] for row in backend.executions(job_id=job_id)]


# -- enqueue -------------------------------------------------------------------------------

def test_enqueue_one_stores_every_field(backend):
    [job_id] = backend.enqueue([NewJob(task="mail.send", payload={"to": ["a@b"], "n": 1.5},
                                       queue="mail", priority=3, max_attempts=5, timeout=12.5,
                                       idempotency_key="k1", tenant="acme")], now=T0)
    job = backend.get(job_id)
    assert (job.id, job.queue, job.task, job.payload) == (job_id, "mail", "mail.send",
                                                          {"to": ["a@b"], "n": 1.5})
    assert (job.priority, job.state, job.run_at, job.attempts, job.max_attempts) == (
        3, JobState.QUEUED, T0, 0, 5)
    assert (job.timeout, job.idempotency_key, job.tenant) == (12.5, "k1", "acme")
    assert (job.lease_owner, job.lease_expires, job.started_at, job.finished_at) == (None,) * 4
    assert job.enqueued_at == T0
    assert (job.result, job.error) == (None, None)


def test_enqueue_batch_returns_distinct_ids_in_order(backend):
    ids = backend.enqueue([NewJob(task="t", payload={"i": i}) for i in range(50)], now=T0)
    assert len(ids) == len(set(ids)) == 50
    assert ids == sorted(ids)
    assert [backend.get(job_id).payload for job_id in ids] == [{"i": i} for i in range(50)]
    assert backend.stats("default", now=T0).runnable == 50


def test_enqueue_nothing_is_a_no_op(backend):
    assert backend.enqueue([], now=T0) == []
    assert all_jobs(backend) == []


@pytest.mark.parametrize("bad", [object(), {1, 2}, b"bytes", float("nan"), {"x": float("inf")}],
                         ids=["object", "set", "bytes", "nan", "nested-inf"])
def test_a_batch_with_one_payload_that_is_not_json_stores_nothing(backend, bad):
    enqueue(backend, 2)
    with pytest.raises(PayloadError, match="not JSON"):
        backend.enqueue([NewJob(task="t", payload=1), NewJob(task="t", payload=bad),
                         NewJob(task="t", payload=3)], now=T0 + 1)
    assert len(all_jobs(backend)) == 2
    stats = backend.stats("default", now=T0 + 1)
    assert stats.runnable == 2
    assert stats.arrival_rate * stats.window == pytest.approx(2)


@pytest.mark.parametrize("bad", [NewJob(task="t", max_attempts=0), NewJob(task="")],
                         ids=["no-attempts", "no-task"])
def test_a_batch_with_one_invalid_job_stores_nothing(backend, bad):
    with pytest.raises(QueueError):
        backend.enqueue([NewJob(task="t"), bad], now=T0)
    assert all_jobs(backend) == []


def test_run_at_wins_over_delay_and_delay_is_from_now(backend):
    delayed, scheduled, negative = backend.enqueue(
        [NewJob(task="t", delay=10), NewJob(task="t", delay=10, run_at=T0 + 99),
         NewJob(task="t", delay=-5)], now=T0)
    assert backend.get(delayed).run_at == T0 + 10
    assert backend.get(scheduled).run_at == T0 + 99
    assert backend.get(negative).run_at == T0


# -- claim ---------------------------------------------------------------------------------

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


# -- leases --------------------------------------------------------------------------------

def test_an_expired_lease_makes_the_job_runnable_again_with_the_attempt_counted(backend):
    [job_id] = enqueue(backend, max_attempts=3)
    claim(backend, "w1", lease=10)
    assert backend.recover_expired(now=T0 + 10) == 0  # valid through its expiry instant
    assert backend.recover_expired(now=T0 + 10.5) == 1
    job = backend.get(job_id)
    assert (job.state, job.attempts, job.lease_owner, job.lease_expires) == (JobState.QUEUED, 1, None, None)
    assert "w1" in job.error and "expired" in job.error
    assert backend.recover_expired(now=T0 + 11) == 0  # idempotent
    stats = backend.stats("default", now=T0 + 11)
    assert (stats.runnable, stats.running) == (1, 0)
    [again] = claim(backend, "w2", now=T0 + 11)
    assert (again.id, again.attempts, again.lease_owner) == (job_id, 2, "w2")


def test_claim_recovers_expired_leases_itself(backend):
    [job_id] = enqueue(backend)
    claim(backend, "w1", lease=10)
    assert claim(backend, "w2", now=T0 + 10) == []  # w1's lease is still live
    [job] = claim(backend, "w2", now=T0 + 11)
    assert (job.id, job.lease_owner, job.attempts) == (job_id, "w2", 2)
    assert [(r["worker"], r["outcome"]) for r in backend.executions(job_id=job_id)] == [("w1", "lost")]


def test_an_expired_lease_out_of_attempts_is_dead_lettered_with_its_error(backend):
    [job_id] = enqueue(backend, max_attempts=2)
    for owner, now in (("w1", T0), ("w2", T0 + 20)):
        assert ids_of(claim(backend, owner, now=now, lease=10)) == [job_id]
    assert backend.recover_expired(now=T0 + 31) == 1
    job = backend.get(job_id)
    assert (job.state, job.attempts, job.finished_at) == (JobState.DEAD, 2, T0 + 31)
    assert "expired" in job.error and "w2" in job.error
    assert claim(backend, "w3", now=T0 + 40) == []
    stats = backend.stats("default", now=T0 + 40)
    assert (stats.dead, stats.runnable, stats.running) == (1, 0, 0)
    assert outcomes(backend, job_id) == ["lost", "lost"]


def test_renew_keeps_a_lease_alive_past_its_original_expiry(backend):
    [job_id] = enqueue(backend)
    claim(backend, "w1", lease=30)
    assert backend.renew("w1", [job_id], 30, now=T0 + 20) == [job_id]
    assert backend.get(job_id).lease_expires == T0 + 50
    assert backend.recover_expired(now=T0 + 45) == 0
    assert claim(backend, "w2", now=T0 + 45) == []
    assert backend.settle("w1", [Outcome.ack(job_id)], now=T0 + 48) == [job_id]
    assert backend.get(job_id).state is JobState.DONE


def test_renew_returns_only_the_ids_still_held(backend):
    mine, theirs, done, expired, queued = enqueue(backend, 5)
    claim(backend, "w1", limit=1)                       # mine
    claim(backend, "w2", limit=1)                       # theirs
    claim(backend, "w1", limit=1)                       # done
    claim(backend, "w1", limit=1, lease=5)              # expired, not recovered yet
    backend.settle("w1", [Outcome.ack(done)], now=T0 + 1)
    held = backend.renew("w1", [mine, theirs, done, expired, queued, 999_999], 30, now=T0 + 10)
    # An expired lease nobody recovered is still w1's: nothing else can have started the job.
    assert held == [mine, expired]
    assert backend.get(theirs).lease_expires == T0 + LEASE
    assert backend.get(expired).lease_expires == T0 + 40
    backend.recover_expired(now=T0 + 41)
    assert backend.renew("w1", [mine, expired], 30, now=T0 + 41) == []  # recovered: gone
    assert backend.renew("w1", [], 30, now=T0 + 10) == []


# -- settle --------------------------------------------------------------------------------

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


# -- recovery, cancel, idempotency ---------------------------------------------------------

def test_recover_owner_requeues_only_that_owners_jobs(backend):
    a, b, c = enqueue(backend, 3, max_attempts=2)
    claim(backend, "w1", limit=2)
    claim(backend, "w2", limit=1)
    assert backend.recover_owner("w1", now=T0 + 1, reason="worker stopped") == 2
    for job_id in (a, b):
        job = backend.get(job_id)
        assert (job.state, job.attempts, job.lease_owner) == (JobState.QUEUED, 1, None)
        assert "worker stopped" in job.error
    assert backend.get(c).lease_owner == "w2"
    assert backend.recover_owner("w1", now=T0 + 2, reason="again") == 0
    rows = backend.executions()
    assert sorted((r["job_id"], r["worker"], r["outcome"], r["attempt"]) for r in rows) == [
        (a, "w1", "lost", 1), (b, "w1", "lost", 1)]
    assert all("worker stopped" in r["error"] and r["finished_at"] == T0 + 1 for r in rows)
    stats = backend.stats("default", now=T0 + 2)
    assert (stats.runnable, stats.running) == (2, 1)


def test_lease_owners_counts_running_jobs_per_owner(backend):
    assert backend.lease_owners() == {}
    a, b, c, d = enqueue(backend, 4, max_attempts=1)
    claim(backend, "w1", limit=2)
    claim(backend, "w2", limit=1, lease=5)
    assert backend.lease_owners() == {"w1": 2, "w2": 1}
    backend.settle("w1", [Outcome.ack(a)], now=T0 + 1)
    assert backend.lease_owners() == {"w1": 1, "w2": 1}
    backend.recover_expired(now=T0 + 6)  # w2's lease ran out: its job is dead (no attempts left)
    backend.cancel(b, now=T0 + 7)
    assert backend.lease_owners() == {}
    assert backend.get(c).state is JobState.DEAD
    assert backend.get(d).state is JobState.QUEUED


def test_recover_owner_dead_letters_jobs_out_of_attempts(backend):
    [job_id] = enqueue(backend, max_attempts=1)
    claim(backend, "w1")
    assert backend.recover_owner("w1", now=T0 + 1, reason="killed") == 1
    job = backend.get(job_id)
    assert (job.state, job.attempts) == (JobState.DEAD, 1)
    assert "killed" in job.error


# -- abandon: a job given up at exit is settled once its worker is gone -----------------------

def _dead_local_pid():
    """A pid of this host that no process has (a child that has exited and been reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_an_abandoned_job_stays_running_and_leased_until_its_owner_is_gone(backend):
    [job_id] = enqueue(backend)
    claim(backend, "w1", lease=10)
    assert backend.abandon("w1", [Outcome.release(job_id)], now=T0 + 5) == [job_id]
    job = backend.get(job_id)
    assert (job.state, job.lease_owner, job.lease_expires) == (JobState.RUNNING, "w1", T0 + 10)
    assert claim(backend, "w2", now=T0 + 6) == []  # its thread may still run it
    assert outcomes(backend, job_id) == []
    stats = backend.stats("default", now=T0 + 6)
    assert (stats.runnable, stats.running) == (0, 1)


def test_abandon_release_gives_the_job_back_with_no_attempt_used_in_its_place(backend):
    first, later = enqueue(backend, 2, max_attempts=1, priority=1)
    [early_low] = enqueue(backend, priority=0, now=T0 - 50)
    claim(backend, "w1", limit=1, lease=10)
    [newer] = enqueue(backend, priority=1, now=T0 + 1)
    backend.abandon("w1", [Outcome.release(first)], now=T0 + 2)
    assert backend.recover_owner("w1", now=T0 + 3, reason="worker exited") == 1
    job = backend.get(first)
    assert (job.state, job.attempts, job.run_at, job.priority) == (JobState.QUEUED, 0, T0, 1)
    assert (job.lease_owner, job.started_at, job.error) == (None, None, None)
    assert [(r["outcome"], r["error"]) for r in backend.executions(job_id=first)] == [("release", None)]
    stats = backend.stats("default", now=T0 + 3)
    assert (stats.runnable, stats.running, stats.failure_rate) == (4, 0, 0)
    # Its place: before jobs of its priority that came after it, and before lower priority.
    assert ids_of(claim(backend, "w2", limit=4, now=T0 + 4)) == [first, later, newer, early_low]


def test_abandon_fail_counts_the_attempt_and_retries_with_backoff(backend):
    [job_id] = enqueue(backend, max_attempts=2)
    claim(backend, "w1", lease=10)
    backend.abandon("w1", [Outcome.fail(job_id, "timed out after 5s")], now=T0 + 5)
    assert backend.recover_owner("w1", now=T0 + 6, reason="worker exited") == 1
    job = backend.get(job_id)
    assert (job.state, job.attempts, job.error) == (JobState.QUEUED, 1, "timed out after 5s")
    assert T0 + 6 < job.run_at <= T0 + 6 + 1.0  # the first retry's backoff ceiling
    assert outcomes(backend, job_id) == ["fail"]
    stats = backend.stats("default", now=T0 + 6)
    assert (stats.delayed, stats.failure_rate * stats.window) == (1, 1)
    [again] = claim(backend, "w2", now=T0 + 8)
    assert (again.id, again.attempts) == (job_id, 2)
    backend.abandon("w2", [Outcome.fail(job_id, "timed out again")], now=T0 + 9)
    backend.recover_owner("w2", now=T0 + 10, reason="worker exited")
    job = backend.get(job_id)
    assert (job.state, job.attempts, job.error) == (JobState.DEAD, 2, "timed out again")
    assert outcomes(backend, job_id) == ["fail", "fail"]


def test_an_abandon_mark_is_applied_when_the_lease_expires_and_the_owner_is_not_here(backend):
    released, failed, lost = enqueue(backend, 3)
    claim(backend, "w1", limit=3, lease=10)  # "w1" names no process of this host
    backend.abandon("w1", [Outcome.release(released), Outcome.fail(failed, "stuck")], now=T0 + 1)
    assert backend.recover_expired(now=T0 + 11) == 3
    assert [backend.get(j).attempts for j in (released, failed, lost)] == [0, 1, 1]
    assert [outcomes(backend, j) for j in (released, failed, lost)] == [["release"], ["fail"], ["lost"]]


def test_abandon_marks_only_jobs_the_owner_holds_and_only_release_or_fail(backend):
    mine, theirs, queued = enqueue(backend, 3)
    claim(backend, "w1", limit=1)
    claim(backend, "w2", limit=1)
    assert backend.abandon("w1", [Outcome.release(mine), Outcome.release(theirs),
                                  Outcome.release(queued), Outcome.release(999_999)], now=T0) == [mine]
    assert backend.abandon("w1", [], now=T0) == []
    for refused in (Outcome.ack(mine), Outcome.dead(mine, "x")):
        with pytest.raises(QueueError, match="only release or fail"):
            backend.abandon("w1", [Outcome.fail(mine, "x"), refused], now=T0)
    backend.recover_owner("w1", now=T0 + 1, reason="exited")
    assert outcomes(backend, mine) == ["release"]  # the refused call marked nothing
    assert backend.recover_owner("w2", now=T0 + 1, reason="exited") == 1
    assert outcomes(backend, theirs) == ["lost"]


def test_a_job_settled_after_it_was_abandoned_is_settled_once(backend):
    [job_id] = enqueue(backend)
    claim(backend, "w1")
    backend.abandon("w1", [Outcome.release(job_id)], now=T0 + 1)
    # The stuck thread finished after all, before the worker exited.
    assert backend.settle("w1", [Outcome.ack(job_id, 7)], now=T0 + 2) == [job_id]
    assert backend.recover_owner("w1", now=T0 + 3, reason="exited") == 0
    job = backend.get(job_id)
    assert (job.state, job.result) == (JobState.DONE, 7)
    assert outcomes(backend, job_id) == ["ack"]


def test_an_expired_lease_of_a_live_local_worker_is_left_to_it(backend):
    alive = owner_name("default-1", os.getpid())
    [job_id] = enqueue(backend)
    claim(backend, alive, lease=10)
    assert backend.recover_expired(now=T0 + 60) == 0
    assert claim(backend, "w2", now=T0 + 60) == []  # a thread stuck in C may still run it
    assert backend.get(job_id).lease_owner == alive
    assert backend.renew(alive, [job_id], 30, now=T0 + 61) == [job_id]  # still its own
    assert backend.recover_owner(alive, now=T0 + 62, reason="unit stopped") == 1
    assert ids_of(claim(backend, "w2", now=T0 + 63)) == [job_id]


def test_an_expired_lease_of_a_dead_local_worker_is_recovered(backend):
    gone = owner_name("default-1", _dead_local_pid())
    [job_id] = enqueue(backend)
    claim(backend, gone, lease=10)
    assert backend.recover_expired(now=T0 + 10) == 0  # not expired yet
    assert backend.recover_expired(now=T0 + 11) == 1
    assert outcomes(backend, job_id) == ["lost"]


# -- a recovered job keeps its place -------------------------------------------------------

def test_a_lost_job_runs_again_before_work_that_came_after_it(backend):
    [lost] = enqueue(backend, max_attempts=3)
    claim(backend, "w1", lease=10)
    after = enqueue(backend, 5, now=T0 + 1)
    assert backend.recover_owner("w1", now=T0 + 2, reason="worker killed") == 1
    job = backend.get(lost)
    assert (job.state, job.attempts, job.run_at) == (JobState.QUEUED, 1, T0)  # the attempt counts
    assert ids_of(claim(backend, "w2", limit=1, now=T0 + 3)) == [lost]
    assert ids_of(claim(backend, "w2", limit=5, now=T0 + 3)) == after


def test_a_lost_job_keeps_its_priority(backend):
    [urgent] = enqueue(backend, priority=5)
    [earlier_routine] = enqueue(backend, priority=0, now=T0 - 100)
    claim(backend, "w1", limit=1, lease=10)
    later_urgent = enqueue(backend, 2, priority=5, now=T0 + 1)
    assert backend.recover_expired(now=T0 + 11) == 1
    assert backend.get(urgent).priority == 5
    assert ids_of(claim(backend, "w2", limit=4, now=T0 + 12)) == [urgent, *later_urgent, earlier_routine]


def test_cancel(backend):
    queued, running, dead, done, spare = enqueue(backend, 5, max_attempts=1)
    claim(backend, "w1", limit=4)
    backend.settle("w1", [Outcome.dead(dead, "bad"), Outcome.ack(done), Outcome.release(queued)],
                   now=T0 + 1)
    for job_id in (queued, running, dead):
        assert backend.cancel(job_id, now=T0 + 2) is True
        job = backend.get(job_id)
        assert (job.state, job.lease_owner, job.finished_at) == (JobState.CANCELLED, None, T0 + 2)
    assert backend.cancel(done, now=T0 + 2) is False
    assert backend.cancel(queued, now=T0 + 3) is False
    assert backend.get(done).state is JobState.DONE
    with pytest.raises(JobNotFound):
        backend.cancel(424242, now=T0)
    # The holder of a cancelled job cannot settle it afterwards.
    assert backend.settle("w1", [Outcome.ack(running)], now=T0 + 4) == []
    assert backend.get(running).state is JobState.CANCELLED
    assert ids_of(claim(backend, "w2", now=T0 + 5)) == [spare]
    stats = backend.stats("default", now=T0 + 5)
    assert (stats.runnable, stats.delayed, stats.running, stats.dead) == (0, 0, 1, 0)


def test_get_unknown_job(backend):
    with pytest.raises(JobNotFound):
        backend.get(1)


def test_a_live_idempotency_key_returns_the_existing_job(backend):
    [first] = backend.enqueue([NewJob(task="t", payload=1, idempotency_key="k")], now=T0)
    again = backend.enqueue([NewJob(task="t", payload=2, idempotency_key="k"),
                             NewJob(task="t", payload=3, idempotency_key="other"),
                             NewJob(task="t", payload=4, idempotency_key="other")], now=T0 + 1)
    assert again[0] == first
    assert again[1] == again[2] != first
    claim(backend, "w1", limit=1)  # running still holds the key
    assert backend.enqueue([NewJob(task="t", idempotency_key="k")], now=T0 + 2) == [first]
    assert len(all_jobs(backend)) == 2
    assert backend.get(first).payload == 1
    stats = backend.stats("default", now=T0 + 2)
    assert stats.arrival_rate * stats.window == pytest.approx(2)


@pytest.mark.parametrize("ending", ["ack", "dead", "cancel"])
def test_a_finished_jobs_idempotency_key_is_free_again(backend, ending):
    [first] = backend.enqueue([NewJob(task="t", idempotency_key="k")], now=T0)
    claim(backend, "w1")
    if ending == "cancel":
        backend.cancel(first, now=T0 + 1)
    else:
        backend.settle("w1", [Outcome.ack(first) if ending == "ack" else Outcome.dead(first, "x")],
                       now=T0 + 1)
    [second] = backend.enqueue([NewJob(task="t", idempotency_key="k")], now=T0 + 2)
    assert second != first
    assert backend.get(second).state is JobState.QUEUED
    assert backend.enqueue([NewJob(task="t", idempotency_key="k")], now=T0 + 3) == [second]


# -- dead letters, purge, listings ---------------------------------------------------------

def _dead_jobs(backend, n, queue="default", now=T0):
    ids = enqueue(backend, n, queue=queue, max_attempts=1, now=now)
    claim(backend, "w1", queues=(queue,), now=now)
    backend.settle("w1", [Outcome.fail(job_id, "boom") for job_id in ids], now=now)
    return ids


def test_retry_dead_makes_dead_jobs_runnable_with_fresh_attempts(backend):
    dead = _dead_jobs(backend, 3)
    other_queue = _dead_jobs(backend, 1, queue="q2")
    [live] = enqueue(backend)
    assert backend.retry_dead(job_ids=[dead[0], live, 99999], now=T0 + 10) == 1
    assert backend.retry_dead(queue="default", now=T0 + 20) == 2
    assert backend.retry_dead(job_ids=[], now=T0 + 20) == 0
    for job_id in dead:
        job = backend.get(job_id)
        assert (job.state, job.attempts, job.finished_at) == (JobState.QUEUED, 0, None)
    assert backend.get(dead[0]).run_at == T0 + 10
    assert backend.get(other_queue[0]).state is JobState.DEAD
    stats = backend.stats("default", now=T0 + 20)
    assert (stats.runnable, stats.dead) == (4, 0)
    assert sorted(ids_of(claim(backend, "w2", now=T0 + 20))) == sorted(dead + [live])
    assert backend.retry_dead(now=T0 + 30) == 1


def test_retry_dead_skips_a_job_whose_idempotency_key_is_live_again(backend):
    [old] = backend.enqueue([NewJob(task="t", idempotency_key="k", max_attempts=1)], now=T0)
    [plain] = _dead_jobs(backend, 1)
    claim(backend, "w1")
    backend.settle("w1", [Outcome.dead(old, "bad")], now=T0 + 1)
    [new] = backend.enqueue([NewJob(task="t", idempotency_key="k")], now=T0 + 2)
    assert backend.retry_dead(now=T0 + 3) == 1
    assert backend.get(plain).state is JobState.QUEUED
    assert backend.get(old).state is JobState.DEAD
    assert backend.enqueue([NewJob(task="t", idempotency_key="k")], now=T0 + 4) == [new]


def test_retry_dead_of_two_dead_jobs_sharing_a_key_revives_one(backend):
    ids = []
    for i in range(2):
        ids += backend.enqueue([NewJob(task="t", idempotency_key="k", max_attempts=1)], now=T0 + i)
        claim(backend, "w1", now=T0 + i)
        backend.settle("w1", [Outcome.dead(ids[-1], "bad")], now=T0 + i)
    assert backend.retry_dead(now=T0 + 5) == 1
    assert sorted(backend.get(j).state.value for j in ids) == ["dead", "queued"]


def test_purge_deletes_only_finished_jobs_finished_before_the_cutoff(backend):
    done_old, done_new, dead_old, cancelled_old, running, queued = enqueue(backend, 6, max_attempts=1)
    claim(backend, "w1", limit=5)
    backend.settle("w1", [Outcome.ack(done_old), Outcome.dead(dead_old, "x")], now=T0 + 10)
    backend.cancel(cancelled_old, now=T0 + 10)
    backend.settle("w1", [Outcome.ack(done_new)], now=T0 + 100)
    assert backend.purge(states=[JobState.DONE], finished_before=T0 + 50) == 1
    assert backend.purge(states=[JobState.DEAD, JobState.CANCELLED], finished_before=T0 + 50) == 2
    for job_id in (done_old, dead_old, cancelled_old):
        with pytest.raises(JobNotFound):
            backend.get(job_id)
    assert {backend.get(j).state for j in (done_new, running, queued)} == {
        JobState.DONE, JobState.RUNNING, JobState.QUEUED}
    with pytest.raises(QueueError):
        backend.purge(states=[JobState.QUEUED], finished_before=T0 + 1000)
    assert len(all_jobs(backend)) == 3
    stats = backend.stats("default", now=T0 + 100)
    assert (stats.runnable, stats.running, stats.dead) == (1, 1, 0)


def test_list_jobs_newest_first_with_filters_and_queues(backend):
    a = enqueue(backend, 3, queue="a")
    b = enqueue(backend, 2, queue="b")
    claim(backend, "w1", limit=1, queues=("a",))
    assert ids_of(all_jobs(backend)) == list(reversed(a + b))
    assert ids_of(backend.list_jobs(queue="a")) == list(reversed(a))
    assert ids_of(backend.list_jobs(queue="a", state=JobState.RUNNING)) == [a[0]]
    assert ids_of(backend.list_jobs(limit=2)) == [b[1], b[0]]
    assert backend.queues() == ["a", "b"]


def test_list_jobs_by_task_and_tenant_page_by_page(backend):
    mail = backend.enqueue([NewJob(task="mail", tenant="acme") for _ in range(5)], now=T0)
    other = backend.enqueue([NewJob(task="mail", tenant="zeta"), NewJob(task="report", tenant="acme")], now=T0)
    assert ids_of(backend.list_jobs(task="mail", tenant="acme")) == list(reversed(mail))
    assert ids_of(backend.list_jobs(task="report")) == [other[1]]
    first = backend.list_jobs(task="mail", tenant="acme", limit=2)
    second = backend.list_jobs(task="mail", tenant="acme", limit=2, before=first[-1].id)
    third = backend.list_jobs(task="mail", tenant="acme", limit=2, before=second[-1].id)
    assert ids_of(first + second + third) == list(reversed(mail))
    assert backend.list_jobs(task="mail", tenant="acme", before=third[-1].id) == []


def test_purge_by_id_deletes_only_those_finished_jobs(backend):
    dead_one, dead_two, running = enqueue(backend, 3, max_attempts=1)
    claim(backend, "w1", limit=3)
    backend.settle("w1", [Outcome.dead(dead_one, "x"), Outcome.dead(dead_two, "y")], now=T0 + 10)
    assert backend.purge(states=[JobState.DEAD], finished_before=T0 + 50, job_ids=[dead_one, running]) == 1
    with pytest.raises(JobNotFound):
        backend.get(dead_one)
    assert (backend.get(dead_two).state, backend.get(running).state) == (JobState.DEAD, JobState.RUNNING)
    assert backend.executions(job_id=dead_one) == []
    assert backend.purge(states=[JobState.DEAD], finished_before=T0 + 50, job_ids=[]) == 0


def test_executions_record_who_ran_what(backend):
    acked, failed, released, lost = enqueue(backend, 4, max_attempts=2)
    claim(backend, "w1", limit=2, now=T0 + 1)
    claim(backend, "w2", limit=2, now=T0 + 2, lease=5)
    backend.settle("w1", [Outcome.ack(acked), Outcome.fail(failed, "E1")], now=T0 + 3)
    backend.settle("w2", [Outcome.release(released)], now=T0 + 4)
    backend.recover_expired(now=T0 + 8)
    rows = {row["job_id"]: row for row in backend.executions()}
    assert rows[acked] == dict(job_id=acked, attempt=1, worker="w1", started_at=T0 + 1,
                               finished_at=T0 + 3, outcome="ack", error=None)
    assert rows[failed] == dict(job_id=failed, attempt=1, worker="w1", started_at=T0 + 1,
                                finished_at=T0 + 3, outcome="fail", error="E1")
    assert rows[released] == dict(job_id=released, attempt=1, worker="w2", started_at=T0 + 2,
                                  finished_at=T0 + 4, outcome="release", error=None)
    assert {k: rows[lost][k] for k in ("attempt", "worker", "started_at", "finished_at", "outcome")} == dict(
        attempt=1, worker="w2", started_at=T0 + 2, finished_at=T0 + 8, outcome="lost")
    assert len(backend.executions()) == 4
    assert len(backend.executions(limit=2)) == 2
    assert backend.executions(job_id=acked) == [rows[acked]]


# -- stats ---------------------------------------------------------------------------------

def test_stats_counts_runnable_delayed_running_and_dead(backend):
    enqueue(backend, 4)
    enqueue(backend, 3, delay=100)
    _dead_jobs(backend, 2)          # claims all 6 runnable: 4 + the 2 dead ones
    backend.recover_owner("w1", now=T0, reason="restart")  # the 4 are runnable again
    claim(backend, "w2", limit=1)
    enqueue(backend, 5, queue="elsewhere")
    stats = backend.stats("default", now=T0 + 1)
    assert (stats.queue, stats.runnable, stats.delayed, stats.running, stats.dead) == (
        "default", 3, 3, 1, 2)
    stats = backend.stats("default", now=T0 + 100)
    assert (stats.runnable, stats.delayed) == (6, 0)


def test_stats_of_an_unknown_queue_are_empty(backend):
    stats = backend.stats("nothing", now=T0, window=30)
    assert (stats.runnable, stats.delayed, stats.running, stats.dead) == (0, 0, 0, 0)
    assert (stats.arrival_rate, stats.completion_rate, stats.failure_rate) == (0, 0, 0)
    assert (stats.duration_p50, stats.duration_p95, stats.duration_p99) == (None, None, None)
    assert (stats.oldest_runnable_age, stats.time_to_drain, stats.window) == (0.0, 0.0, 30)
    assert stats.tenants == {}


def test_oldest_runnable_age_counts_from_run_at_not_enqueue_time(backend):
    enqueue(backend, delay=100)                # runnable from T0+100
    enqueue(backend, now=T0 + 120, delay=0)    # runnable from T0+120
    enqueue(backend, delay=1000)               # still delayed
    assert backend.stats("default", now=T0 + 50).oldest_runnable_age == 0.0
    assert backend.stats("default", now=T0 + 150).oldest_runnable_age == pytest.approx(50)
    claim(backend, "w1", limit=1, now=T0 + 150)
    assert backend.stats("default", now=T0 + 160).oldest_runnable_age == pytest.approx(40)


def test_rates_count_events_inside_the_window_only(backend):
    ids = enqueue(backend, 30, now=T0)
    enqueue(backend, 6, now=T0 + 30)
    claim(backend, "w1", now=T0 + 30)
    backend.settle("w1", [Outcome.ack(j) for j in ids[:10]], now=T0 + 40)
    backend.settle("w1", [Outcome.fail(ids[10], "x"), Outcome.dead(ids[11], "y"),
                          Outcome.release(ids[12])], now=T0 + 40)
    stats = backend.stats("default", now=T0 + 45, window=60)
    assert stats.arrival_rate == pytest.approx(36 / 60)
    assert stats.completion_rate == pytest.approx(10 / 60)
    assert stats.failure_rate == pytest.approx(2 / 60)
    stats = backend.stats("default", now=T0 + 45, window=10)
    assert stats.arrival_rate == 0
    assert stats.completion_rate == pytest.approx(10 / 10)
    # A window of 60 s holds 60 s of events: those of T0 count at T0+59, not at T0+60.
    assert backend.stats("default", now=T0 + 59, window=60).arrival_rate == pytest.approx(36 / 60)
    assert backend.stats("default", now=T0 + 60, window=60).arrival_rate == pytest.approx(6 / 60)
    stats = backend.stats("default", now=T0 + 80, window=60)
    assert stats.arrival_rate == pytest.approx(6 / 60)
    stats = backend.stats("default", now=T0 + 200, window=60)
    assert (stats.arrival_rate, stats.completion_rate, stats.failure_rate) == (0, 0, 0)


def test_a_delayed_job_arrives_when_it_comes_due_not_when_it_is_enqueued(backend):
    enqueue(backend, 6, delay=86_400)          # due tomorrow
    enqueue(backend, 2, delay=100)             # due at T0+100
    enqueue(backend, 1)                        # runnable now
    assert backend.stats("default", now=T0 + 1).arrival_rate * 60 == pytest.approx(1)
    # Counted in the second they became runnable, however late anyone looks.
    stats = backend.stats("default", now=T0 + 130, window=60)
    assert (stats.arrival_rate * 60, stats.runnable, stats.delayed) == (pytest.approx(2), 3, 6)
    assert backend.stats("default", now=T0 + 130, window=20).arrival_rate == 0
    assert backend.stats("default", now=T0 + 86_430).arrival_rate * 60 == pytest.approx(6)


def test_a_claim_promotes_what_came_due_and_counts_it_once(backend):
    ids = enqueue(backend, 3, delay=10)
    assert ids_of(claim(backend, limit=2, now=T0 + 20)) == ids[:2]
    for now in (T0 + 21, T0 + 22):
        stats = backend.stats("default", now=now)
        assert (stats.arrival_rate * 60, stats.runnable, stats.running) == (pytest.approx(3), 1, 2)


def test_a_retry_coming_due_is_not_an_arrival(backend):
    [job_id] = enqueue(backend, max_attempts=3)
    claim(backend, "w1")
    backend.settle("w1", [Outcome.fail(job_id, "boom")], now=T0 + 1)
    assert backend.stats("default", now=T0 + 1).delayed == 1
    stats = backend.stats("default", now=T0 + 30)  # the retry (backoff at most 1 s) is due
    assert (stats.runnable, stats.delayed) == (1, 0)
    assert (stats.arrival_rate * 60, stats.failure_rate * 60) == (pytest.approx(1), pytest.approx(1))


def test_a_delayed_job_cancelled_before_it_came_due_never_arrives(backend):
    cancelled, kept = enqueue(backend, 2, delay=50)
    assert backend.cancel(cancelled, now=T0 + 10) is True
    stats = backend.stats("default", now=T0 + 60)
    assert (stats.arrival_rate * 60, stats.runnable, stats.delayed) == (pytest.approx(1), 1, 0)
    assert backend.cancel(kept, now=T0 + 61) is True  # it had arrived: that stays counted
    assert backend.stats("default", now=T0 + 62).arrival_rate * 60 == pytest.approx(1)


def test_a_revived_dead_job_arrives_again(backend):
    _dead_jobs(backend, 2)
    assert backend.retry_dead(now=T0 + 100) == 2
    stats = backend.stats("default", now=T0 + 100, window=10)
    assert (stats.arrival_rate * 10, stats.runnable) == (pytest.approx(2), 2)


def test_duration_percentiles_come_from_recent_completions(backend):
    ids = enqueue(backend, 101)
    assert len(claim(backend, "w1", limit=101, now=T0)) == 101
    for i in range(100):  # durations 1..100 s, completed in a shuffled order
        index = (i * 37) % 100
        backend.settle("w1", [Outcome.ack(ids[index])], now=T0 + index + 1)
    # A dead job's run time is not a completion's: it would move every percentile.
    backend.settle("w1", [Outcome.dead(ids[100], "x")], now=T0 + 101)
    stats = backend.stats("default", now=T0 + 101)
    assert (stats.duration_p50, stats.duration_p95, stats.duration_p99) == (50, 95, 99)
    assert backend.stats("default", now=T0 + 101 + 100_000).duration_p50 is None


def test_the_recent_p50_is_of_the_jobs_finished_in_the_last_seconds(backend):
    ids = enqueue(backend, 40)
    assert len(claim(backend, "w1", limit=40, now=T0)) == 40
    # 30 quick jobs long ago, then 10 slow ones finishing within the recent window.
    backend.settle("w1", [Outcome.ack(job_id) for job_id in ids[:30]], now=T0 + 1)
    backend.settle("w1", [Outcome.ack(job_id) for job_id in ids[30:]], now=T0 + 50)
    stats = backend.stats("default", now=T0 + 55)
    assert stats.recent_window == RECENT_WINDOW
    assert (stats.recent_completions, stats.recent_duration_p50) == (10, 50)
    assert stats.duration_p50 == 1  # the whole sample: mostly the quick ones
    later = backend.stats("default", now=T0 + 50 + RECENT_WINDOW + 1)
    assert (later.recent_completions, later.recent_duration_p50) == (0, None)


def test_the_completion_series_counts_each_recent_second(backend):
    ids = enqueue(backend, 12)
    assert len(claim(backend, "w1", limit=12, now=T0)) == 12
    second = int(T0) + 100
    backend.settle("w1", [Outcome.ack(job_id) for job_id in ids[:2]], now=second - 40.5)  # long ago
    backend.settle("w1", [Outcome.ack(job_id) for job_id in ids[2:5]], now=second + 1.2)
    backend.settle("w1", [Outcome.ack(job_id) for job_id in ids[5:9]], now=second + 3.7)
    backend.settle("w1", [Outcome.dead(ids[9], "x")], now=second + 3.8)  # no completion
    backend.settle("w1", [Outcome.ack(ids[10])], now=second + 5.1)
    stats = backend.stats("default", now=second + 6.0, window=30)
    assert stats.completion_series == ((second + 1, 3), (second + 3, 4), (second + 5, 1))
    assert stats.completion_rate * 30 == pytest.approx(8)  # the series leaves the window's rate alone


def test_time_to_drain_is_runnable_over_completion_rate(backend):
    ids = enqueue(backend, 20)
    claim(backend, "w1", limit=5)
    backend.settle("w1", [Outcome.ack(j) for j in ids[:5]], now=T0 + 10)
    stats = backend.stats("default", now=T0 + 10, window=10)
    assert stats.runnable == 15
    assert stats.completion_rate == pytest.approx(0.5)
    assert stats.time_to_drain == pytest.approx(30)
    assert backend.stats("default", now=T0 + 1000).time_to_drain is None
    assert stats.as_dict()["time_to_drain"] == pytest.approx(30)


def test_stats_per_tenant_and_their_sum(backend):
    enqueue(backend, 3, tenant="acme")
    enqueue(backend, 2, tenant="acme", delay=50)
    enqueue(backend, 4, tenant="globex", now=T0 - 20)
    enqueue(backend, 1)  # no tenant
    running = claim(backend, "w1", limit=5, now=T0)  # 4 globex (oldest) + 1 acme
    acme_running = [j for j in running if j.tenant == "acme"]
    backend.settle("w1", [Outcome.ack(j.id) for j in running if j.tenant == "globex"], now=T0 + 2)
    stats = backend.stats("default", now=T0 + 5, window=60)
    assert set(stats.tenants) == {"acme", "globex"}
    acme, globex = stats.tenants["acme"], stats.tenants["globex"]
    assert (acme.runnable, acme.delayed, acme.running, acme.dead) == (2, 2, len(acme_running), 0)
    assert (globex.runnable, globex.delayed, globex.running) == (0, 0, 0)
    assert acme.oldest_runnable_age == pytest.approx(5)
    assert globex.oldest_runnable_age == 0
    assert acme.arrival_rate == pytest.approx(3 / 60)  # the 2 delayed ones have not arrived yet
    assert globex.completion_rate == pytest.approx(4 / 60)
    assert globex.duration_p50 == pytest.approx(2)
    assert acme.duration_p50 is None
    assert (stats.runnable, stats.delayed, stats.running) == (3, 2, 1)
    assert stats.arrival_rate == pytest.approx(8 / 60)
    assert stats.completion_rate == pytest.approx(4 / 60)
    assert stats.duration_p50 == pytest.approx(2)
    # globex has nothing left: once its events leave the window, it leaves the stats.
    assert set(backend.stats("default", now=T0 + 500, window=60).tenants) == {"acme"}


def test_stats_as_dict_is_plain_data(backend):
    enqueue(backend, 2, tenant="a")
    data = backend.stats("default", now=T0 + 1).as_dict()
    assert data["runnable"] == 2 and data["tenants"]["a"]["runnable"] == 2
    assert data["time_to_drain"] is None
    assert all(not isinstance(v, float) or math.isfinite(v) for v in data.values())


# -- work coming due, running jobs' age, a worker's first claim -----------------------------

@pytest.mark.parametrize("horizon, expected", [
    (0, 0),        # not asked: not counted
    (5, 0),        # the earliest comes due in 10 s
    (10, 1),       # run-at exactly at the horizon counts
    (45, 4),
    (3600, 5),
])
def test_delayed_jobs_coming_due_within_the_horizon_are_counted(backend, horizon, expected):
    store = backend
    store.enqueue([NewJob(task="t", run_at=T0 + s) for s in (10, 20, 30, 40, 1000)], now=T0)
    store.enqueue([NewJob(task="t", run_at=T0 + 20, queue="other")], now=T0)  # another queue's
    stats = store.stats("default", now=T0, horizon=horizon)
    assert (stats.coming_due, stats.coming_due_within, stats.delayed) == (expected, horizon, 5)


@pytest.mark.parametrize("horizon", [-1, float("inf"), float("nan")])
def test_a_bad_coming_due_horizon_is_refused_clearly(backend, horizon):
    with pytest.raises(QueueError, match="coming-due horizon must be 0s or more"):
        backend.stats("default", now=T0, horizon=horizon)


def test_running_age_mean_is_how_long_running_jobs_have_run(backend):
    store = backend
    assert store.stats("default", now=T0).running_age_mean is None
    store.enqueue([NewJob(task="t") for _ in range(3)], now=T0)
    store.claim(ClaimRequest("w1", ("default",), 1), now=T0)
    store.claim(ClaimRequest("w2", ("default",), 1), now=T0 + 4)
    assert store.stats("default", now=T0 + 10).running_age_mean == pytest.approx(8.0)  # (10 + 6) / 2


def test_first_claims_are_found_among_running_and_finished_attempts(backend):
    store = backend
    store.enqueue([NewJob(task="t") for _ in range(3)], now=T0)
    [first] = store.claim(ClaimRequest("w1", ("default",), 1), now=T0 + 1)
    store.settle("w1", [Outcome.ack(first.id)], now=T0 + 2)
    store.claim(ClaimRequest("w1", ("default",), 1), now=T0 + 3)
    store.claim(ClaimRequest("w2", ("default",), 1), now=T0 + 5)
    assert store.first_claims(["w1", "w2", "w3"]) == {"w1": T0 + 1, "w2": T0 + 5}
