"""The journal fields the controller's log lines carry (MESSAGE_ID, POOL=, FROM=, TO=, ...)."""

from __future__ import annotations

import logging

import pytest

from flexiqd.config import parse_config
from flexiqd.daemon.compose import build_controller
from flexiqd.logs import MessageId
from flexiqd.queue.types import ClaimRequest, NewJob
from flexiqd.queue.url import open_backend

from fakes import FakeFleet

HOST = "testhost"
NOW = 1_000_000.0


@pytest.fixture
def backend(tmp_path):
    store = open_backend(f"sqlite:///{tmp_path / 'q.db'}")
    yield store
    store.close()


def make(backend, text, alive=lambda pid: True):
    fleet = FakeFleet()
    controller = build_controller(parse_config(text, "test.yaml"), backend, fleet, host=HOST, clock=lambda: NOW,
                                  pid_alive=alive)
    return controller, fleet


def logged(caplog, message_id):
    return [r for r in caplog.records if getattr(r, "journal", {}).get("MESSAGE_ID") == message_id]


def test_a_scale_decision_carries_pool_from_to_and_reason(backend, caplog):
    caplog.set_level(logging.INFO)
    controller, fleet = make(backend, "pools:\n  default:\n    max_workers: 8\n    concurrency: 2\n")
    fleet.add("default", 1, started_at=NOW - 100)
    backend.enqueue([NewJob(task="t")] * 200, now=NOW - 60)
    decision = controller.tick()["default"]
    (record,) = logged(caplog, MessageId.SCALE_DECISION)
    assert record.getMessage() == controller.views["default"].line  # the text is the decision line
    fields = record.journal
    assert (fields["POOL"], fields["FROM"], fields["TO"]) == ("default", "1", str(decision.desired))
    assert fields["REASON"] == decision.reason and fields["SIGNAL"] == decision.winner


def test_a_count_held_by_max_workers_logs_the_binding_cap_once_and_its_end(backend, caplog):
    caplog.set_level(logging.INFO)
    controller, fleet = make(backend, "pools:\n  default:\n    max_workers: 2\n    concurrency: 1\n")
    fleet.add("default", 1, started_at=NOW - 100)
    ids = backend.enqueue([NewJob(task="t")] * 200, now=NOW - 60)
    first = controller.tick()["default"]
    assert first.desired == 2 and first.binding_cap is not None
    (decision,) = logged(caplog, MessageId.SCALE_DECISION)
    assert (decision.journal["CAP"], decision.journal["CAP_WORKERS"]) == ("max", "2")
    fleet.add("default", 2, started_at=NOW)
    controller.tick()  # still capped: nothing new to say
    (capped,) = logged(caplog, MessageId.BINDING_CAP_CHANGED)
    assert capped.getMessage().startswith("Pool default: bounded by cap max=2 (wanted ")
    assert capped.journal["CAP"] == "max" and capped.journal["PREVIOUS_CAP"] == "none"
    for job_id in ids:  # the backlog is gone: nothing asks for more than max_workers
        backend.cancel(job_id, now=NOW)
    controller.tick()
    ended = logged(caplog, MessageId.BINDING_CAP_CHANGED)[1:]
    assert [r.journal["CAP"] for r in ended] == ["none"]
    assert ended[0].getMessage() == "Pool default: no cap bounds its count any more (was max=2)."


def test_a_dead_workers_release_names_its_pool_unit_pid_and_jobs(backend, caplog):
    controller, fleet = make(backend, "pools:\n  default:\n    max_workers: 8\n", alive=lambda pid: False)
    backend.enqueue([NewJob(task="t")] * 3, now=NOW)
    backend.claim(ClaimRequest(f"{HOST}:default-2:4242", ("default",), 2, lease_seconds=300), now=NOW)
    controller.release_dead_workers()
    (record,) = logged(caplog, MessageId.DEAD_WORKER_JOBS_RELEASED)
    assert record.journal == {"MESSAGE_ID": MessageId.DEAD_WORKER_JOBS_RELEASED, "POOL": "default",
                              "WORKER": "default-2", "UNIT": "flexiq-worker@default-2.service",
                              "WORKER_PID": "4242", "JOBS": "2"}


def test_an_operators_pin_and_unpin_are_logged_with_their_action(backend, caplog):
    caplog.set_level(logging.INFO)
    controller, _ = make(backend, "pools:\n  default:\n    max_workers: 8\n")
    controller.pin("default", 3, 60)
    controller.unpin("default")
    records = logged(caplog, MessageId.OPERATOR_OVERRIDE)
    assert [(r.journal["ACTION"], r.journal.get("TO"), r.journal.get("DURATION_SEC")) for r in records] == [
        ("pin", "3", "60"), ("unpin", None, None)]
