"""A SQLite store wakes its waiters when jobs become due, from a watch on its files (no polling)."""

from __future__ import annotations

import struct
import threading
import time

from flexiqd.queue import ClaimRequest, NewJob
from flexiqd.queue.sqlite.file_watch import _written_names
from flexiqd.queue.sqlite.database import SQLiteBackend

WAIT = 10.0  # far longer than a commit takes to land; the wake-ups come in milliseconds


class Wakes:
    def __init__(self) -> None:
        self.count = 0
        self._changed = threading.Condition()

    def __call__(self) -> None:
        with self._changed:
            self.count += 1
            self._changed.notify_all()

    def wait_beyond(self, count: int, timeout: float = WAIT) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.count > count, timeout)


def test_a_commit_of_due_jobs_by_another_process_wakes_the_subscriber(tmp_path):
    path = str(tmp_path / "queue.db")
    waiting, other = SQLiteBackend(path), SQLiteBackend(path)
    wakes = Wakes()
    stop = waiting.subscribe(["default"], wakes)
    try:
        for n in range(3):
            seen = wakes.count
            other.enqueue([NewJob(task="t", payload=n)], now=time.time())
            assert wakes.wait_beyond(seen), f"enqueue {n} woke nobody"
    finally:
        stop()
        waiting.close()
        other.close()


def test_jobs_on_other_queues_delayed_jobs_and_claims_do_not_wake(tmp_path):
    path = str(tmp_path / "queue.db")
    waiting, other = SQLiteBackend(path), SQLiteBackend(path)
    other.enqueue([NewJob(task="t")], now=time.time())
    wakes = Wakes()
    stop = waiting.subscribe(["default"], wakes)
    try:
        assert wakes.wait_beyond(0), "the first look did not find the job enqueued before it"
        now = time.time()
        other.enqueue([NewJob(task="t", queue="elsewhere")], now=now)
        other.enqueue([NewJob(task="t", delay=3600)], now=now)
        assert other.claim(ClaimRequest(owner="w", queues=("default",), limit=10), now=now)
        # Nothing became due on "default": a commit that does grow it must be the next wake.
        assert not wakes.wait_beyond(1, timeout=1.0)
        other.enqueue([NewJob(task="t")], now=now)
        assert wakes.wait_beyond(1)
        assert wakes.count == 2
    finally:
        stop()
        waiting.close()
        other.close()


def test_stopping_ends_the_watch_thread_and_is_idempotent(tmp_path):
    backend = SQLiteBackend(str(tmp_path / "queue.db"))
    before = {t.name for t in threading.enumerate()}
    stop = backend.subscribe(["default"], lambda: None)
    assert "flexiq-watch" in {t.name for t in threading.enumerate()} - before
    stop()
    stop()
    assert "flexiq-watch" not in {t.name for t in threading.enumerate()}
    backend.close()


def test_inotify_events_are_read_with_their_names_and_an_overflow_counts_as_a_write():
    def event(mask, name=b""):
        padded = name + b"\0" * (-len(name) % 16) if name else b""
        return struct.pack("iIII", 1, mask, 0, len(padded)) + padded

    names, overflow = _written_names(event(0x2, b"queue.db-wal") + event(0x100, b"queue.db-shm"))
    assert (names, overflow) == ({"queue.db-wal", "queue.db-shm"}, False)
    assert _written_names(event(0x4000)) == (set(), True)
