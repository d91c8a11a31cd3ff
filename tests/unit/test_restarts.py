"""A pool's restart in steps (flexiqd.daemon.restarts): the pure step, its bookkeeping, and the
controller following it against a fake fleet.  The real systemd: tests/system/test_restart_systemd.py."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from fakes import Clock, FakeFleet
from flexiqd.config.load import parse_config
from flexiqd.daemon.compose import build_controller
from flexiqd.daemon.controller import choose_victims
from flexiqd.daemon.restarts import (DONE, FAILED, FINISHING, REPLACING, Census, RestartFile, Restarts, Step,
                                     census, plan, policy_counts, surge)
from flexiqd.errors import ControlError
from flexiqd.fleet.base import WorkerInfo, WorkerState
from flexiqd.queue import open_backend

REQUESTED = 100.0  # CLOCK_MONOTONIC seconds of the request in these tests


def worker(index, state=WorkerState.ACTIVE, launched=REQUESTED - 50, pool="p"):
    return WorkerInfo(pool, index, state, 1000 + index, 0.0, launched=launched)


# -- the step -----------------------------------------------------------------------------------

@pytest.mark.parametrize("target, expected", [(0, 1), (1, 1), (3, 1), (4, 1), (5, 2), (8, 2), (40, 10)])
def test_a_step_is_a_quarter_of_the_target_and_at_least_one_worker(target, expected):
    assert surge(target) == expected


@pytest.mark.parametrize("seen, target, step", [
    # three old, nothing new: start one above the target, stop nothing yet
    (Census(old_ready=3), 3, Step(start=1, stop_ready=0, stop_starting=0, phase=REPLACING)),
    # the replacement is starting: wait for it (no more starts, no stop)
    (Census(old_ready=3, new_starting=1), 3, Step(0, 0, 0, REPLACING)),
    # it is ready: one old is drained, one more replacement starts
    (Census(old_ready=3, new_ready=1), 3, Step(1, 1, 0, REPLACING)),
    # an old one still starting is no capacity: stopped at once
    (Census(old_ready=2, old_starting=1, new_ready=1), 3, Step(1, 0, 1, REPLACING)),
    # the new ones cover the target: every old one left is drained
    (Census(old_ready=2, new_ready=3), 3, Step(0, 2, 0, REPLACING)),
    # a target of 0: nothing is needed, every old one goes
    (Census(old_ready=2), 0, Step(0, 2, 0, REPLACING)),
    # the target fell below the ready workers: the extra old ones go without waiting, a step starts
    (Census(old_ready=5), 2, Step(1, 3, 0, REPLACING)),
    # only old ones draining are left: finishing; then done
    (Census(old_leaving=2, new_ready=3), 3, Step(0, 0, 0, FINISHING)),
    (Census(new_ready=3), 3, Step(0, 0, 0, DONE)),
])
def test_plan(seen, target, step):
    assert plan(seen, target) == step


def _simulate(target: int, old: int) -> list[int]:
    """Follow ``plan`` to the end on a pool where a start is ready one step later and a stop
    drains one step later; the ready capacity (old and new ready) at every step."""
    seen, capacities = Census(old_ready=old), []
    for _ in range(200):
        step = plan(seen, target)
        if step.phase == DONE:
            return capacities
        seen = Census(old_ready=seen.old_ready - step.stop_ready, old_starting=0,
                      old_leaving=step.stop_ready + step.stop_starting,  # the next step they are gone
                      new_ready=seen.new_ready + seen.new_starting, new_starting=step.start)
        capacities.append(seen.old_ready + seen.new_ready)
    raise AssertionError(f"target {target}, {old} old: the restart never ended")


@pytest.mark.parametrize("target", range(0, 13))
@pytest.mark.parametrize("extra_old", [0, 1, 3])
def test_capacity_never_falls_below_the_target_and_every_old_worker_is_replaced(target, extra_old):
    old = target + extra_old
    capacities = _simulate(target, old)
    assert min(capacities, default=target) >= target
    # each step replaces up to a step's worth: the whole takes about target/step rounds of 2 ticks
    assert len(capacities) <= 2 * (-(-target // surge(target))) + 3


@pytest.mark.parametrize("active, starting, target, seen", [
    (3, 0, None, (3, 0)),     # no target yet: as seen
    (3, 1, 3, (3, 0)),        # a replacement starting above the target is hidden
    (4, 0, 3, (3, 0)),        # ready above it too
    (2, 1, 4, (2, 1)),        # below the target: as seen (the policy may grow it)
    (5, 2, 4, (4, 0)),
])
def test_the_policy_sees_a_restarting_pool_at_most_at_its_target(active, starting, target, seen):
    assert policy_counts(active, starting, target) == seen


def test_old_and_new_are_told_apart_by_when_the_process_started():
    workers = [worker(1), worker(2, launched=REQUESTED + 1), worker(3, WorkerState.STARTING, launched=None),
               worker(4, launched=None), worker(5, WorkerState.DRAINING), worker(6, WorkerState.STARTING),
               worker(7, WorkerState.FAILED)]
    retiring = {workers[0]}  # the first old one is paused to retire
    assert census(workers, REQUESTED, retiring) == Census(old_ready=1, old_starting=1, old_leaving=2,
                                                          new_ready=1, new_starting=1)


# -- the requests -------------------------------------------------------------------------------

def test_a_request_is_kept_and_a_restarted_daemon_goes_on_with_the_same_old_workers(tmp_path):
    file = RestartFile(str(tmp_path / "restarts.json"))
    clock = Clock(1_700_000_000.0)
    restarts = Restarts({"p"}, file=file, clock=clock, monotonic=lambda: REQUESTED, boot_id=lambda: "boot-a")
    first = restarts.request("p")
    restarts.update("p", target=3)
    again = Restarts({"p"}, file=file, clock=clock, monotonic=lambda: REQUESTED + 30, boot_id=lambda: "boot-a")
    request = again.active("p")
    assert request is not None and request.id == first and request.target == 3
    assert again.old(request, worker(1)) and not again.old(request, worker(2, launched=REQUESTED + 5))
    # a second request takes over: a higher id, workers started since the first are old now
    second = again.request("p")
    assert second > first and again.old(again.active("p"), worker(2, launched=REQUESTED + 5))
    again.update("p", state=DONE)
    assert again.active("p") is None and again.document("p")["state"] == DONE


def test_after_a_reboot_every_worker_is_new(tmp_path):
    file = RestartFile(str(tmp_path / "restarts.json"))
    Restarts({"p"}, file=file, monotonic=lambda: REQUESTED, boot_id=lambda: "boot-a").request("p")
    rebooted = Restarts({"p"}, file=file, monotonic=lambda: 5.0, boot_id=lambda: "boot-b")
    request = rebooted.active("p")
    assert rebooted.census(request, [worker(1, launched=1.0)], ()) == Census(new_ready=1)


def test_an_unknown_pool_is_refused_by_name():
    with pytest.raises(ControlError, match="no pool named 'x' \\(pools: p\\)"):
        Restarts({"p"}).request("x")


def test_a_damaged_file_is_one_warning(tmp_path, caplog):
    path = tmp_path / "restarts.json"
    path.write_text("{not json")
    assert Restarts({"p"}, file=RestartFile(str(path))).requests == {}
    assert "damaged" in caplog.text


def test_a_scale_in_during_a_restart_stops_old_workers_first():
    old = {("p", 1), ("p", 2)}
    workers = [worker(i, launched=REQUESTED + (0 if ("p", i) in old else 10)) for i in range(1, 5)]
    victims = choose_victims(workers, 2, {}, lambda w: (w.pool, w.index) in old)
    assert {(w.pool, w.index) for w in victims} == old


# -- the controller following a restart ---------------------------------------------------------

POOL = "pools:\n  p:\n    min_workers: 3\n    max_workers: 8\n    concurrency: 1\n"


class Pool:
    """A controller on a fake fleet whose starts become ready (``launched`` now) and whose stops
    exit one tick later; ``ready`` counts the workers that claim (ready, not stopping or paused)."""

    def __init__(self, backend, now_mono):
        config = parse_config(POOL, "test.yaml")
        self.fleet = FakeFleet()
        self.clock = Clock()
        self.mono = now_mono
        self.controller = build_controller(config, backend, self.fleet, host="h", clock=self.clock)
        self.controller.restarts = Restarts(config.pools, clock=self.clock, monotonic=lambda: self.mono,
                                            boot_id=lambda: "b")
        for index in (1, 2, 3):
            self.fleet.workers[("p", index)] = worker(index, launched=self.mono - 100)

    def ready(self) -> int:
        return sum(1 for w in self.fleet.workers.values() if w.state is WorkerState.ACTIVE
                   and w not in self.controller.retiring)

    def tick(self, fail_new: bool = False) -> None:
        self.controller.tick()
        self.clock.now += 1
        self.mono += 1
        for key, info in list(self.fleet.workers.items()):
            if info.state is WorkerState.DRAINING:
                del self.fleet.workers[key]
            elif info.state is WorkerState.STARTING:
                state = WorkerState.FAILED if fail_new else WorkerState.ACTIVE
                self.fleet.workers[key] = dataclasses.replace(info, state=state, launched=self.mono)


@pytest.fixture
def backend(tmp_path):
    store = open_backend(f"sqlite:///{tmp_path / 'q.db'}")
    yield store
    store.close()


def test_the_controller_replaces_every_worker_never_below_the_target(backend):
    pool = Pool(backend, 1000.0)
    pool.tick()
    assert pool.ready() == 3
    originals = set(pool.fleet.workers)
    pool.controller.restarts.request("p")
    samples = []
    pool.tick()
    assert "p 3/8 restarting (3 old workers left)" in pool.controller.status_line()
    for _ in range(30):
        pool.tick()
        samples.append(pool.ready())
        if pool.controller.restarts.document("p")["state"] == DONE:
            break
    assert pool.controller.restarts.document("p")["state"] == DONE
    assert min(samples) >= 3, samples
    assert "restarting" not in pool.controller.status_line()
    assert all(w.launched > 1000.0 for w in pool.fleet.workers.values())   # all new
    assert len(pool.fleet.workers) == 3                                    # and no more than needed
    assert set(pool.fleet.stopped) == originals                            # each old one drained


def test_replacements_that_keep_failing_fail_the_restart_and_the_old_workers_stay(backend):
    pool = Pool(backend, 1000.0)
    pool.tick()
    pool.controller.restarts.request("p")
    for _ in range(40):
        pool.tick(fail_new=True)
        if pool.controller.restarts.document("p")["state"] == FAILED:
            break
        pool.clock.now += 5   # past each backoff
    document = pool.controller.restarts.document("p")
    assert document["state"] == FAILED and "keep failing" in document["error"]
    assert pool.fleet.stopped == []          # no old worker was stopped
    assert pool.ready() == 3


def test_the_pool_is_resized_during_a_restart_and_never_falls_below_its_target(backend):
    pool = Pool(backend, 1000.0)
    pool.tick()
    pool.controller.restarts.request("p")
    targets = {2: 5, 6: 2, 9: 4}   # pins at these ticks: up, down, up again
    below = []
    for tick in range(40):
        if tick in targets:
            pool.controller.pin("p", targets[tick], None)
        decision = pool.controller.tick()["p"]
        pool.clock.now += 1
        pool.mono += 1
        # as the fleet stands right after the tick, before anything becomes ready
        ready = pool.ready()
        if ready < min(decision.desired, decision.current):
            below.append((tick, ready, decision.current, decision.desired))
        for key, info in list(pool.fleet.workers.items()):
            if info.state is WorkerState.DRAINING:
                del pool.fleet.workers[key]
            elif info.state is WorkerState.STARTING:
                pool.fleet.workers[key] = dataclasses.replace(info, state=WorkerState.ACTIVE, launched=pool.mono)
        if tick > 10 and pool.controller.restarts.document("p")["state"] == DONE:
            break
    assert pool.controller.restarts.document("p")["state"] == DONE
    assert below == []
    assert all(w.launched > 1000.0 for w in pool.fleet.workers.values())
    assert len(pool.fleet.workers) == 4


def test_a_restart_without_room_for_a_step_waits_and_says_so_once(backend, caplog):
    pool = Pool(backend, 1000.0)
    pool.controller.pin("p", 3, None)
    pool.controller.reconfigure(parse_config(POOL.replace("max_workers: 8", "max_workers: 3"), "test.yaml"))
    pool.tick()
    pool.controller.restarts.request("p")
    caplog.set_level(logging.INFO, logger="flexiqd.daemon.controller")
    caplog.clear()
    for _ in range(5):
        pool.tick()
    document = pool.controller.restarts.document("p")
    assert document["state"] == REPLACING and document["old_serving"] == 3
    assert document["waiting"] == "held: no room for a new worker: max_workers=3"
    assert caplog.text.count("the restart's next step is held") == 1
    assert pool.fleet.stopped == [] and pool.ready() == 3
    # Pinned one below, the restart goes on.
    pool.controller.pin("p", 2, None)
    for _ in range(20):
        pool.tick()
    assert pool.controller.restarts.document("p")["state"] == DONE
