"""Hosts of a fleet in the store: heartbeats, who is dead, and the rescue of a dead host's
jobs -- the same contract on every backend (see conftest.BACKENDS).  Time is ``now=``."""

from __future__ import annotations

import pytest

from flexiqd.queue import ClaimRequest, JobState, NewJob, Outcome
from flexiqd.queue.hosts import DEAD_AFTER_BEATS, is_alive, shared_store_timing
from flexiqd.queue.owners import owner_name

T0 = 1_700_000_000.0
BEAT = 2.0
LEASE = 4.0


def claim(backend, owner, limit=10, *, now=T0, lease=LEASE):
    return backend.claim(ClaimRequest(owner=owner, queues=("default",), limit=limit,
                                      lease_seconds=lease), now=now)


def enqueue(backend, n, *, now=T0):
    return backend.enqueue([NewJob(task="t", payload=i) for i in range(n)], now=now)


def test_a_heartbeat_registers_the_host_with_what_it_reported(backend):
    backend.heartbeat("web1", now=T0, interval=BEAT, report={"pools": {"default": {"wants": 3}}})
    [host] = backend.hosts(now=T0 + 1)
    assert (host.name, host.last_beat, host.interval, host.alive) == ("web1", T0, BEAT, True)
    assert host.report == {"pools": {"default": {"wants": 3}}}
    assert host.registered_at == T0


def test_a_later_beat_moves_the_last_beat_and_keeps_the_registration_time(backend):
    backend.heartbeat("web1", now=T0, interval=BEAT)
    backend.heartbeat("web1", now=T0 + 2, interval=3.0, report={"x": 1})
    [host] = backend.hosts(now=T0 + 2)
    assert (host.last_beat, host.interval, host.registered_at, host.report) == (T0 + 2, 3.0, T0, {"x": 1})


def test_a_host_is_dead_once_its_beat_is_older_than_two_intervals(backend):
    backend.heartbeat("web1", now=T0, interval=BEAT)
    backend.heartbeat("web2", now=T0 + 3, interval=BEAT)
    alive = {h.name: h.alive for h in backend.hosts(now=T0 + DEAD_AFTER_BEATS * BEAT + 0.5)}
    assert alive == {"web1": False, "web2": True}


def test_forget_host_removes_it(backend):
    backend.heartbeat("web1", now=T0, interval=BEAT)
    assert backend.forget_host("web1") is True
    assert backend.forget_host("web1") is False
    assert backend.hosts(now=T0) == []


def test_retiring_a_host_hands_back_only_its_expired_jobs_and_removes_it(backend):
    enqueue(backend, 6)
    backend.heartbeat("web1", now=T0, interval=BEAT)
    backend.heartbeat("web2", now=T0, interval=BEAT)
    expired = claim(backend, owner_name("default-1", 101, host="web1"), 2)
    other = claim(backend, owner_name("default-1", 202, host="web2"), 2)
    still = claim(backend, owner_name("default-2", 102, host="web1"), 1, now=T0 + 10, lease=60)
    assert backend.retire_host("web1", now=T0 + 20) == 2
    assert [host.name for host in backend.hosts(now=T0 + 20)] == ["web2"]
    for job in expired:
        again = backend.get(job.id)
        assert (again.state, again.attempts) == (JobState.QUEUED, 0)
        assert [row["outcome"] for row in backend.executions(job_id=job.id)] == ["release"]
    # Not expired: left to its worker; another host's jobs are not touched, dead or not.
    assert backend.get(still[0].id).state is JobState.RUNNING
    assert all(backend.get(job.id).state is JobState.RUNNING for job in other)
    assert backend.retire_host("web1", now=T0 + 20) is None


def _fleet_with_work(backend):
    """web1 and web2 each run 2 jobs; both beat at T0; 2 jobs stay queued."""
    enqueue(backend, 6)
    one = claim(backend, owner_name("default-1", 101, host="web1"), 2)
    two = claim(backend, owner_name("default-1", 202, host="web2"), 2)
    backend.heartbeat("web1", now=T0, interval=BEAT)
    backend.heartbeat("web2", now=T0, interval=BEAT)
    return one, two


def test_a_dead_hosts_expired_jobs_are_handed_back_with_no_attempt_used(backend):
    one, two = _fleet_with_work(backend)
    later = T0 + LEASE + 0.5  # web1's beat and its leases are both stale
    backend.heartbeat("web2", now=later, interval=BEAT)
    assert backend.rescue_dead_hosts(now=later, exclude=("web2",)) == {"web1": 2}
    for job in one:
        again = backend.get(job.id)
        assert (again.state, again.attempts, again.lease_owner) == (JobState.QUEUED, 0, None)
        assert [row["outcome"] for row in backend.executions(job_id=job.id)] == ["release"]
    assert all(backend.get(job.id).state is JobState.RUNNING for job in two)
    # Handed back in place: the rescued jobs come first again.
    first = claim(backend, owner_name("default-2", 303, host="web2"), 2, now=later)
    assert sorted(job.id for job in first) == sorted(job.id for job in one)
    assert all(job.attempts == 1 for job in first)


def test_a_dead_hosts_jobs_whose_leases_still_run_are_left_to_it(backend):
    # Its daemon stopped beating, but its workers still renew: they may still run the jobs.
    one, _ = _fleet_with_work(backend)
    backend.renew(one[0].lease_owner, [job.id for job in one], LEASE, now=T0 + 4)
    assert backend.rescue_dead_hosts(now=T0 + 5, exclude=("web2",)) == {}
    assert all(backend.get(job.id).state is JobState.RUNNING for job in one)


def test_live_hosts_and_excluded_ones_are_never_rescued(backend):
    _fleet_with_work(backend)
    backend.heartbeat("web1", now=T0 + 4, interval=BEAT)
    assert backend.rescue_dead_hosts(now=T0 + 5, exclude=("web2",)) == {}
    assert backend.rescue_dead_hosts(now=T0 + 50, exclude=("web1", "web2")) == {}
    assert backend.stats("default", now=T0 + 50).running == 4


def test_jobs_of_unregistered_hosts_wait_for_lease_recovery(backend):
    enqueue(backend, 1)
    claim(backend, owner_name("default-1", 1, host="laptop"), 1)
    assert backend.rescue_dead_hosts(now=T0 + 100) == {}


def test_a_job_marked_failed_by_its_worker_is_failed_not_released(backend):
    one, _ = _fleet_with_work(backend)
    owner = one[0].lease_owner
    backend.abandon(owner, [Outcome.fail(one[0].id, "timed out")], now=T0 + 1)
    assert backend.rescue_dead_hosts(now=T0 + 10, exclude=("web2",)) == {"web1": 2}
    failed = backend.get(one[0].id)
    assert failed.attempts == 1 and failed.error and "timed out" in failed.error
    assert backend.get(one[1].id).attempts == 0


def test_rescue_is_idempotent(backend):
    _fleet_with_work(backend)
    assert backend.rescue_dead_hosts(now=T0 + 10, exclude=("web2",)) == {"web1": 2}
    assert backend.rescue_dead_hosts(now=T0 + 10, exclude=("web2",)) == {}


@pytest.mark.parametrize("beat", [0.5, 2.0, 10.0])
def test_the_fence_fires_before_another_host_may_take_a_job(beat):
    timing = shared_store_timing(beat)
    # A lease is renewed at least twice before the fence, and the fence leaves half a
    # heartbeat for clock skew and the kill before the lease may be taken.
    assert timing.renew_every * 2 < timing.fence_after
    assert timing.fence_after + beat / 2 < timing.lease
    assert not is_alive(0.0, beat, timing.lease + 0.001)


def test_expired_leases_of_a_registered_hosts_workers_are_left_to_the_rescue(backend):
    one, _ = _fleet_with_work(backend)
    enqueue(backend, 1)
    assert backend.recover_expired(now=T0 + 10) == 0  # not "lost": no attempt counted
    assert all(backend.get(job.id).state is JobState.RUNNING for job in one)
    assert backend.rescue_dead_hosts(now=T0 + 10, exclude=("web2",)) == {"web1": 2}
    assert all(backend.get(job.id).attempts == 0 for job in one)


def test_expired_leases_of_unregistered_hosts_are_recovered_as_lost(backend):
    enqueue(backend, 1)
    [job] = claim(backend, owner_name("default-1", 1, host="laptop"), 1)
    assert backend.recover_expired(now=T0 + 10) == 1
    assert backend.get(job.id).attempts == 1
