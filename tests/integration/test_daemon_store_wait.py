"""flexiqd started while its PostgreSQL server is down: it waits for the server (saying so)
instead of failing its start, which systemd would repeat into its start limit; it starts once
the server is up, and a stop while it waits ends it cleanly."""

from __future__ import annotations

import signal
import time

from pg_server import PostgresServer

from .conftest import wait_for
from .test_daemon_process_fleet import start_daemon, worker_pids


def test_the_daemon_waits_for_a_store_that_is_down_and_starts_once_it_is_up(tmp_path, workers):
    server = PostgresServer()          # its port chosen, the server not started yet
    # The database initdb makes: the test's own is created only after the server is up, and a
    # database that does not exist is no outage (the daemon rightly gives up on it).
    daemon, _, log = start_daemon(tmp_path, server.url("postgres"), workers.marks)
    try:
        wait_for(lambda: "Waiting for the store before starting" in log.read_text(), 30, "the daemon to wait")
        time.sleep(3)                  # several retries: still there, nothing started
        assert daemon.poll() is None, log.read_text()
        assert worker_pids(daemon.pid) == []
        server.start()
        wait_for(lambda: "flexiqd ready" in log.read_text() or daemon.poll() is not None, 60,
                 "the daemon to start once the server is up")
        assert daemon.poll() is None, f"the daemon gave up:\n{log.read_text()}"
        wait_for(lambda: len(worker_pids(daemon.pid)) == 1, 30, "the minimum worker")
        assert "Reached the store after" in log.read_text()
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
        server.stop()


def test_a_stop_while_the_daemon_waits_for_the_store_ends_it_cleanly(tmp_path, workers):
    server = PostgresServer()
    daemon, _, log = start_daemon(tmp_path, server.url("postgres"), workers.marks)
    try:
        wait_for(lambda: "Waiting for the store before starting" in log.read_text(), 30, "the daemon to wait")
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=10) == 0
        assert "Stopped while waiting for the store" in log.read_text()
    finally:
        if daemon.poll() is None:
            daemon.kill()
        server.stop()
