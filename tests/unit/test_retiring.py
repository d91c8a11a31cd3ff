"""Scale-in never stops a busy worker: it is paused to retire, stopped once idle, taken back on a
scale-up (the controller against a fake fleet and a real SQLite store, time injected)."""

from __future__ import annotations

import logging

import pytest

from flexiqd.config import parse_config
from flexiqd.daemon.compose import StateFiles, build_controller
from flexiqd.errors import QueueError
from flexiqd.fleet.base import WorkerState
from flexiqd.queue.types import ClaimRequest, NewJob, Outcome

from fakes import Clock, FakeFleet

HOST = "testhost"
POOL = "pools:\n  default:\n    max_workers: 8\n"


@pytest.fixture
def backend(sqlite_backend):
    return sqlite_backend


def make(backend, text=POOL, fleet=None, tmp_path=None):
    clock = Clock()
    fleet = fleet or FakeFleet()
    intent = str(tmp_path / "intent.json") if tmp_path else None
    controller = build_controller(parse_config(text, "test.yaml"), backend, fleet, host=HOST, clock=clock,
                                  pid_alive=lambda pid: True, files=StateFiles(intent=intent))
    return controller, fleet, clock


def busy_with(backend, fleet, index: int, clock, jobs: int = 1) -> tuple[str, list[int]]:
    """Worker ``default-<index>`` runs ``jobs`` jobs; its lease owner and the jobs' ids."""
    worker = fleet.workers[("default", index)]
    owner = f"{HOST}:default-{index}:{worker.pid}"
    backend.enqueue([NewJob(task="t")] * jobs, now=clock.now)
    claimed = backend.claim(ClaimRequest(owner, ("default",), jobs, lease_seconds=3600), now=clock.now)
    assert len(claimed) == jobs
    return owner, [job.id for job in claimed]


def finish(backend, owner: str, ids: list[int], clock) -> None:
    backend.settle(owner, [Outcome.ack(i) for i in ids], now=clock.now)


def tick(controller, fleet):
    """A tick whose pause signals are the only ones ``pauses`` reports (the first tick resumes every
    ready worker a previous daemon may have paused: see test_a_restarted_daemon_resumes...)."""
    fleet.signalled = []
    return controller.tick()


def pauses(fleet, paused: bool) -> list[tuple[str, int]]:
    return [who for who, told in getattr(fleet, "signalled", []) if told is paused]


@pytest.fixture
def three(backend):
    """Three ready workers, the second and third running a job; the operator's pin asks for one."""
    controller, fleet, clock = make(backend)
    for index in (1, 2, 3):
        fleet.add("default", index, started_at=clock.now - 100 + index)
    busy_with(backend, fleet, 2, clock)
    owner, ids = busy_with(backend, fleet, 3, clock)
    controller.pin("default", 1, None)
    return controller, fleet, clock, owner, ids


def test_a_busy_victim_is_paused_not_stopped_and_the_idle_one_is_stopped_at_once(backend, three, caplog):
    controller, fleet, clock, _, _ = three
    caplog.set_level(logging.INFO, logger="flexiqd.daemon.controller")
    decision = tick(controller, fleet)["default"]
    assert (decision.current, decision.desired) == (3, 1)
    # Idle 1 goes at once; then the newest busy one, 3, is paused; 2 keeps running.
    assert fleet.stopped == [("default", 1)]
    assert pauses(fleet, True) == [("default", 3)]
    assert fleet.workers[("default", 3)].state is WorkerState.ACTIVE
    assert "Worker default-3 paused to retire" in caplog.text


def test_a_retiring_worker_counts_as_draining_and_is_not_chosen_again(backend, three):
    controller, fleet, clock, _, _ = three
    tick(controller, fleet)
    clock.now += 5
    controller.tick()
    view = controller.views["default"]
    assert (view.active, view.starting, view.draining) == (1, 0, 2)  # 1 stopping, 3 retiring
    assert view.decision.current == 1 and not view.decision.changed
    assert fleet.stopped == [("default", 1)]                         # 3 is not stopped, 2 not chosen
    assert pauses(fleet, True) == [("default", 3)]                   # and not paused twice
    fleet.add("default", 4, started_at=clock.now - 200)              # an older busy one joins
    busy_with(backend, fleet, 4, clock)
    clock.now += 5
    fleet.signalled = []
    assert controller.tick()["default"].current == 2                # 2 and 4, not 3
    assert pauses(fleet, True) == [("default", 2)]                   # the newest left, not 3 again
    assert controller.retiring.instances() == {"default-2", "default-3"}


def test_a_retiring_worker_is_stopped_on_the_first_tick_it_runs_no_job(backend, three, caplog):
    controller, fleet, clock, owner, ids = three
    controller.tick()
    for _ in range(3):  # a long job: it is not stopped however long it runs
        clock.now += 600
        controller.tick()
    assert ("default", 3) not in fleet.stopped
    finish(backend, owner, ids, clock)
    caplog.set_level(logging.INFO, logger="flexiqd.daemon.controller")
    clock.now += 5
    controller.tick()
    assert fleet.stopped == [("default", 1), ("default", 3)]
    assert "Worker default-3 retired: its jobs are done" in caplog.text
    assert not controller.retiring.instances()


def test_a_scale_up_takes_a_retiring_worker_back_before_starting_a_unit(backend, three):
    controller, fleet, clock, _, _ = three
    controller.tick()
    clock.now += 5
    controller.pin("default", 3, None)
    decision = tick(controller, fleet)["default"]
    assert (decision.current, decision.desired) == (1, 3)
    assert pauses(fleet, False) == [("default", 3)]   # resumed ...
    assert fleet.started == [("default", 4)]          # ... and one new unit for the rest (1 is stopping)
    assert not controller.retiring.instances()
    clock.now += 5
    controller.tick()
    assert controller.views["default"].active == 2    # it counts as capacity again


def test_an_operators_resume_leaves_a_retiring_worker_paused(backend, three):
    controller, fleet, clock, _, _ = three
    controller.tick()
    fleet.signalled = []
    controller.pause("default")
    controller.tick()
    controller.resume("default")
    controller.tick()
    assert pauses(fleet, True) == [("default", 2)]    # 3 was paused already
    assert pauses(fleet, False) == [("default", 2)]   # 3 stays paused


def test_the_policys_own_scale_in_pauses_a_busy_worker(backend):
    text = "pools:\n  default:\n    max_workers: 8\n    behavior: {down_window: 60s}\n"
    controller, fleet, clock = make(backend, text)
    for index in range(1, 5):
        fleet.add("default", index, started_at=clock.now + index)
    busy_with(backend, fleet, 1, clock)
    busy_with(backend, fleet, 2, clock)
    decisions = []
    for _ in range(6):
        decisions.append(controller.tick()["default"])
        clock.now += 61
    shrink = next(d for d in decisions if d.changed)
    assert (shrink.current, shrink.desired) == (4, 1)
    assert fleet.stopped == [("default", 4), ("default", 3)]   # the idle ones, at once
    assert pauses(fleet, True) == [("default", 2)]             # the newest busy one
    assert all(not d.changed for d in decisions[decisions.index(shrink) + 1:])  # held: 2 is no capacity


def test_without_a_lease_count_every_ready_victim_is_paused_and_none_is_stopped(backend, three, monkeypatch):
    controller, fleet, clock, _, _ = three

    def broken():
        raise QueueError("the queue database is locked")

    monkeypatch.setattr(backend, "lease_owners", broken)
    tick(controller, fleet)
    assert fleet.stopped == []
    assert sorted(pauses(fleet, True)) == [("default", 2), ("default", 3)]  # the newest two
    clock.now += 5
    controller.tick()
    assert fleet.stopped == []                        # nothing is known to be idle
    monkeypatch.undo()
    clock.now += 5
    controller.tick()
    assert fleet.stopped == []                        # both still run their jobs


def test_a_restarted_daemon_resumes_workers_a_previous_one_paused_to_retire(backend, three, tmp_path):
    controller, fleet, clock, _, _ = three
    controller.unpin("default")
    controller.tick()  # the policy's own decision; now a new daemon over the same workers
    second, fleet2, _ = make(backend, fleet=FakeFleet())
    fleet2.workers = dict(fleet.workers)
    second.tick()
    ready = sorted(who for who, w in fleet2.workers.items() if w.state is WorkerState.ACTIVE)
    assert sorted(pauses(fleet2, False)) == ready
    second.tick()
    assert sorted(pauses(fleet2, False)) == ready     # once


def test_a_retiring_worker_that_systemd_restarted_is_capacity_again(backend, three):
    controller, fleet, clock, _, _ = three
    controller.tick()
    fleet.add("default", 3, started_at=clock.now)     # same unit, new process (new pid)
    controller.pin("default", 2, None)
    clock.now += 5
    controller.tick()
    assert not controller.retiring.instances()
    assert controller.views["default"].active == 2


def test_an_operators_drain_stops_busy_and_retiring_workers_within_the_stop_timeout(backend, three):
    controller, fleet, clock, _, _ = three
    controller.tick()                                  # 1 stopped, 3 retiring, 2 busy
    controller.drain("default")
    clock.now += 5
    controller.tick()
    assert sorted(fleet.stopped) == [("default", 1), ("default", 2), ("default", 3)]
    assert not controller.retiring.instances()
