"""A starting worker whose store cannot be reached now waits for it (issue 24: a database
restart must not loop the worker through systemd's restarts into its start limit)."""

from __future__ import annotations

import signal

import pytest

from flexiqd.errors import StoreUnavailable, StoreUnreachable
from flexiqd.worker import main
from flexiqd.worker.runtime import STORE_RETRY_MAX
from flexiqd.worker.signals import WorkerSignals


class Notes:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def status(self, text: str) -> None:
        self.sent.append(f"STATUS={text}")

    def extend_timeout(self, seconds: float) -> None:
        self.sent.append(f"EXTEND={seconds:g}")

    def watchdog(self) -> None:
        self.sent.append("WATCHDOG")


def opener(monkeypatch, answers):
    """open_backend answering ``answers`` in turn (an exception is raised)."""
    calls = []

    def fake(url):
        calls.append(url)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(main, "open_backend", fake)
    return calls


def test_an_unreachable_store_is_waited_for_with_the_start_timeout_extended(monkeypatch):
    down = StoreUnreachable("cannot connect to the queue database postgresql://h/db: Connection refused")
    calls = opener(monkeypatch, [down] * 6 + ["backend"])
    notes, slept = Notes(), []
    assert main.open_when_reachable("postgresql://h/db", "default-1", WorkerSignals(), notes,
                                    sleep=slept.append) == "backend"
    assert len(calls) == 7
    assert slept == [0.25, 0.5, STORE_RETRY_MAX, STORE_RETRY_MAX, STORE_RETRY_MAX, STORE_RETRY_MAX]
    assert notes.sent[0].startswith("STATUS=waiting 0s for the store: cannot connect")
    assert notes.sent[1] == f"EXTEND={0.25 + main.STORE_WAIT_MARGIN:g}" and notes.sent[2] == "WATCHDOG"


def test_a_stop_while_waiting_ends_the_wait_and_a_broken_store_is_not_waited_for(monkeypatch):
    signals = WorkerSignals()
    signals.received.append(signal.SIGTERM)
    opener(monkeypatch, [StoreUnreachable("down")])
    assert main.open_when_reachable("u", "default-1", signals, Notes(), sleep=lambda _: None) is None
    opener(monkeypatch, [StoreUnavailable("the queue database has schema version 9, newer than ...")])
    with pytest.raises(StoreUnavailable, match="newer than"):
        main.open_when_reachable("u", "default-1", WorkerSignals(), Notes(), sleep=lambda _: None)
