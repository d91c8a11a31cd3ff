"""Workers started ahead of a schedule's firing: its size measured from the queue's arrivals
(fan-out included), counted as jobs coming due within the lead time."""

from __future__ import annotations

import pytest

from flexiqd.config import parse_config
from flexiqd.daemon.compose import build_controller
from flexiqd.errors import QueueError
from flexiqd.queue.types import NewJob
from flexiqd.queue.url import open_backend
from flexiqd.schedules.forecast import Forecast, fan_out, firings_from, jobs_coming_due

from fakes import Clock, FakeFleet


def test_a_firings_size_is_what_its_queues_arrivals_rose_by_after_its_slot():
    arrivals = {second: 2 for second in range(900, 1100)}       # a steady 2 jobs a second
    arrivals.update({1000: 2 + 1, 1001: 2 + 300, 1030: 2 + 199})  # the slot's job, and the 499 it fanned out
    assert fan_out(arrivals, 1000.0) == 500
    assert fan_out({}, 1000.0) == 0
    # A slot measured brings what was measured, one not measured its own job.
    firings = firings_from([(1000.0, 7, 1000.1, 1003.1), (940.0, 6, None, None)], {1000.0: 500})
    assert [(f.jobs, f.seconds) for f in firings] == [(500, pytest.approx(3.0)), (1, None)]


def test_a_firing_counts_as_coming_due_only_within_the_lead_time_and_until_it_fires():
    forecast = Forecast(pool="p", schedule="s", at=100.0, jobs=499.5, seconds=None, samples=2)
    assert jobs_coming_due(forecast, 95.0, 6.0) == 500
    assert jobs_coming_due(forecast, 90.0, 6.0) == 0    # later than a worker started now needs
    assert jobs_coming_due(forecast, 100.0, 6.0) == 0   # fired: its jobs are in the queue
    assert jobs_coming_due(None, 95.0, 6.0) == 0


POOL = "tick: 1s\npools:\n  default:\n    max_workers: 40\n    concurrency: 2\n    targets: {age: 10s}\n"


@pytest.fixture
def controller(tmp_path):
    backend = open_backend(f"sqlite:///{tmp_path / 'q.db'}")
    clock = Clock()
    fleet = FakeFleet()
    controller = build_controller(parse_config(POOL, "test.yaml"), backend, fleet, host="h", clock=clock)
    # Jobs like the firing's have run here before: a measured duration (1 s) to size from.
    backend.enqueue([NewJob(task="t")] * 20, now=clock.now - 41)
    from flexiqd.queue.types import ClaimRequest, Outcome
    for job in backend.claim(ClaimRequest(owner="w", queues=("default",), limit=20), now=clock.now - 40):
        backend.settle("w", [Outcome.ack(job.id)], now=clock.now - 39)
    fleet.add("default", 1, started_at=clock.now - 300)
    yield controller, fleet, clock
    backend.close()


def test_workers_for_a_measured_firing_start_before_it_fires(controller):
    controller, fleet, clock = controller
    asked = []

    def forecasts(pools, now):
        asked.append(now)
        return {"default": Forecast(pool="default", schedule="s", at=clock.now + 1.5, jobs=400, seconds=None,
                                    samples=3)}

    controller.schedule_forecasts = forecasts
    decision = controller.tick()["default"]
    print(decision.line())
    assert asked and decision.reason == "ScaleUpComingDue" and decision.desired > 10
    assert "400 jobs come due" in decision.message
    assert len(fleet.started) == decision.desired - 1


def test_no_workers_ahead_of_a_firing_too_far_off_or_whose_past_cannot_be_read(controller):
    controller, fleet, clock = controller
    controller.schedule_forecasts = lambda pools, now: {
        "default": Forecast(pool="default", schedule="s", at=clock.now + 120, jobs=400, seconds=None, samples=3)}
    assert controller.tick()["default"].desired == 1

    def broken(pools, now):
        raise QueueError("the store is down")

    controller.schedule_forecasts = broken
    clock.now += 119
    assert controller.tick()["default"].desired == 1
