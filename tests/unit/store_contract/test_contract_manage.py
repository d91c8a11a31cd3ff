"""An operator's hands on the store: cancel, get, the dead letters, purge, listings and
the executions' record.

Part of the store's contract: it runs on both dialects through the ``backend`` fixture
(tests/unit/conftest.py).  Time is always the ``now=`` argument: nothing here sleeps or
reads a clock.
"""

from __future__ import annotations

import pytest

from flexiqd.errors import JobNotFound, QueueError
from flexiqd.queue import JobState, NewJob, Outcome

from contract_support import T0, all_jobs, claim, dead_jobs, enqueue, ids_of


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

def test_retry_dead_makes_dead_jobs_runnable_with_fresh_attempts(backend):
    dead = dead_jobs(backend, 3)
    other_queue = dead_jobs(backend, 1, queue="q2")
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
    [plain] = dead_jobs(backend, 1)
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
