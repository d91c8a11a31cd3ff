"""Enqueue: what a stored job holds, a batch whole or not at all, and idempotency keys.

Part of the store's contract: it runs on both dialects through the ``backend`` fixture
(tests/unit/conftest.py).  Time is always the ``now=`` argument: nothing here sleeps or
reads a clock.
"""

from __future__ import annotations

import pytest

from flexiqd.errors import PayloadError, QueueError
from flexiqd.queue import JobState, NewJob, Outcome

from contract_support import T0, all_jobs, claim, enqueue


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
