"""Stats: the queue's signals (counts, ages, rates, durations, tenants, work coming due)
and a worker's first claim.

Part of the store's contract: it runs on both dialects through the ``backend`` fixture
(tests/unit/conftest.py).  Time is always the ``now=`` argument: nothing here sleeps or
reads a clock.
"""

from __future__ import annotations

import math

import pytest

from flexiqd.errors import QueueError
from flexiqd.queue import ClaimRequest, NewJob, Outcome
from flexiqd.queue.types import RECENT_WINDOW

from contract_support import T0, claim, dead_jobs, enqueue, ids_of


def test_stats_counts_runnable_delayed_running_and_dead(backend):
    enqueue(backend, 4)
    enqueue(backend, 3, delay=100)
    dead_jobs(backend, 2)          # claims all 6 runnable: 4 + the 2 dead ones
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
    dead_jobs(backend, 2)
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


def test_the_recent_p95_is_of_the_jobs_finished_in_the_last_seconds(backend):
    ids = enqueue(backend, 50)
    assert len(claim(backend, "w1", limit=50, now=T0)) == 50
    # 30 quick jobs long ago would make any spread of the whole sample; then 20 of 41..60 s.
    backend.settle("w1", [Outcome.ack(job_id) for job_id in ids[:30]], now=T0 + 1)
    for offset, job_id in enumerate(ids[30:]):
        backend.settle("w1", [Outcome.ack(job_id)], now=T0 + 41 + offset)
    stats = backend.stats("default", now=T0 + 61)
    assert stats.recent_completions == 15  # those that finished at T0 + 46 .. 60
    assert (stats.recent_duration_p50, stats.recent_duration_p95) == (53, 60)
    assert stats.duration_p95 == 58  # the whole sample's
    later = backend.stats("default", now=T0 + 60 + RECENT_WINDOW + 1)
    assert later.recent_duration_p95 is None


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
