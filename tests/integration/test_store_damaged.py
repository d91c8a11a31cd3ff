"""A damaged SQLite store under real processes: flexiqd refuses to start on it (exit 65, the reason
and the way to restore in its log, no worker started), and a worker runs nothing from it."""

from __future__ import annotations

import json
import os
import signal
import sqlite3

import psutil
import pytest

import store_damage
from flexiqd.daemon.service import EXIT_STORE_DAMAGED
from flexiqd.worker.runtime import EXIT_DAMAGED

from .conftest import read_marks, wait_for
from .test_daemon_process_fleet import start_daemon, worker_pids

DAMAGES = {
    "a page of the jobs table": lambda path: store_damage.overwrite_page(path, store_damage.leaf_page(path, "jobs")),
    "a page of the claim index": lambda path: store_damage.overwrite_page(
        path, store_damage.leaf_page(path, "jobs_claim")),
    "the header page": lambda path: store_damage.overwrite_page(path, 1),
    "the file cut short": store_damage.truncate,
}


def fill(app, count: int = 3000) -> list[int]:
    """Jobs that would run for a while if anything claimed them; the store closed after."""
    ids = app.tasks["count"].map([(0.5,)] * count)
    app.close()
    return ids


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_flexiqd_refuses_a_damaged_store_with_the_reason_and_starts_no_worker(tmp_path, store, app, workers,
                                                                               damage):
    fill(app)
    path = store[len("sqlite:///"):]
    DAMAGES[damage](path)
    daemon, _, log = start_daemon(tmp_path, store, workers.marks)
    try:
        code = daemon.wait(timeout=60)
    finally:
        if daemon.poll() is None:
            daemon.kill()
    text = log.read_text()
    assert code == EXIT_STORE_DAMAGED == 65, text
    assert f"Cannot start: the queue database {path} is damaged: " in text
    assert "restore the file from a backup" in text and "Traceback" not in text
    assert read_marks(workers.marks) == ({}, {}), "a job ran from the damaged store"


def test_flexiqd_refuses_a_store_whose_log_was_lost_with_committed_jobs(tmp_path, store, app, workers):
    fill(app, 100)
    path = store[len("sqlite:///"):]
    store_damage.commit_then_die(path, 200)
    store_damage.lose_wal(path)
    daemon, _, log = start_daemon(tmp_path, store, workers.marks)
    try:
        code = daemon.wait(timeout=60)
    finally:
        if daemon.poll() is None:
            daemon.kill()
    text = log.read_text()
    assert code == 65, text
    assert "its write-ahead log is gone while" in text and "committed" in text


def test_a_worker_refuses_a_damaged_store_and_one_whose_claim_meets_damage_stops(tmp_path, store, app, workers):
    fill(app)
    path = store[len("sqlite:///"):]
    store_damage.overwrite_page(path, store_damage.leaf_page(path, "jobs_claim", first=True))
    claimer = workers.start()
    assert claimer.wait(timeout=60) == EXIT_DAMAGED == 65, workers.log_text(0)
    assert "stops: claim" in workers.log_text(0) and f"the queue database {path}" in workers.log_text(0)
    store_damage.overwrite_page(path, 1)
    opener = workers.start()
    assert opener.wait(timeout=60) == 65, workers.log_text(1)
    assert f"cannot start: the queue database {path} is damaged: " in workers.log_text(1)
    assert read_marks(workers.marks) == ({}, {}), "a job ran from the damaged store"


def test_a_running_flexiqd_that_meets_damage_stops_with_65_and_stops_its_workers(tmp_path, store, app, workers):
    app.close()
    path = store[len("sqlite:///"):]
    daemon, _, log = start_daemon(tmp_path, store, workers.marks)
    try:
        [worker] = wait_for(lambda: worker_pids(daemon.pid), 30, "the minimum worker")
        # The counts page every tick reads, damaged in the file; then a commit by another
        # process, after which every connection reads its pages from the file again.
        store_damage.checkpoint(path)
        store_damage.overwrite_page(path, store_damage.root_page(path, "counts"))
        conn = sqlite3.connect(path, timeout=30)
        conn.execute("INSERT INTO dependency_tat (dependency, tat) VALUES ('poke', 0)")
        conn.commit()
        conn.close()
        code = daemon.wait(timeout=60)
    finally:
        if daemon.poll() is None:
            daemon.kill()
    text = log.read_text()
    assert code == EXIT_STORE_DAMAGED, text
    assert "Stopping: " in text and f"the queue database {path} met damage" in text
    assert not psutil.pid_exists(worker), "the daemon left its worker running on the damaged store"


def test_a_store_older_than_flexiqd_last_saw_it_is_said_at_start(tmp_path, store, app, workers):
    """A log lost together with its -shm: no check of the files can tell, the daemon's own
    record of its last heartbeat in the store can (docs/guarantees.md)."""
    app.close()
    path = store[len("sqlite:///"):]
    daemon, _, log = start_daemon(tmp_path, store, workers.marks)
    try:
        wait_for(lambda: worker_pids(daemon.pid), 30, "the minimum worker")
        store_damage.checkpoint(path)  # what the file holds from here on
        mark = tmp_path / "store-mark.json"
        first = wait_for(lambda: mark.exists() and json.loads(mark.read_text())["beat"], 10, "a beat recorded")
        wait_for(lambda: json.loads(mark.read_text())["beat"] > first, 10, "a beat after the checkpoint")
        for pid in [daemon.pid, *worker_pids(daemon.pid)]:
            os.kill(pid, signal.SIGKILL)  # nothing copies the log into the file
        daemon.wait(timeout=10)
    finally:
        if daemon.poll() is None:
            daemon.kill()
    os.unlink(path + "-wal")
    os.unlink(path + "-shm")
    again, _, log = start_daemon(tmp_path, store, workers.marks)
    try:
        wait_for(lambda: "flexiqd ready" in log.read_text(), 30, "the daemon to start")
        text = log.read_text()
        assert "the queue database is older than flexiqd last saw it: its heartbeat of " in text, text
        assert "is missing (its last at " in text and "flexiqd starts on it as it is" in text
    finally:
        again.send_signal(signal.SIGTERM)
        again.wait(timeout=60)
    # The next start finds the record and the store agreeing.
    third, _, log = start_daemon(tmp_path, store, workers.marks)
    try:
        wait_for(lambda: "flexiqd ready" in log.read_text(), 30, "the daemon to start")
        assert "older than flexiqd last saw it" not in log.read_text()
    finally:
        third.send_signal(signal.SIGTERM)
        third.wait(timeout=60)
