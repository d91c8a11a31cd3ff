"""A pool whose workers keep failing: reported (status, STATUS=, metrics, journal) and its new
starts backed off, never shown as scaling on as usual."""

from __future__ import annotations

import json

import pytest

from flexiqd.cli.render import render_status
from flexiqd.config import parse_config
from flexiqd.daemon.compose import build_controller
from flexiqd.daemon.crashloop import BACKOFF_FIRST, LOOP_AFTER, WINDOW, CrashLoops, backoff
from flexiqd.daemon.documents import status_document
from flexiqd.fleet.base import WorkerState
from flexiqd.queue.url import open_backend

from fakes import Clock, FakeFleet


def test_three_failures_within_the_window_make_a_loop_and_a_quiet_window_ends_it():
    loops = CrashLoops()
    for at in (0.0, 10.0):
        loops.failed("p", at, "exited with status 69")
    assert loops.loop("p", 10.0) is None
    loops.failed("p", 20.0, None)  # how the last ended is unknown: the last known stays
    loop = loops.loop("p", 20.0)
    assert (loop.failures, loop.since, loop.last_at, loop.last_error) == (3, 0.0, 20.0, "exited with status 69")
    assert loop.next_start_at == 20.0 + BACKOFF_FIRST
    assert loops.loop("p", 20.0 + WINDOW + 1) is None
    assert [backoff(n) for n in range(LOOP_AFTER, LOOP_AFTER + 8)] == [2, 4, 8, 16, 32, 60, 60, 60]


class FailingFleet(FakeFleet):
    """Every worker it starts fails before the next tick, as a worker whose app cannot load."""

    def start(self, spec, indices):
        for index in indices:
            self.started.append((spec.pool, index))
            self.add(spec.pool, index, WorkerState.FAILED)

    def how_it_ended(self, instance, pid):
        return "exited with status 69"


@pytest.fixture
def failing(tmp_path):
    backend = open_backend(f"sqlite:///{tmp_path / 'q.db'}")
    clock = Clock()
    fleet = FailingFleet()
    config = parse_config("pools:\n  default:\n    min_workers: 1\n", "test.yaml")
    yield build_controller(config, backend, fleet, host="h", clock=clock), fleet, clock, config
    backend.close()


def test_a_pool_whose_workers_keep_failing_is_reported_and_its_starts_back_off(failing, caplog):
    controller, fleet, clock, config = failing
    started_at = []
    for _ in range(40):  # 40 ticks a second apart
        before = len(fleet.started)
        controller.tick()
        if len(fleet.started) > before:
            started_at.append(clock.now)
        clock.now += 1.0
    # Replaced at once for the first failures, then at growing intervals: not once a tick.
    gaps = [b - a for a, b in zip(started_at, started_at[1:])]
    assert gaps[:2] == [1.0, 1.0] and max(gaps) >= 8.0 and len(started_at) < 15, started_at
    view = controller.views["default"]
    assert view.crash_loop is not None and view.crash_loop.last_error == "exited with status 69"
    assert "CRASH-LOOPING" in controller.status_line()
    assert sum("is crash-looping" in r.getMessage() for r in caplog.records) == 1
    document = json.loads(json.dumps(status_document(config, "x.yaml", None, controller.views, {}, clock.now)))
    loop = document["pools"]["default"]["crash_loop"]
    assert loop["failures"] >= 3 and loop["last_error"] == "exited with status 69"
    assert "CRASH LOOP" in render_status(document, now=clock.now)
