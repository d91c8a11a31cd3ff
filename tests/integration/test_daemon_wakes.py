"""The daemon decides when work arrives, not at its next tick: new jobs committed to a pool's
queue wake it (SQLite: a watch on the store's files; PostgreSQL: LISTEN/NOTIFY), and so does a
delayed job coming due.  The tick here is a minute, so a decision within seconds was woken."""

from __future__ import annotations

import re
import signal
import time

import pytest

from .conftest import wait_for
from .test_daemon_process_fleet import start_daemon, worker_pids

SLOW_TICK = "tick: 60s\n"
# Well inside the minute: only a wake-up decides this soon.
SOON = 20


def scale_ups(log) -> list[str]:
    return re.findall(r"default 1 -> [2-6]: .*", log.read_text())


def _stop(daemon) -> None:
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(timeout=60) == 0


def _kill(daemon) -> None:
    """A daemon the test gave up on, and its workers with it (they would outlive it)."""
    import psutil

    if daemon.poll() is None:
        for child in psutil.Process(daemon.pid).children(recursive=True):
            child.kill()
        daemon.kill()
        daemon.wait()


def test_a_burst_wakes_the_daemon_long_before_its_tick(tmp_path, store, app, workers):
    daemon, _, log = start_daemon(tmp_path, store, workers.marks, extra=SLOW_TICK)
    try:
        wait_for(lambda: len(worker_pids(daemon.pid)) == 1, 30, "the minimum worker")
        wait_for(lambda: "flexiqd ready" in log.read_text(), 30, "the daemon to be ready")
        time.sleep(1.0)  # past the start-up's decisions: the next tick is a minute away
        app.tasks["count"].map([(0.5,)] * 60)
        wait_for(lambda: scale_ups(log), SOON, "a scale-up decided on the burst's arrival")
        wait_for(lambda: len(worker_pids(daemon.pid)) >= 2, SOON, "the new workers")
        _stop(daemon)
    finally:
        _kill(daemon)


def test_delayed_jobs_wake_the_daemon_when_they_come_due(tmp_path, store, app, workers):
    task = app.tasks["count"]
    app.enqueue_many([task.new_job((0.5,), delay=6) for _ in range(60)])  # seen at start, due in 6 s
    daemon, _, log = start_daemon(tmp_path, store, workers.marks, extra=SLOW_TICK)
    try:
        wait_for(lambda: len(worker_pids(daemon.pid)) == 1, 30, "the minimum worker")
        wait_for(lambda: scale_ups(log), SOON, "a scale-up when the delayed jobs came due")
        _stop(daemon)
    finally:
        _kill(daemon)


# -- jobs enqueued in the application's own transaction wake the daemon at its commit ----------

def _burst_in_transaction(url: str, connection, *, commit: bool) -> None:
    from flexiqd.queue import Queue

    producer = Queue(url)  # no task registered: by name, as a producer without the workers' code
    try:
        for _ in range(60):
            producer.enqueue("count", [0.5], connection=connection)
        connection.commit() if commit else connection.rollback()
    finally:
        producer.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_burst_committed_in_the_applications_transaction_wakes_the_daemon(tmp_path, request, kind):
    if kind == "postgres":
        import psycopg

        from flexiqd.queue.url import postgres_connect_options

        url = request.getfixturevalue("pg_server").fresh_url()
        connect = lambda: psycopg.connect(postgres_connect_options(url).conninfo)  # noqa: E731
    else:
        import sqlite3

        url = f"sqlite:///{tmp_path / 'queue.db'}"
        connect = lambda: sqlite3.connect(tmp_path / "queue.db")  # noqa: E731
    marks = tmp_path / "marks"
    marks.mkdir()
    daemon, _, log = start_daemon(tmp_path, url, marks, extra=SLOW_TICK)
    try:
        wait_for(lambda: len(worker_pids(daemon.pid)) == 1, 30, "the minimum worker")
        wait_for(lambda: "flexiqd ready" in log.read_text(), 30, "the daemon to be ready")
        time.sleep(1.0)  # past the start-up's decisions: the next tick is a minute away
        connection = connect()
        try:
            _burst_in_transaction(url, connection, commit=False)
            assert _jobs_in(url) == 0  # rolled back: nothing for the daemon to wake for
            _burst_in_transaction(url, connection, commit=True)
            assert _jobs_in(url) == 60
        finally:
            connection.close()
        wait_for(lambda: scale_ups(log), SOON, "a scale-up decided at the burst's commit")
        _stop(daemon)
    finally:
        _kill(daemon)


def _jobs_in(url: str) -> int:
    from flexiqd.queue import open_backend

    store = open_backend(url)
    try:
        return len(store.list_jobs(limit=1000))
    finally:
        store.close()
