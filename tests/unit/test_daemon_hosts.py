"""The daemon's side of a fleet: its heartbeat, the rescue of dead hosts' jobs, and the tick
held to this host's share of global caps -- several "hosts" on one real SQLite store."""

from __future__ import annotations

import pytest

from flexiqd.config import parse_config
from flexiqd.daemon.compose import build_controller
from flexiqd.daemon.hosts import HostHeartbeat
from flexiqd.errors import StoreUnavailable
from flexiqd.queue.owners import owner_name
from flexiqd.queue.types import ClaimRequest, JobState, NewJob, Outcome
from flexiqd.queue.url import open_backend

from fakes import Clock, FakeFleet


@pytest.fixture
def backend(tmp_path):
    store = open_backend(f"sqlite:///{tmp_path / 'q.db'}")
    yield store
    store.close()


def beat_of(backend, host, clock, report=None, capacities=None, interval=2.0):
    return HostHeartbeat(backend, host, lambda: interval, lambda: report or {"pools": {}}, clock=clock,
                         capacities=(lambda: capacities) if capacities else dict)


def test_a_beat_registers_the_host_and_reads_the_fleet(backend):
    clock = Clock()
    beat_of(backend, "a", clock).beat()
    b = beat_of(backend, "b", clock)
    b.beat()
    assert [(h.name, h.alive) for h in b.fleet()] == [("a", True), ("b", True)]


def test_a_live_host_hands_back_the_jobs_of_a_host_that_stopped_beating(backend):
    clock = Clock()
    a, b = beat_of(backend, "a", clock), beat_of(backend, "b", clock)
    a.beat()
    b.beat()
    backend.enqueue([NewJob(task="t")] * 3, now=clock.now)
    jobs = backend.claim(ClaimRequest(owner_name("default-1", 42, host="a"), ("default",), 3, 4.0),
                         now=clock.now)
    clock.now += 3.0
    b.beat()
    assert all(backend.get(job.id).state is JobState.RUNNING for job in jobs)  # a is not dead yet
    clock.now += 2.0  # a's beat is 5 s old (> 2 x 2 s) and its leases (4 s) ran out
    assert b.beat() == {"a": 3}
    assert b.rescued == 3
    assert all(backend.get(job.id).state is JobState.QUEUED for job in jobs)


class BrokenStore:
    shared_by_hosts = True

    def heartbeat(self, *args, **kwargs):
        raise StoreUnavailable("record a heartbeat on the queue database failed: connection refused")


def test_failing_beats_give_up_every_share_after_a_heartbeat():
    clock = Clock()
    beat = beat_of(BrokenStore(), "a", clock, capacities={"db": 10})
    assert beat.beat() == {}
    assert beat.grants(clock.now + 1.0) == {}
    assert beat.failing_for(clock.now + 1.0) == 1.0
    assert beat.grants(clock.now + 2.5) is None


def report(wants, current):
    return {"pools": {"default": {"wants": wants, "current": current, "uses": {"db": [1.0, 1.0]}}}}


def test_two_hosts_share_a_global_capacity_and_never_grant_more_than_it(backend):
    clock = Clock()
    reports = {"a": report(10, 0), "b": report(10, 0)}
    beats = {h: HostHeartbeat(backend, h, lambda: 2.0, (lambda h=h: reports[h]), clock=clock,
                              capacities=lambda: {"db": 10.0}) for h in "ab"}
    for _ in range(4):
        for host, beat in beats.items():
            beat.beat()
            grants = {h: (b.grants(clock.now) or {}).get("default", {}).get("db", 0) for h, b in beats.items()}
            assert sum(grants.values()) <= 10
            # Each host runs what it was granted.
            reports[host] = report(10, grants[host])
    assert grants == {"a": 5, "b": 5}


def test_a_dead_host_gives_its_share_back(backend):
    clock = Clock()
    reports = {"a": report(10, 0), "b": report(10, 0)}
    beats = {h: HostHeartbeat(backend, h, lambda: 2.0, (lambda h=h: reports[h]), clock=clock,
                              capacities=lambda: {"db": 10.0}) for h in "ab"}
    for _ in range(3):
        for host, beat in beats.items():
            beat.beat()
            reports[host] = report(10, beat.grants(clock.now).get("default", {}).get("db", 0))
    clock.now += 5.0  # a stops beating
    for _ in range(3):
        beats["b"].beat()
    assert beats["b"].grants(clock.now)["default"]["db"] == 10


GLOBAL = """
dependencies: {db: {capacity: 6, global: true}}
pools:
  default: {concurrency: 1, max_workers: 20, uses: {db: {per_worker: 1}}}
"""


def test_the_tick_holds_a_pool_to_its_grant_and_publishes_what_it_wants(backend):
    clock = Clock()
    config = parse_config(GLOBAL, "test.yaml")
    fleet = FakeFleet()
    controller = build_controller(config, backend, fleet, host="a", clock=clock, pid_alive=lambda pid: True)
    controller.fleet_grants = lambda now: {"default": {"db": 2}}
    fleet.add("default", 1, started_at=clock.now - 100)
    backend.enqueue([NewJob(task="t")] * 500, now=clock.now - 120)
    decision = controller.tick()["default"]
    assert decision.desired == 2
    assert decision.reason == "CappedByDependency"
    published = controller.published.fleet_report["pools"]["default"]
    assert published["wants"] > 2 and published["uses"] == {"db": [1.0, 1.0]}
    assert controller.published.global_caps == {"db": 6.0}


def test_a_pool_with_a_global_cap_holds_its_count_before_the_first_grant(backend):
    clock = Clock()
    fleet = FakeFleet()
    controller = build_controller(parse_config(GLOBAL, "test.yaml"), backend, fleet, host="a", clock=clock,
                                  pid_alive=lambda pid: True)
    controller.fleet_grants = lambda now: {}
    fleet.add("default", 1, started_at=clock.now - 100)
    backend.enqueue([NewJob(task="t")] * 500, now=clock.now - 120)
    assert controller.tick()["default"].desired == 1
    controller.fleet_grants = lambda now: None  # beats failing: no share at all
    decision = controller.tick()["default"]
    # Capped to nothing; the one worker a backlog keeps (the pool's floor) comes after the caps.
    assert (decision.capped, decision.desired, decision.reason) == (0, 1, "RaisedToMinimum")


def test_the_status_shows_the_fleet_and_each_global_caps_use_and_this_hosts_share(backend):
    from flexiqd.cli.render import render_status
    from flexiqd.daemon.documents import hosts_document, status_document

    clock = Clock()
    reports = {"a": report(10, 0), "b": report(10, 0)}
    beats = {h: HostHeartbeat(backend, h, lambda: 2.0, (lambda h=h: reports[h]), clock=clock,
                              capacities=lambda: {"db": 10.0}) for h in "ab"}
    for _ in range(4):
        for host, beat in beats.items():
            beat.beat()
            reports[host] = report(10, beat.grants(clock.now).get("default", {}).get("db", 0))
    beats["a"].beat()
    document = hosts_document(beats["a"], {"db": 10.0}, clock.now)
    assert [m["name"] for m in document["members"]] == ["a", "b"]
    assert document["global"]["db"]["fleet_use"] == 10.0
    assert (document["global"]["db"]["share"], document["global"]["db"]["use"]) == (5.0, 5.0)
    config = parse_config(GLOBAL, "test.yaml")
    text = render_status(status_document(config, "test.yaml", None, {}, {}, clock.now, document), clock.now)
    assert "hosts: 2 alive of 2 (this host: a)" in text
    assert "global db" in text and "fleet uses 10 of 10; this host's share 5 (uses 5)" in text
    assert status_document(config, "test.yaml", None, {}, {}, clock.now)["hosts"] is None


def test_a_dead_host_whose_workers_still_hold_jobs_keeps_its_share(backend):
    # Its daemon is down, its workers run on: nobody may take what they may be using.
    clock = Clock()
    reports = {"a": report(10, 0), "b": report(10, 0)}
    beats = {h: HostHeartbeat(backend, h, lambda: 2.0, (lambda h=h: reports[h]), clock=clock,
                              capacities=lambda: {"db": 10.0}) for h in "ab"}
    for _ in range(3):
        for host, beat in beats.items():
            beat.beat()
            reports[host] = report(10, beat.grants(clock.now).get("default", {}).get("db", 0))
    backend.enqueue([NewJob(task="t")], now=clock.now)
    [job] = backend.claim(ClaimRequest(owner_name("default-1", 42, host="a"), ("default",), 1, 60.0),
                          now=clock.now)
    clock.now += 5.0  # a's daemon stops beating; its worker's lease runs for a minute
    for _ in range(3):
        beats["b"].beat()
    assert beats["b"].grants(clock.now)["default"]["db"] == 5
    backend.settle(job.lease_owner, [Outcome.ack(job.id)], now=clock.now)  # a's worker is done
    for _ in range(2):
        beats["b"].beat()
    assert beats["b"].grants(clock.now)["default"]["db"] == 10


def test_a_machine_alone_with_nothing_shared_gets_no_fleet_section(backend):
    from flexiqd.cli.render import render_status
    from flexiqd.daemon.documents import hosts_document, status_document

    clock = Clock()
    beat = beat_of(backend, "a", clock)
    beat.beat()
    config = parse_config("pools: {default: {}}", "test.yaml")
    document = status_document(config, "test.yaml", None, {}, {}, clock.now, hosts_document(beat, {}, clock.now))
    assert document["hosts"]["members"][0]["name"] == "a"
    assert "hosts:" not in render_status(document, clock.now)


def test_peers_count_the_other_live_hosts_serving_each_pool(backend):
    clock = Clock()
    beats = {h: beat_of(backend, h, clock, report=report(1, 1)) for h in "abc"}
    beat_of(backend, "d", clock, report={"pools": {"other": {"wants": 1, "current": 1}}}).beat()
    for beat in beats.values():
        beat.beat()
    beats["a"].beat()  # its read after every other host's beat
    assert beats["a"].peers() == {"default": 2, "other": 1}
    clock.now += 10.0  # b, c and d stop beating
    beats["a"].beat()
    assert beats["a"].peers() == {}
