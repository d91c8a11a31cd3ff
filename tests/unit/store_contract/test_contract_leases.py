"""Leases: expiry, renewal and recovery of a gone owner's jobs, the abandon marks a worker
leaves at exit, and a recovered job's place in the queue.

Part of the store's contract: it runs on both dialects through the ``backend`` fixture
(tests/unit/conftest.py).  Time is always the ``now=`` argument: nothing here sleeps or
reads a clock.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from flexiqd.errors import QueueError
from flexiqd.queue import JobState, Outcome
from flexiqd.queue.owners import owner_name

from contract_support import LEASE, T0, claim, enqueue, ids_of, outcomes


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
