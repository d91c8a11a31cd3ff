"""Fleet-wide concurrency limits without a hot row: each owner admits within its own share
(flexiqd.queue.store.shares), locking the dependency's row only to grow it -- on every store."""

from __future__ import annotations

import threading

import pytest

from flexiqd import Queue
from flexiqd.queue import ClaimRequest, NewJob, Outcome
from flexiqd.queue.store import shares
from flexiqd.queue.store.lifecycle import Store
from flexiqd.queue.limits import DependencyLimit
from flexiqd.queue.postgres.sql import PostgresTx
from flexiqd.queue.store.shares import Share
from flexiqd.queue.sqlite.sql import SQLiteTx
from flexiqd.worker.runtime import WorkerConfig

from conftest import open_test_backend
from test_worker import run_until

T0 = 1_700_000_000.0


# -- the arithmetic ------------------------------------------------------------------------

def test_a_share_doubles_what_its_owner_needs_within_half_the_room_left():
    assert shares.grown(1000, holds=0, asked=1, others_reserved=0) == 1 + shares.MIN_HEADROOM
    assert shares.grown(1000, holds=20, asked=1, others_reserved=0) == 42
    assert shares.grown(100, holds=60, asked=1, others_reserved=0) == 61 + 19  # half of the 39 left
    assert shares.grown(4, holds=0, asked=1, others_reserved=0) == 2  # half of the 3 left: 1
    assert shares.grown(4, holds=0, asked=3, others_reserved=2) == 2  # only 2 free: no headroom
    assert shares.grown(4, holds=1, asked=3, others_reserved=4) == 1  # never below its holds


def test_an_owner_starting_jobs_one_at_a_time_grows_its_share_a_few_times():
    share, grows = 0, 0
    for holds in range(200):
        if holds + 1 > share:
            share, grows = shares.grown(100_000, holds=holds, asked=1, others_reserved=0), grows + 1
    assert grows <= 6


def test_others_reserve_their_live_share_and_never_less_than_they_hold():
    live, lapsed = Share(5, T0 + 1), Share(5, T0 - 1, wanted=3)
    taken, wanted = shares.others({"a": live, "b": lapsed, "me": Share(9, T0 + 1)},
                                  {"b": 2, "c": 1, "me": 4}, "me", T0)
    assert (taken, wanted) == (5 + 2 + 1, 0)  # b's lapsed share counts its 2 holds, not its want


def test_a_share_is_given_back_down_to_its_holds_only_while_others_want():
    share = Share(6, T0 + 5)
    assert shares.kept(share, holds=2, others_wanted=0) == 6
    assert shares.kept(share, holds=2, others_wanted=1) == 2


def test_an_owner_admits_in_memory_only_with_its_margin_left():
    share = Share(3, T0 + shares.LOCAL_MARGIN + 1)
    assert shares.local_room(share, limit=10, holding=1, now=T0) == 2
    assert shares.local_room(share, limit=2, holding=1, now=T0) == 1  # a lowered limit wins
    assert shares.local_room(share, limit=10, holding=1, now=T0 + 1.5) == 0
    assert shares.local_room(None, limit=10, holding=0, now=T0) == 0


# -- on every store ------------------------------------------------------------------------

def claim(backend, n, owner, *, now=T0):
    return backend.claim(ClaimRequest(owner, ("default",), n, 60.0), now=now)


def test_a_share_moves_to_the_owner_that_wants_it(backend):
    backend.enqueue([NewJob(task="t") for _ in range(4)], now=T0)
    limit = DependencyLimit("db", concurrency=4)
    a = claim(backend, 1, "a")
    b = claim(backend, 3, "b")
    assert backend.admit_many("a", [(a[0].id, [limit])], now=T0) == {a[0].id: None}  # a's share: 2
    answers = backend.admit_many("b", [(job.id, [limit]) for job in b], now=T0)
    assert [answers[job.id] is None for job in b] == [True, True, False]
    # a renews its share with its next exchange: b wants a slot, so a keeps only what it holds.
    backend.exchange("a", [], None, now=T0 + shares.RENEW_AFTER + 1)
    assert backend.admit("b", b[2].id, [limit], now=T0 + shares.RENEW_AFTER + 1) is None
    assert backend.dependency_stats("db", now=T0 + 4).in_use == 4


def test_a_job_admitted_in_memory_holds_its_slot_once_its_owner_exchanges(backend):
    backend.enqueue([NewJob(task="t") for _ in range(3)], now=T0)
    limit = DependencyLimit("db", concurrency=10)
    first, second, third = claim(backend, 3, "w")
    assert not backend.admit_locally("w", first.id, [limit], now=T0)  # no share yet: ask the store
    done = backend.exchange("w", [], None, admit=[(first.id, [limit])], now=T0)
    assert done.refused == {}
    assert backend.admit_locally("w", second.id, [limit], now=T0)  # within the share it got
    assert backend.dependency_stats("db", now=T0).in_use == 1
    backend.exchange("w", [Outcome.ack(first.id)], None, now=T0 + 0.1)
    assert backend.dependency_stats("db", now=T0 + 0.1).in_use == 1  # second's, stored now
    assert not backend.admit_locally("w", third.id, [DependencyLimit("db", rate=5.0)], now=T0)  # rates: the store


def test_a_job_refused_by_an_exchange_is_deferred_in_it(backend):
    backend.enqueue([NewJob(task="t") for _ in range(2)], now=T0)
    limit = DependencyLimit("db", concurrency=1)
    first, second = claim(backend, 2, "w")
    done = backend.exchange("w", [], None, admit=[(first.id, [limit]), (second.id, [limit])], now=T0)
    assert list(done.refused) == [second.id] and done.refused[second.id].dependency == "db"
    stats = backend.stats("default", now=T0)
    assert (stats.running, stats.waiting_for_dependency) == (1, 1)
    assert backend.get(second.id).attempts == 0


# -- a worker under a limit that never binds -----------------------------------------------

class Calls:
    """Counts the statements of a dialect that touch a dependency's shared state, and the
    exchanges a worker had to make to have jobs admitted by the store."""

    SHARED = ("lock_dependencies", "shares_of")

    def __init__(self, monkeypatch):
        self.counts = dict.fromkeys(self.SHARED, 0)
        self.counts["exchanges_to_admit"] = 0
        for tx in (SQLiteTx, PostgresTx):
            for name in self.SHARED:
                monkeypatch.setattr(tx, name, self._counting(name, getattr(tx, name)))
        exchange = Store.exchange

        def counted_exchange(store, *args, admit=(), **kwargs):
            self.counts["exchanges_to_admit"] += bool(admit)
            return exchange(store, *args, admit=admit, **kwargs)

        monkeypatch.setattr(Store, "exchange", counted_exchange)

    def _counting(self, name, method):
        def counted(tx, *args, **kwargs):
            self.counts[name] += 1
            return method(tx, *args, **kwargs)
        return counted


def drain(url, jobs, *, limit: DependencyLimit | None, concurrency=4):
    app = Queue(url)
    ran: list[int] = []
    lock = threading.Lock()

    @app.task("noop", uses=["db"])
    def noop(i):
        with lock:
            ran.append(i)

    noop.map([(i,) for i in range(jobs)])
    config = WorkerConfig(concurrency=concurrency, idle_poll_max=0.05, dependency_limits={"db": limit} if limit else {})
    try:
        worker, _, code = run_until(app, lambda: len(ran) >= jobs, config=config, timeout=60)
    finally:
        app.close()
    assert code == 0
    return worker, ran


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_limit_that_never_binds_locks_its_dependency_row_a_few_times_not_per_job(kind, tmp_path, request,
                                                                                  monkeypatch):
    store = open_test_backend(kind, tmp_path, request.getfixturevalue("pg_server") if kind == "postgres" else None)
    url = store.url
    store.close()
    calls = Calls(monkeypatch)
    worker, ran = drain(url, 600, limit=DependencyLimit("db", concurrency=100_000))
    assert sorted(ran) == list(range(600))  # every job ran, once
    assert worker.counters.deferred == 0
    # The first start asks for a share (with headroom for the next batches); after that the
    # worker admits in its own memory and stores the holds with its exchanges.
    assert calls.counts["lock_dependencies"] <= 5, calls.counts
    assert calls.counts["shares_of"] <= 5, calls.counts
    assert calls.counts["exchanges_to_admit"] <= 5, calls.counts


def test_jobs_claimed_ahead_hold_no_slot_until_they_start(tmp_path):
    # One slot of the dependency, one worker claiming ahead (no-op jobs): had the prefetched
    # jobs been admitted when claimed, all but one would be refused and deferred each time.
    url = f"sqlite:///{tmp_path / 'q.db'}?synchronous=normal"
    worker, ran = drain(url, 200, limit=DependencyLimit("db", concurrency=1), concurrency=1)
    assert sorted(ran) == list(range(200))
    assert worker.counters.deferred == 0
    assert worker.counters.done == 200
