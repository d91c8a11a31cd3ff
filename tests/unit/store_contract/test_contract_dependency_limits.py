"""The dependency-limit contract every job-store backend keeps (``Backend.admit`` and the
DEFER outcome), run on each one through the ``backend`` fixture (tests/unit/conftest.py).

Time is always the ``now=`` argument: nothing here sleeps or reads a clock.
"""

from __future__ import annotations

import pytest

from flexiqd.queue import ClaimRequest, JobState, NewJob, Outcome
from flexiqd.queue.limits import DependencyLimit

T0 = 1_700_000_000.0
API = DependencyLimit("partner_api", concurrency=2)


def claim(backend, n, owner="w1", *, now=T0, lease=30.0):
    return backend.claim(ClaimRequest(owner, ("default",), n, lease), now=now)


def fill(backend, n, *, now=T0, **fields):
    backend.enqueue([NewJob(task="t", payload=i, **fields) for i in range(n)], now=now)


def admitted(backend, jobs, limits, owner="w1", *, now=T0):
    """The ids of ``jobs`` admitted, and the refusals of the others, in order."""
    ids, refusals = [], []
    for job in jobs:
        answer = backend.admit(owner, job.id, limits, now=now)
        if answer is None:
            ids.append(job.id)
        else:
            refusals.append(answer)
    return ids, refusals


# -- concurrency ---------------------------------------------------------------------------

def test_concurrency_is_never_exceeded_and_a_refusal_names_the_full_dependency(backend):
    fill(backend, 5)
    jobs = claim(backend, 5)
    ids, refusals = admitted(backend, jobs, [API])
    assert ids == [jobs[0].id, jobs[1].id]
    assert [r.dependency for r in refusals] == ["partner_api"] * 3
    assert all(r.wait > 0 for r in refusals)
    assert backend.dependency_stats("partner_api", now=T0).in_use == 2


def test_admission_is_idempotent_for_a_job_that_holds_its_slot(backend):
    fill(backend, 2)
    first, second = claim(backend, 2)
    limit = DependencyLimit("db", concurrency=1)
    assert backend.admit("w1", first.id, [limit], now=T0) is None
    assert backend.admit("w1", first.id, [limit], now=T0 + 1) is None
    assert backend.admit("w1", second.id, [limit], now=T0 + 1) is not None
    assert backend.dependency_stats("db", now=T0 + 1).in_use == 1


def test_a_job_the_owner_does_not_hold_takes_nothing(backend):
    fill(backend, 2)
    [job] = claim(backend, 1, owner="w1")
    refusal = backend.admit("w2", job.id, [API], now=T0)
    assert refusal is not None and refusal.wait == 0
    [queued] = [j for j in backend.list_jobs() if j.state is JobState.QUEUED]
    assert backend.admit("w1", queued.id, [API], now=T0) is not None
    assert backend.dependency_stats("partner_api", now=T0).in_use == 0


@pytest.mark.parametrize("outcome", [Outcome.ack, lambda i: Outcome.fail(i, "boom"),
                                     lambda i: Outcome.dead(i, "bad"), Outcome.release],
                         ids=["ack", "fail", "dead", "release"])
def test_a_settled_job_frees_its_slot(backend, outcome):
    fill(backend, 3)
    jobs = claim(backend, 3)
    ids, _ = admitted(backend, jobs, [API])
    assert len(ids) == 2
    assert backend.settle("w1", [outcome(ids[0])], now=T0 + 1) == [ids[0]]
    assert backend.admit("w1", jobs[2].id, [API], now=T0 + 1) is None
    assert backend.dependency_stats("partner_api", now=T0 + 1).in_use == 2


def test_a_recovered_job_of_a_dead_owner_frees_its_slot(backend):
    fill(backend, 2)
    gone, live = claim(backend, 1, owner="w1")[0], claim(backend, 1, owner="w2")[0]
    limit = DependencyLimit("db", concurrency=1)
    assert backend.admit("w1", gone.id, [limit], now=T0) is None
    assert backend.admit("w2", live.id, [limit], now=T0) is not None
    assert backend.recover_owner("w1", now=T0 + 1, reason="worker exited") == 1
    assert backend.admit("w2", live.id, [limit], now=T0 + 1) is None


def test_an_expired_lease_recovered_frees_its_slot(backend):
    fill(backend, 2)
    # "w1" names no process of this host: its expired lease is recovered.
    gone = claim(backend, 1, owner="w1", lease=5)[0]
    live = claim(backend, 1, owner="w2", lease=60)[0]
    limit = DependencyLimit("db", concurrency=1)
    assert backend.admit("w1", gone.id, [limit], now=T0) is None
    assert backend.admit("w2", live.id, [limit], now=T0 + 1) is not None
    assert backend.recover_expired(now=T0 + 6) == 1
    assert backend.admit("w2", live.id, [limit], now=T0 + 6) is None


def test_an_abandoned_job_keeps_its_slot_until_its_owner_is_recovered(backend):
    fill(backend, 2)
    gone, live = claim(backend, 1, owner="w1")[0], claim(backend, 1, owner="w2")[0]
    limit = DependencyLimit("db", concurrency=1)
    assert backend.admit("w1", gone.id, [limit], now=T0) is None
    assert backend.abandon("w1", [Outcome.release(gone.id)], now=T0 + 1) == [gone.id]
    assert backend.admit("w2", live.id, [limit], now=T0 + 1) is not None  # it may still run
    backend.recover_owner("w1", now=T0 + 2, reason="worker exited")
    assert backend.admit("w2", live.id, [limit], now=T0 + 2) is None


def test_a_cancelled_running_job_frees_its_slot(backend):
    fill(backend, 2)
    first, second = claim(backend, 2)
    limit = DependencyLimit("db", concurrency=1)
    assert backend.admit("w1", first.id, [limit], now=T0) is None
    assert backend.cancel(first.id, now=T0 + 1)
    assert backend.admit("w1", second.id, [limit], now=T0 + 1) is None


# -- deferral ------------------------------------------------------------------------------

def _defer_one(backend, *, now=T0 + 1):
    """Two jobs claimed under a one-slot limit; the second is refused and deferred."""
    fill(backend, 2, now=T0)
    first, second = claim(backend, 2, now=now)
    limit = DependencyLimit("db", concurrency=1)
    assert backend.admit("w1", first.id, [limit], now=now) is None
    refusal = backend.admit("w1", second.id, [limit], now=now)
    assert refusal is not None and refusal.dependency == "db"
    assert backend.settle("w1", [Outcome.defer(second.id, refusal)], now=now) == [second.id]
    return first, second, refusal


def test_a_deferred_job_keeps_its_attempts_and_waits_neither_runnable_nor_delayed(backend):
    first, second, refusal = _defer_one(backend)
    job = backend.get(second.id)
    assert (job.state, job.attempts, job.lease_owner, job.started_at) == (JobState.QUEUED, 0, None, None)
    assert job.run_at >= T0 + 1 + refusal.wait
    assert backend.executions(job_id=second.id) == []  # it never ran
    stats = backend.stats("default", now=T0 + 1, window=60, horizon=3600)
    assert (stats.runnable, stats.delayed, stats.running, stats.waiting_for_dependency) == (0, 0, 1, 1)
    assert stats.coming_due == 0  # not work to start workers for
    assert stats.arrival_rate * 60 == pytest.approx(2)
    assert backend.dependency_stats("db", now=T0 + 1).waiting == 1
    assert claim(backend, 5, owner="w2", now=T0 + 1) == []


def test_a_deferred_job_may_be_claimed_after_its_wait_and_waits_until_it_is(backend):
    _, second, _ = _defer_one(backend)
    later = backend.get(second.id).run_at + 5
    stats = backend.stats("default", now=later, window=60, horizon=3600)
    # Still waiting for its dependency: no worker more would start it sooner.
    assert (stats.runnable, stats.delayed, stats.waiting_for_dependency) == (0, 0, 1)
    assert (stats.oldest_runnable_age, stats.coming_due) == (0, 0)
    assert stats.arrival_rate * 60 == pytest.approx(2)  # the two enqueued, nothing more
    assert backend.dependency_stats("db", now=later).waiting == 1
    [again] = claim(backend, 5, owner="w2", now=later)
    assert (again.id, again.attempts) == (second.id, 1)
    assert backend.stats("default", now=later).waiting_for_dependency == 0
    assert backend.dependency_stats("db", now=later).waiting == 0
    # Handed back unstarted (a drain), it is an ordinary runnable job again.
    backend.settle("w2", [Outcome.release(again.id)], now=later)
    stats = backend.stats("default", now=later + 1, window=60)
    assert (stats.runnable, stats.waiting_for_dependency, stats.oldest_runnable_age) == (1, 0, pytest.approx(6))
    assert stats.arrival_rate * 60 == pytest.approx(2)


def test_deferred_jobs_are_counted_per_tenant(backend):
    backend.enqueue([NewJob(task="t", tenant="acme"), NewJob(task="t", tenant="acme")], now=T0)
    first, second = claim(backend, 2)
    limit = DependencyLimit("db", concurrency=1)
    backend.admit("w1", first.id, [limit], now=T0)
    backend.settle("w1", [Outcome.defer(second.id, backend.admit("w1", second.id, [limit], now=T0))], now=T0)
    stats = backend.stats("default", now=T0)
    assert stats.tenants["acme"].waiting_for_dependency == 1
    assert stats.tenants["acme"].runnable == 0


# -- rate ----------------------------------------------------------------------------------

def test_the_rate_grants_the_burst_at_once_then_rate_per_second(backend):
    limit = DependencyLimit("partner_api", rate=10.0, burst=5)
    fill(backend, 200)
    jobs = claim(backend, 200)
    starts, pending = [], list(jobs)
    step = 0.01
    for tick in range(301):  # three seconds, every 10 ms, everyone asks
        now = T0 + tick * step
        while pending and backend.admit("w1", pending[0].id, [limit], now=now) is None:
            starts.append(now)
            pending.pop(0)
    assert starts[:5] == [T0] * 5 and starts[5] > T0  # the burst, then one per 0.1 s
    for i, start in enumerate(starts):
        for end in starts[i:]:
            assert sum(1 for s in starts if start <= s <= end) <= 5 + 10 * (end - start) + 1e-6
    assert len(starts) == 5 + 30  # burst + rate * 3 s (the last at exactly 3.0 s)


def test_a_refused_rate_says_how_long_until_the_next_start(backend):
    limit = DependencyLimit("partner_api", rate=4.0)  # burst 4
    fill(backend, 5)
    jobs = claim(backend, 5)
    ids, refusals = admitted(backend, jobs, [limit])
    assert len(ids) == 4
    assert refusals[0].wait == pytest.approx(0.25)
    assert backend.admit("w1", jobs[4].id, [limit], now=T0 + 0.24) is not None
    assert backend.admit("w1", jobs[4].id, [limit], now=T0 + 0.25) is None


# -- all or nothing ------------------------------------------------------------------------

def test_admission_to_several_dependencies_is_all_or_nothing(backend):
    db, api = DependencyLimit("db", concurrency=1), DependencyLimit("api", concurrency=1)
    rate = DependencyLimit("sms", rate=1.0, burst=1)
    fill(backend, 3)
    a, b, c = claim(backend, 3)
    assert backend.admit("w1", a.id, [db], now=T0) is None
    refusal = backend.admit("w1", b.id, [api, rate, db], now=T0)
    assert refusal is not None and refusal.dependency == "db"
    # Nothing was taken: api's slot and sms's one start are still free.
    assert backend.dependency_stats("api", now=T0).in_use == 0
    assert backend.admit("w1", c.id, [api, rate], now=T0) is None
    assert backend.dependency_stats("api", now=T0).in_use == 1


def test_the_longest_wait_is_reported(backend):
    slow = DependencyLimit("slow", rate=0.5, burst=1)   # next start in 2 s
    quick = DependencyLimit("quick", rate=10.0, burst=1)  # next start in 0.1 s
    fill(backend, 2)
    a, b = claim(backend, 2)
    assert backend.admit("w1", a.id, [slow, quick], now=T0) is None
    refusal = backend.admit("w1", b.id, [quick, slow], now=T0)
    assert (refusal.dependency, refusal.wait) == ("slow", pytest.approx(2.0))


# -- measurement ---------------------------------------------------------------------------

def test_hold_times_and_admissions_are_measured(backend):
    fill(backend, 4)
    jobs = claim(backend, 4)
    limit = DependencyLimit("db", concurrency=3)
    ids, refusals = admitted(backend, jobs, [limit])
    assert len(ids) == 3 and len(refusals) == 1
    backend.settle("w1", [Outcome.ack(ids[0])], now=T0 + 1)
    backend.settle("w1", [Outcome.fail(ids[1], "x")], now=T0 + 2)
    backend.settle("w1", [Outcome.ack(ids[2])], now=T0 + 4)
    stats = backend.dependency_stats("db", now=T0 + 4, window=10)
    assert (stats.in_use, stats.holds_ended) == (0, 3)
    assert (stats.hold_p50, stats.hold_p95) == (pytest.approx(2), pytest.approx(4))
    assert (stats.admitted_rate * 10, stats.deferred_rate * 10) == (pytest.approx(3), pytest.approx(1))


def test_a_dependency_nobody_used_reads_as_idle(backend):
    stats = backend.dependency_stats("never", now=T0)
    assert (stats.in_use, stats.waiting, stats.hold_p50, stats.admitted_rate) == (0, 0, None, 0)


def test_a_claims_batch_is_admitted_in_one_call_as_one_at_a_time(backend):
    ids = backend.enqueue([NewJob(task="t") for _ in range(5)], now=T0)
    claim(backend, 5)
    limit = DependencyLimit("api", concurrency=3)
    answers = backend.admit_many("w1", [(job_id, [limit]) for job_id in ids] + [(999_999, [])], now=T0)
    assert [answers[job_id] is None for job_id in ids] == [True, True, True, False, False]
    assert answers[999_999] is None  # nothing to admit to
    assert backend.dependency_stats("api", now=T0).in_use == 3
