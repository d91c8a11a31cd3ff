"""A SQLite store whose disk fills up or turns read-only (issue 24, fault 2): the error names
the disk and the store, nothing is half-committed, and the store works again once it can."""

from __future__ import annotations

import os
import sqlite3
from types import SimpleNamespace

import pytest

from flexiqd.errors import QueueError, StoreUnreachable
from flexiqd.queue import NewJob, open_backend
from flexiqd.queue.sqlite import disk

T0 = 1_700_000_000.0


def fake_statvfs(monkeypatch, *, free: int, read_only: bool = False) -> None:
    monkeypatch.setattr(disk.os, "statvfs", lambda _: SimpleNamespace(
        f_flag=os.ST_RDONLY if read_only else 0, f_bavail=free // 4096, f_frsize=4096))


def test_a_full_or_read_only_disk_is_named_with_its_mount_point_and_the_store(tmp_path, monkeypatch):
    path = str(tmp_path / "queue.db")
    assert disk.disk_problem(path) is None
    mount = disk.mount_point(path)
    fake_statvfs(monkeypatch, free=12 * 1024)
    assert disk.disk_problem(path) == f"the disk {mount} holding the queue database {path} is full (12 KiB free)"
    fake_statvfs(monkeypatch, free=1 << 30, read_only=True)
    assert disk.disk_problem(path) == f"the file system {mount} holding the queue database {path} is mounted read-only"


def test_a_full_disks_last_kilobytes_coming_and_going_are_the_same_problem(tmp_path, monkeypatch):
    # The daemon journals a problem when it changes: not at every tick of a full disk whose
    # last kilobytes other writers take and give back.
    path = str(tmp_path / "queue.db")
    fake_statvfs(monkeypatch, free=12 * 1024)
    full = disk.disk_problem(path)
    fake_statvfs(monkeypatch, free=8 * 1024)
    fuller = disk.disk_problem(path)
    assert full != fuller and disk.same_problem(full, fuller)
    fake_statvfs(monkeypatch, free=1 << 30, read_only=True)
    assert not disk.same_problem(full, disk.disk_problem(path))
    assert not disk.same_problem(full, None) and disk.same_problem(None, None)


def test_a_store_that_fills_its_disk_commits_nothing_half_done_and_works_once_there_is_room(tmp_path, monkeypatch):
    path = str(tmp_path / "queue.db")
    store = open_backend(f"sqlite:///{path}")
    store.enqueue([NewJob(task="t", payload=1)], now=T0)
    # SQLite's own size limit stands in for the disk: the same SQLITE_FULL, the same code paths.
    conn = store.database.connection
    conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0] + 2}")
    fake_statvfs(monkeypatch, free=0)
    with pytest.raises(StoreUnreachable) as caught:
        store.enqueue([NewJob(task="t", payload="x" * 4000)] * 200, now=T0)
    assert str(caught.value).startswith("enqueue was not done: the disk ") and path in str(caught.value)
    assert "is full" in str(caught.value) and "\n" not in str(caught.value)
    assert not conn.in_transaction  # a failed COMMIT or an automatic rollback leaves no transaction open
    assert [job.payload for job in store.list_jobs()] == [1]  # none of the 200
    monkeypatch.undo()
    conn.execute("PRAGMA max_page_count = 1073741823")
    store.enqueue([NewJob(task="t", payload=2)], now=T0)
    assert sorted(job.payload for job in store.list_jobs()) == [1, 2]
    store.close()


def test_a_full_store_on_a_disk_with_room_is_reported_as_the_store_s_error(tmp_path):
    path = str(tmp_path / "queue.db")
    store = open_backend(f"sqlite:///{path}")
    conn = store.database.connection
    conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0] + 1}")
    with pytest.raises(QueueError, match="database or disk is full") as caught:
        store.enqueue([NewJob(task="t", payload="x" * 4000)] * 200, now=T0)
    assert not isinstance(caught.value, StoreUnreachable)
    assert not conn.in_transaction
    store.close()


def test_sqlite_rolls_back_on_its_own_when_the_disk_is_full():
    """Why the store ends a failed transaction only if one is still open (``_roll_back``)."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("CREATE TABLE t (x)")
    conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0] + 1}")
    conn.execute("BEGIN IMMEDIATE")
    with pytest.raises(sqlite3.OperationalError, match="full"):
        conn.executemany("INSERT INTO t VALUES (?)", [("x" * 4000,)] * 100)
    assert not conn.in_transaction  # rolled back already: a ROLLBACK now would fail and hide the error
    with pytest.raises(sqlite3.OperationalError, match="no transaction is active"):
        conn.execute("ROLLBACK")


def test_a_file_system_that_refuses_writes_is_found_by_a_write_probe(tmp_path, monkeypatch):
    path = str(tmp_path / "queue.db")
    assert disk.disk_problem(path, write_probe=True) is None
    assert os.listdir(tmp_path) == []  # the probe leaves nothing behind

    def refused(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(disk.os, "open", refused)
    assert disk.disk_problem(path) is None  # statvfs alone cannot tell (ext4's emergency read-only)
    assert disk.disk_problem(path, write_probe=True) == (
        f"the file system {disk.mount_point(path)} holding the queue database {path} takes no writes "
        "(Read-only file system)")
