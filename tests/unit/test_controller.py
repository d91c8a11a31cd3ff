"""The control loop's tick against a fake fleet and a real SQLite store (time injected)."""

from __future__ import annotations

import os

import pytest

from flexiqd.config import parse_config
from flexiqd.daemon.controller import Controller, choose_victims, free_indices
from flexiqd.errors import QueueError
from flexiqd.fleet.base import WorkerInfo, WorkerState
from flexiqd.queue.types import ClaimRequest, NewJob
from flexiqd.queue.url import open_backend

from fakes import FakeFleet

HOST = "testhost"


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def backend(tmp_path):
    store = open_backend(f"sqlite:///{tmp_path / 'q.db'}")
    yield store
    store.close()


def make(backend, text: str, *, alive=lambda pid: True, clock=None):
    config = parse_config(text, "test.yaml")
    fleet = FakeFleet()
    clock = clock or Clock()
    controller = Controller(config, backend, fleet, host=HOST, clock=clock, pid_alive=alive)
    return controller, fleet, clock


POOL = "pools:\n  default:\n    max_workers: 8\n    concurrency: 2\n"


def test_a_burst_scales_the_pool_up_with_new_instance_numbers(backend):
    controller, fleet, clock = make(backend, POOL)
    fleet.add("default", 1, started_at=clock.now - 100)
    backend.enqueue([NewJob(task="t")] * 200, now=clock.now - 60)  # waiting a minute already
    decisions = controller.tick()
    decision = decisions["default"]
    assert decision.desired > decision.current == 1
    assert fleet.started == [("default", i) for i in range(2, decision.desired + 1)]
    assert controller.events[-1].previous == 1 and controller.events[-1].desired == decision.desired
    assert decision.reason.startswith("ScaleUp") or decision.reason == "RateLimited"


def test_an_idle_pool_is_brought_up_to_its_minimum(backend):
    controller, fleet, _ = make(backend, "pools:\n  default:\n    min_workers: 2\n")
    controller.tick()
    assert fleet.started == [("default", 1), ("default", 2)]


def test_a_failed_stats_read_holds_the_pool(backend, monkeypatch):
    controller, fleet, clock = make(backend, POOL)
    for index in (1, 2, 3):
        fleet.add("default", index, started_at=clock.now)

    def broken(*args, **kwargs):
        raise QueueError("the queue database is locked")

    monkeypatch.setattr(backend, "stats", broken)
    decision = controller.tick()["default"]
    assert decision.desired == decision.current == 3
    assert decision.reason == "HoldMetricsUnavailable"
    assert fleet.started == [] and fleet.stopped == []
    assert "stats unavailable" in controller.status_line()


def test_the_leases_of_a_dead_worker_are_released_at_once(backend):
    clock = Clock()
    dead_pid, live_pid = 4242, 4343
    controller, fleet, _ = make(backend, POOL, alive=lambda pid: pid == live_pid, clock=clock)
    fleet.add("default", 1, pid=live_pid, started_at=clock.now)
    ids = backend.enqueue([NewJob(task="t")] * 3, now=clock.now)
    backend.claim(ClaimRequest(f"{HOST}:default-2:{dead_pid}", ("default",), 2, lease_seconds=300), now=clock.now)
    backend.claim(ClaimRequest(f"{HOST}:default-1:{live_pid}", ("default",), 1, lease_seconds=300), now=clock.now)
    backend.claim(ClaimRequest(f"otherhost:default-9:{dead_pid}", ("default",), 1), now=clock.now)
    controller.tick()
    owners = backend.lease_owners()
    assert f"{HOST}:default-2:{dead_pid}" not in owners       # released, long before its lease ends
    assert owners[f"{HOST}:default-1:{live_pid}"] == 1         # a live worker keeps its job
    released = [backend.get(i) for i in ids[:2]]
    assert all(job.state.value == "queued" and "worker default-2 died" in job.error for job in released)


def test_failed_workers_are_forgotten_and_replaced_below_the_minimum(backend):
    controller, fleet, clock = make(backend, "pools:\n  default:\n    min_workers: 2\n")
    fleet.add("default", 1, started_at=clock.now)
    fleet.add("default", 2, WorkerState.FAILED)
    controller.tick()
    assert fleet.forgotten == [("default", 2)]
    assert fleet.started == [("default", 2)]  # the number is free again


def test_workers_of_a_pool_no_longer_configured_are_drained(backend):
    controller, fleet, clock = make(backend, POOL)
    fleet.add("default", 1, started_at=clock.now)
    fleet.add("images", 1, started_at=clock.now)
    controller.tick()
    assert ("images", 1) in fleet.stopped and ("default", 1) not in fleet.stopped


def test_victims_are_starting_then_idle_then_newest():
    workers = [WorkerInfo("p", 1, WorkerState.ACTIVE, 11, 100.0),
               WorkerInfo("p", 2, WorkerState.ACTIVE, 12, 200.0),
               WorkerInfo("p", 3, WorkerState.ACTIVE, 13, 300.0),
               WorkerInfo("p", 4, WorkerState.STARTING, 14, None)]
    busy = {"p-3": 2, "p-2": 0}
    order = [w.index for w in choose_victims(workers, 4, busy)]
    assert order == [4, 2, 1, 3]  # starting; idle newest, idle older; the busy one last


def test_free_indices_fill_gaps_from_one():
    assert free_indices({1, 3}, 3) == [2, 4, 5]


def test_scale_in_waits_for_the_down_window_then_stops_idle_workers(backend):
    text = "pools:\n  default:\n    max_workers: 8\n    behavior: {down_window: 60s}\n"
    controller, fleet, clock = make(backend, text)
    for index in range(1, 5):
        fleet.add("default", index, started_at=clock.now + index)
    first = controller.tick()["default"]
    assert first.desired == 4  # the first dip after a start is held for the down window
    clock.now += 61
    for _ in range(5):
        controller.tick()
        clock.now += 61
    assert fleet.stopped, "an idle pool never shrank"
    assert fleet.stopped[0] == ("default", 4)  # the newest idle worker goes first


def test_reload_keeps_the_history_of_pools_that_stay(backend):
    controller, fleet, clock = make(backend, POOL)
    controller.tick()
    assert "default" in controller.histories
    controller.reconfigure(parse_config("pools:\n  default: {}\n  other: {}\n", "x"))
    assert "default" in controller.histories
    controller.reconfigure(parse_config("pools:\n  other: {}\n", "x"))
    assert "default" not in controller.histories


def test_the_flexiq_policy_reproduces_its_rationale(backend):
    text = ("pools:\n  default:\n    policy: flexiq\n    max_workers: 20\n"
            "    flexiq: {target_queue_depth_per_worker: 10, tolerance: 0}\n")
    controller, fleet, clock = make(backend, text)
    fleet.add("default", 1, started_at=clock.now)
    backend.enqueue([NewJob(task="t")] * 100, now=clock.now)
    backend.enqueue([NewJob(task="t", delay=3600)] * 500, now=clock.now)  # delayed: not counted
    decision = controller.tick()["default"]
    assert decision.desired == 10
    assert decision.rationale.endswith("scale-up: depth=10 util=0 overload=false")


def test_status_line_summarises_each_pool(backend):
    controller, fleet, clock = make(backend, POOL)
    fleet.add("default", 1, started_at=clock.now)
    backend.enqueue([NewJob(task="t")], now=clock.now - 2.1)
    controller.tick()
    assert controller.status_line().startswith("default ")
    assert "/8 age 2.1s ttd" in controller.status_line()


def test_a_p99_above_the_drain_budget_is_warned_about_once(backend, caplog):
    controller, fleet, clock = make(backend, "pools:\n  default:\n    drain_timeout: 5s\n")
    fleet.add("default", 1, started_at=clock.now)
    ids = backend.enqueue([NewJob(task="t")] * 3, now=clock.now - 20)
    backend.claim(ClaimRequest(f"{HOST}:default-1:1", ("default",), 3), now=clock.now - 20)
    from flexiqd.queue.types import Outcome

    backend.settle(f"{HOST}:default-1:1", [Outcome.ack(i) for i in ids], now=clock.now - 1)  # 19 s jobs
    controller.tick()
    controller.tick()
    warnings = [r for r in caplog.records if "exceeds drain_timeout" in r.getMessage()]
    assert len(warnings) == 1 and "p99 job duration 19.0s" in warnings[0].getMessage()


def test_finished_jobs_past_their_retention_are_removed_once_a_minute(backend):
    from flexiqd.queue.types import Outcome

    clock = Clock()
    controller, fleet, _ = make(backend, "retention: 1h\ndead_retention: 2h\n" + POOL, clock=clock)
    old, recent = backend.enqueue([NewJob(task="t"), NewJob(task="t")], now=clock.now - 7200)
    backend.claim(ClaimRequest("w", ("default",), 2), now=clock.now - 7200)
    backend.settle("w", [Outcome.ack(old)], now=clock.now - 3700)
    backend.settle("w", [Outcome.dead(recent, "bad")], now=clock.now - 3700)
    controller.tick()
    remaining = {job.id for job in backend.list_jobs(limit=10)}
    assert remaining == {recent}  # the done job is past 1h; the dead one is within 2h


def test_the_process_fleet_shuts_down_workers_that_already_exited():
    import sys

    from flexiqd.fleet.base import WorkerSpec
    from flexiqd.fleet.process import ProcessFleet, _Child

    fleet = ProcessFleet()
    spec = WorkerSpec(pool="p", app="a:q", queues=("q",), concurrency=1, drain_timeout=1,
                      lease_seconds=30, store_url="sqlite:////nonexistent.db")
    import subprocess

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    fleet._children[("p", 1)] = _Child(spec, 1, gone, 0.0)
    fleet.shutdown()  # must not trip over a worker that is no longer there
    assert fleet.pids() == []
