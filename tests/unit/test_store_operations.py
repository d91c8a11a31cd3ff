"""The decisions behind ``flexiq move-store`` and ``forget-host``, and the moved file's mark."""

from __future__ import annotations

import sqlite3

import pytest

from flexiqd.errors import StoreUnavailable
from flexiqd.queue import NewJob, open_backend
from flexiqd.queue.host_admin import forget_refusal, running_by_host
from flexiqd.queue.hosts import host_info
from flexiqd.queue.move import quiet_refusal
from flexiqd.queue.moved import mark_moved, marked_target, moved_to

NOW = 1_000_000.0


def _host(name: str, last_beat: float, interval: float = 2.0):
    return host_info(name, last_beat, interval, "{}", last_beat - 100, now=NOW)


@pytest.mark.parametrize("hosts, running, expected", [
    ([], {}, None),
    ([_host("old", NOW - 60)], {}, None),  # stopped long ago: dead
    ([_host("web1", NOW - 1)], {}, "daemon on host web1 is running"),
    ([_host("web1", NOW - 5, interval=2.0)], {}, None),  # two beats missed: gone
    ([], {"web1:default-1:42": 2, "web1:default-2:43": 1}, "3 jobs are running (workers web1:default-1:42, "),
    ([], {"web1:default-1:42": 1}, "1 job is running"),
])
def test_a_move_needs_no_live_daemon_and_no_running_job(hosts, running, expected):
    refusal = quiet_refusal(hosts, running, NOW)
    if expected is None:
        assert refusal is None
    else:
        assert refusal is not None and expected in refusal


def test_the_live_daemon_is_named_before_the_running_jobs():
    refusal = quiet_refusal([_host("web1", NOW - 1)], {"web1:default-1:42": 1}, NOW)
    assert refusal is not None and "web1 is running (it beat 1s ago)" in refusal and "systemctl stop flexiqd" in refusal


def test_a_dead_host_may_be_forgotten_a_live_one_only_with_force():
    dead, alive = _host("web3", NOW - 3600), _host("web1", NOW - 1)
    assert forget_refusal("web3", dead, ["web1", "web3"], force=False, now=NOW) is None
    refusal = forget_refusal("web1", alive, ["web1", "web3"], force=False, now=NOW)
    assert refusal is not None and "alive" in refusal and "beat 1s ago" in refusal and "--force" in refusal
    assert forget_refusal("web1", alive, ["web1"], force=True, now=NOW) is None
    unknown = forget_refusal("web7", None, ["web1", "web3"], force=True, now=NOW)
    assert unknown is not None and "'web7'" in unknown and "web1, web3" in unknown


def test_running_jobs_are_counted_per_host_from_their_lease_owners():
    owners = {"web1:default-1:42": 2, "web1:mail-1:7": 1, "db:x:host:default-1:9": 4, "by-hand": 3}
    assert running_by_host(owners) == {"web1": 3, "db:x:host": 4}


def test_a_marked_file_refuses_every_write_and_every_open(tmp_path):
    path = tmp_path / "queue.db"
    backend = open_backend(f"sqlite:///{path}")  # opened before the mark, held open across it
    backend.enqueue([NewJob(task="t")], now=NOW)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    mark_moved(conn, str(path), "postgresql://flexiq:***@db/flexiq", NOW)
    conn.execute("COMMIT")
    assert marked_target(conn) == "postgresql://flexiq:***@db/flexiq"
    conn.close()
    assert moved_to(str(path)) == "postgresql://flexiq:***@db/flexiq"
    with pytest.raises(Exception, match="was moved to postgresql://flexiq:\\*\\*\\*@db/flexiq"):
        backend.enqueue([NewJob(task="late")], now=NOW)
    with pytest.raises(Exception, match="was moved to"):
        backend.heartbeat("web1", now=NOW, interval=2.0)
    assert backend.list_jobs() and len(backend.list_jobs()) == 1  # reading still works
    backend.close()
    with pytest.raises(StoreUnavailable, match="set store: postgresql://flexiq:\\*\\*\\*@db/flexiq"):
        open_backend(f"sqlite:///{path}")


def test_a_file_never_moved_has_no_mark(tmp_path):
    path = tmp_path / "queue.db"
    open_backend(f"sqlite:///{path}").close()
    assert moved_to(str(path)) is None
    assert moved_to(str(tmp_path / "missing.db")) is None
