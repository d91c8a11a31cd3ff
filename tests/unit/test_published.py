"""The controller publishes one immutable snapshot per tick, and the API faces read only that."""

from __future__ import annotations

import asyncio
import dataclasses
import types

import pytest

from flexiqd.config import parse_config
from flexiqd.daemon.api_port import DaemonPort
from flexiqd.daemon.compose import build_controller
from flexiqd.errors import ControlError
from flexiqd.queue.types import NewJob
from flexiqd.queue.url import open_backend

from fakes import Clock, FakeFleet

POOL = "pools:\n  default:\n    max_workers: 8\n    concurrency: 2\n"


@pytest.fixture
def backend(tmp_path):
    store = open_backend(f"sqlite:///{tmp_path / 'q.db'}")
    yield store
    store.close()


def make(backend, text=POOL):
    fleet, clock = FakeFleet(), Clock()
    controller = build_controller(parse_config(text, "test.yaml"), backend, fleet, host="h", clock=clock,
                                  pid_alive=lambda pid: True)
    return controller, fleet, clock


def test_each_tick_replaces_the_snapshot_and_leaves_the_one_before_as_it_was(backend):
    controller, fleet, clock = make(backend)
    before = controller.published
    assert dict(before.views) == {} and before.events == ()  # published at once: nothing seen yet
    fleet.add("default", 1, started_at=clock.now - 100)
    backend.enqueue([NewJob(task="t")] * 200, now=clock.now - 60)
    decision = controller.tick()["default"]
    after = controller.published
    assert after is not before
    assert after.views["default"].decision == decision and after.events[-1].desired == decision.desired
    assert dict(before.views) == {} and before.events == ()  # a reader holding the old one sees no change
    with pytest.raises(dataclasses.FrozenInstanceError):
        after.views = {}
    with pytest.raises(TypeError):
        after.views["other"] = after.views["default"]  # read-only, not a view of the controller's dict
    clock.now += 10  # the next step of the charts' samples
    controller.tick()
    assert len(controller.published.samples.since("default", 0)) == 2
    assert len(after.samples.since("default", 0)) == 1  # its samples are a copy: the next tick left them


def test_a_reload_and_an_operators_request_publish_what_they_change(backend):
    controller, fleet, clock = make(backend)
    controller.tick()
    controller.reconfigure(parse_config(POOL + "  other:\n    max_workers: 2\n", "test.yaml"))
    assert set(controller.published.config.pools) == {"default", "other"}
    daemon = StubDaemon(controller, backend)
    daemon.controller = controller  # the request goes to the controller itself
    daemon.wake = lambda: None
    port = DaemonPort(daemon)
    asyncio.run(port.pin("default", 3, None))
    # Seen in the Status document at once, not only after the tick the request wakes.
    assert asyncio.run(port.status())["pools"]["default"]["pinned"] == {"workers": 3, "until": None}
    assert controller.published.overrides["default"].pinned == 3


class StubDaemon:
    """What DaemonPort reads of the daemon, with a controller that has nothing but ``published``:
    any other attribute read would fail."""

    def __init__(self, controller, backend) -> None:
        self.controller = types.SimpleNamespace(published=controller.published)
        self.backend = backend
        self.config = controller.config
        self.config_error = None
        self.options = types.SimpleNamespace(config_path="/etc/flexiqd/flexiqd.yaml")
        self.hosts = None
        self.schedules = None

    async def io(self, fn, *args, what=""):
        return fn(*args)


def test_the_api_faces_read_only_the_published_snapshot(backend):
    controller, fleet, clock = make(backend)
    fleet.add("default", 1, started_at=clock.now - 100)
    backend.enqueue([NewJob(task="t", queue="default")] * 50, now=clock.now - 60)
    controller.tick()
    port = DaemonPort(StubDaemon(controller, backend))

    status = asyncio.run(port.status())
    assert status["pools"]["default"]["desired"] == controller.published.views["default"].decision.desired
    assert asyncio.run(port.queue_stats())["default"].runnable == 50
    events = asyncio.run(port.events_since(0))
    assert [e["seq"] for e in events] == [e.seq for e in controller.published.events] and events
    history = asyncio.run(port.history("default", 0))
    assert history["pool"] == "default" and history["events"] == events
    with pytest.raises(ControlError, match="no pool 'nope'"):
        asyncio.run(port.history("nope", 0))
