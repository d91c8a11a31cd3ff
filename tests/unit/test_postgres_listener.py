"""The PostgreSQL listener while its server is away: it retries every couple of seconds but
logs the outage once, again when the reason changes, and then every half minute."""

from __future__ import annotations

import logging
import time

from flexiqd.errors import StoreUnreachable
from flexiqd.queue.postgres import listen as postgres_listen


def test_an_outage_is_logged_once_and_again_only_when_its_reason_changes(monkeypatch, caplog):
    monkeypatch.setattr(postgres_listen, "_LISTEN_RETRY", 0.01)
    reasons = ["connection refused"] * 30 + ["the database system is starting up"] * 30
    attempts = []

    def connect():
        attempts.append(1)
        reason = reasons[min(len(attempts), len(reasons)) - 1]
        raise StoreUnreachable(f"cannot connect to the queue database: {reason}")

    listener = postgres_listen.Listener(connect, ["flexiq.default"], lambda: None)
    with caplog.at_level(logging.WARNING, logger=postgres_listen.__name__):
        listener.start()
        deadline = time.monotonic() + 10
        while len(attempts) < len(reasons) and time.monotonic() < deadline:
            time.sleep(0.01)
        listener.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(attempts) >= len(reasons)
    assert len(warnings) == 2, warnings
    assert "connection refused" in warnings[0] and "starting up" in warnings[1]
