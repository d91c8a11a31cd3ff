"""The store's clock (flexiqd.queue.store.clock): a step of a process's wall clock moves no lease, no
run-at and no heartbeat.  Pure clocks with their reads given; then both stores, with the wall
clock of "another process" (``time.time`` as the stores read it) stepped by minutes."""

from __future__ import annotations

import time

import pytest

from flexiqd.daemon.hosts import HostHeartbeat
from flexiqd.queue.store import clock as store_clock
from flexiqd.queue.store.clock import Anchor, AnchoredClock, ServerClock, anchor_for_boot, offset_from, worth_storing
from flexiqd.queue.owners import owner_name
from flexiqd.queue.types import ClaimRequest, JobState, NewJob
from flexiqd.queue.url import open_backend

from conftest import open_test_backend

STEP = 300.0  # five minutes, as an NTP step or an operator's `date -s` might make


class Reading:
    """A clock a test sets."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- pure -------------------------------------------------------------------------------------

def test_the_boot_s_anchor_is_kept_whatever_the_wall_clock_says_now():
    stored = Anchor("boot-1", 1_000.0, 50.0)
    assert anchor_for_boot(stored, "boot-1", wall=1_000.0 + STEP, since=60.0) == stored
    assert anchor_for_boot(stored, "boot-1", wall=1_000.0 - STEP, since=60.0) == stored


def test_a_new_boot_anchors_at_the_wall_clock_but_never_behind_the_old_anchor():
    stored = Anchor("boot-1", 1_000.0, 50.0)
    assert anchor_for_boot(stored, "boot-2", wall=5_000.0, since=3.0) == Anchor("boot-2", 5_000.0, 3.0)
    assert anchor_for_boot(stored, "boot-2", wall=900.0, since=3.0) == Anchor("boot-2", 1_000.0, 3.0)
    assert anchor_for_boot(None, "boot-1", wall=7.0, since=1.0) == Anchor("boot-1", 7.0, 1.0)
    # A process that cannot read the boot id (a sandboxed worker unit) takes the stored anchor,
    # unless CLOCK_BOOTTIME says it is an older boot's; it never stores one of its own.
    assert anchor_for_boot(stored, "", wall=2_000.0, since=60.0) == stored
    assert anchor_for_boot(stored, "", wall=2_000.0, since=3.0) == Anchor("", 2_000.0, 3.0)
    assert not worth_storing(Anchor("", 2_000.0, 3.0), stored)
    assert worth_storing(Anchor("boot-2", 2_000.0, 3.0), stored) and not worth_storing(stored, stored)


def test_an_anchored_clock_counts_elapsed_time_only():
    elapsed = Reading(50.0)
    clock = AnchoredClock(Anchor("b", 1_000.0, 50.0), elapsed=elapsed)
    assert clock() == 1_000.0
    elapsed.now = 62.5
    assert clock() == 1_012.5


def test_the_server_s_time_is_taken_halfway_through_the_round_trip():
    assert offset_from(10_000.0, sent=100.0, received=100.2) == pytest.approx(10_000.0 - 100.1)


def test_the_server_clock_reads_the_wall_clock_until_measured_then_never_again():
    elapsed, wall = Reading(100.0), Reading(5_000.0)
    clock = ServerClock(elapsed=elapsed, wall=wall, refresh=60.0)
    assert not clock.measured and clock.due() and clock() == 5_000.0

    def server() -> float:
        elapsed.now += 0.002  # the round trip
        return 9_000.0

    clock.measure(server)
    assert clock.measured and not clock.due()
    assert clock() == pytest.approx(9_000.0 + 0.001)
    wall.now += STEP  # the host's wall clock steps: the server's time does not
    elapsed.now += 10.0
    assert clock() == pytest.approx(9_010.0 + 0.001)
    wall.now -= 2 * STEP
    assert clock() == pytest.approx(9_010.0 + 0.001)
    elapsed.now += 50.0
    assert clock.due()  # measured again every minute


def test_the_server_clock_knows_how_far_off_it_may_be():
    elapsed = Reading(100.0)
    clock = ServerClock(elapsed=elapsed, wall=Reading(0.0))
    assert clock.error() == 0.0

    def server() -> float:
        elapsed.now += 0.004  # a 4 ms round trip: the answer came from somewhere within it
        return 9_000.0

    clock.measure(server)
    assert clock.error() == pytest.approx(0.002)


def test_a_delayed_job_is_never_due_before_its_delay_however_far_off_the_estimate(postgres_backend):
    """Whoever enqueues writes the delay from the latest the server's time can be; whoever
    promotes reads the earliest: between two estimates each half a round trip off, the job still
    starts after its delay on the server's clock (a start under half a millisecond early was seen between hosts)."""
    store = postgres_backend
    store.database._clock._error = 0.5  # as if the last measurement took a second's round trip
    enqueued = store.clock()
    delayed, = store.enqueue([NewJob(task="later", delay=2.0)], now=enqueued)
    run_at = store.get(delayed).run_at
    assert run_at == pytest.approx(enqueued + 2.5)
    # A claimer whose estimate reads 0.4 s past run_at may be 0.5 s ahead: not yet.
    owner = owner_name("default-1")
    assert store.claim(ClaimRequest(owner, ("default",), 1, 30.0), now=run_at + 0.4) == []
    [job] = store.claim(ClaimRequest(owner, ("default",), 1, 30.0), now=run_at + 0.5)
    assert job.id == delayed


def test_a_step_of_the_server_s_own_clock_is_noticed_and_settles():
    elapsed = Reading(100.0)
    clock = ServerClock(elapsed=elapsed, wall=Reading(0.0), refresh=10.0)
    clock.measure(lambda: 9_000.0)
    elapsed.now += 10.0
    clock.measure(lambda: 9_010.1)  # 0.1 s off the local count: not a step
    assert clock.steady() and clock.last_step is None
    elapsed.now += 10.0
    clock.measure(lambda: 9_020.0 + STEP)  # the server's clock stepped forward 5 minutes
    assert clock.last_step == pytest.approx(STEP, abs=0.2)
    assert not clock.steady() and clock() == pytest.approx(9_020.0 + STEP, abs=0.2)
    elapsed.now += store_clock.SERVER_STEP_SETTLE
    assert clock.steady()


def test_no_host_is_found_dead_just_after_the_server_s_clock_stepped(postgres_backend):
    """A host that has not measured the step yet beats in the time before it: the rescuer, which
    measures the server's clock afresh, waits for every process to have measured it."""
    store = postgres_backend
    a = HostHeartbeat(store, "a", lambda: 2.0, lambda: {"pools": {}}, clock=lambda: store.clock() - STEP)
    a.beat()  # "a" beats in a time five minutes behind the server's
    store.enqueue([NewJob(task="t")], now=store.clock() - STEP)
    [job] = store.claim(ClaimRequest(owner_name("default-1", 42, host="a"), ("default",), 1, 4.0),
                        now=store.clock() - STEP)
    server = store.database._clock
    offset = server() - store_clock.elapsed()
    server.measure(lambda: store_clock.elapsed() + offset + STEP)  # as if the server's clock stepped
    assert store.rescue_dead_hosts(now=store.clock(), exclude=("b",)) == {}
    assert store.get(job.id).state is JobState.RUNNING
    # Without a step measured, the same host five minutes behind is dead, and its job comes back.
    store.database._clock = ServerClock()
    assert store.rescue_dead_hosts(now=store.clock(), exclude=("b",)) == {"a": 1}


# -- both stores: a process whose wall clock stepped --------------------------------------------

@pytest.fixture
def stepped_wall(monkeypatch):
    """Step ``time.time`` (the wall clock every module reads) by ``offset`` seconds."""
    real = time.time

    def step(offset: float) -> None:
        monkeypatch.setattr(time, "time", lambda: real() + offset)

    return step


def _second_process(backend, backend_kind, tmp_path, pg_url):
    return open_test_backend("sqlite", tmp_path) if backend_kind == "sqlite" else open_backend(pg_url)


@pytest.fixture
def store_and_url(backend_kind, tmp_path, request):
    if backend_kind == "sqlite":
        store = open_test_backend("sqlite", tmp_path)
        yield store, None
    else:
        url = request.getfixturevalue("pg_server").fresh_url()
        store = open_backend(url)
        yield store, url
    store.close()


def test_a_process_whose_wall_clock_stepped_reads_the_same_store_time(store_and_url, backend_kind, tmp_path,
                                                                       stepped_wall):
    store, url = store_and_url
    for offset in (STEP, -STEP):
        stepped_wall(offset)
        other = _second_process(store, backend_kind, tmp_path, url)
        try:
            assert abs(other.clock() - store.clock()) < 0.5
            assert abs(store.clock() - (time.time() - offset)) < 0.5  # neither moved with the wall clock
        finally:
            other.close()


def test_a_wall_clock_step_brings_no_delayed_job_due_and_expires_no_lease(store_and_url, stepped_wall):
    store, _ = store_and_url
    owner = owner_name("default-1")
    delayed, = store.enqueue([NewJob(task="later", delay=60.0)], now=store.clock())
    store.enqueue([NewJob(task="now")], now=store.clock())
    [running] = store.claim(ClaimRequest(owner, ("default",), 1, 30.0), now=store.clock())
    stepped_wall(STEP)
    # Everything reads the store's clock: a minute of delay and 30 s of lease are still ahead.
    assert store.stats("default", now=store.clock()).delayed == 1
    assert store.claim(ClaimRequest(owner_name("default-2", 1), ("default",), 5, 30.0), now=store.clock()) == []
    assert store.get(delayed).state is JobState.QUEUED
    assert store.get(running.id).lease_expires > store.clock() + 25.0
    stepped_wall(-STEP)
    assert store.get(delayed).run_at > store.clock() + 55.0


def test_a_host_whose_wall_clock_is_off_by_minutes_neither_dies_nor_kills(store_and_url, stepped_wall):
    """Two hosts beating through their own processes' store clocks: the one whose wall clock is
    five minutes behind stays alive in the other's eyes, and finds it alive too.  (With each
    host's wall clock as its ``now``, the behind one looked dead, and its jobs were rescued.)"""
    store, _ = store_and_url
    a = HostHeartbeat(store, "a", lambda: 2.0, lambda: {"pools": {}})
    b = HostHeartbeat(store, "b", lambda: 2.0, lambda: {"pools": {}})
    a.beat()
    store.enqueue([NewJob(task="t")] * 2, now=store.clock())
    jobs = store.claim(ClaimRequest(owner_name("default-1", 42, host="a"), ("default",), 2, 4.0), now=store.clock())
    stepped_wall(-STEP)  # "host b": its wall clock five minutes behind
    assert b.beat() == {}
    stepped_wall(STEP)   # "host a", five minutes ahead
    assert a.beat() == {}
    assert [(h.name, h.alive) for h in b.fleet()] == [("a", True), ("b", True)]
    assert [(h.name, h.alive) for h in a.fleet()] == [("a", True), ("b", True)]
    assert all(store.get(job.id).state is JobState.RUNNING for job in jobs)


def test_the_sqlite_store_anchors_once_per_boot(tmp_path, monkeypatch, stepped_wall):
    first = open_test_backend("sqlite", tmp_path)
    try:
        stepped_wall(STEP)
        again = open_test_backend("sqlite", tmp_path)  # same boot, wall clock stepped: same anchor
        assert abs(again.clock() - first.clock()) < 0.5
        again.close()
        monkeypatch.setattr(store_clock, "boot_id", lambda: "a later boot")
        rebooted = open_test_backend("sqlite", tmp_path)  # a new boot anchors at the wall clock
        assert abs(rebooted.clock() - time.time()) < 0.5
        rebooted.close()
        monkeypatch.setattr(store_clock, "boot_id", lambda: "")  # a worker unit: cannot read it
        worker = open_test_backend("sqlite", tmp_path)
        assert abs(worker.clock() - time.time()) < 0.5  # the later boot's anchor, stored
        worker.close()
    finally:
        first.close()
