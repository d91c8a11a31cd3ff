"""A damaged SQLite store: ``flexiq check`` says what is damaged and where, every opener refuses
what it can see without reading the whole file, and a lost write-ahead log is told apart from a
whole store as long as its ``-shm`` index is left."""

from __future__ import annotations

import json
import os
import struct

import pytest

import store_damage
from flexiqd.cli import flexiq
from flexiqd.errors import StoreDamaged, StoreUnavailable
from flexiqd.queue import NewJob, open_backend
from flexiqd.queue.sqlite.check import Depth, check_files, check_store, header_problem, wal_loss
from flexiqd.queue.store_check import refuse_if_damaged

T0 = 1_700_000_000.0


@pytest.fixture
def store_path(tmp_path) -> str:
    """A store of 3,000 queued jobs and 1,000 done ones, closed (its log copied into the file)."""
    path = str(tmp_path / "queue.db")
    store = open_backend(f"sqlite:///{path}")
    ids = store.enqueue([NewJob(task="t", payload={"n": n}, queue=f"q{n % 3}") for n in range(4000)], now=T0)
    conn = store.database.connection
    conn.execute(f"UPDATE jobs SET state = 'done', finished_at = {T0 + 1} WHERE id <= {ids[999]}")
    store.close()
    return path


def check(path: str, *args: str, capsys) -> tuple[int, str, str]:
    code = flexiq.main(["--url", f"sqlite:///{path}", "check", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_whole_store_is_reported_whole_with_exit_0_at_both_depths(store_path, capsys):
    code, out, _ = check(store_path, capsys=capsys)
    assert code == flexiq.EXIT_OK == 0
    assert out.strip() == (f"the queue database {store_path} is whole (header, write-ahead log, schema, "
                           f"integrity_check, foreign_key_check, counts: ok)")
    code, out, _ = check(store_path, "--quick", "--json", capsys=capsys)
    assert code == 0
    assert json.loads(out) == {"store": store_path, "healthy": True, "findings": [],
                               "checked": ["header", "write-ahead log", "schema", "quick_check"]}


DAMAGES = {
    # kind of damage -> (how it is made, the finding's kind at the full depth)
    "a leaf page of the jobs table": (lambda p: store_damage.overwrite_page(p, store_damage.leaf_page(p, "jobs")),
                                      "pages"),
    "a leaf page of the claim index": (lambda p: store_damage.overwrite_page(
        p, store_damage.leaf_page(p, "jobs_claim")), "pages"),
    "the header page": (lambda p: store_damage.overwrite_page(p, 1), "header"),
    "the file cut short": (store_damage.truncate, "truncated"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_each_damage_is_reported_with_the_file_and_exit_3(store_path, capsys, damage):
    make, kind = DAMAGES[damage]
    make(store_path)
    code, out, err = check(store_path, capsys=capsys)
    assert code == flexiq.EXIT_DAMAGED == 3, out + err
    lines = out.splitlines()
    assert lines[0] == f"the queue database {store_path} is damaged:"
    assert lines[1].startswith(f"  {kind}: ")
    assert "restore the file from a backup" in lines[-1] and ".backup" in lines[-1]
    assert "Traceback" not in out + err
    # The daemon's cheaper check at start finds it too.
    code, out, _ = check(store_path, "--quick", "--json", capsys=capsys)
    assert code == 3 and not json.loads(out)["healthy"]
    with pytest.raises(StoreDamaged, match=str(store_path)):
        refuse_if_damaged(f"sqlite:///{store_path}", Depth.QUICK)


@pytest.mark.parametrize("damage", ["the header page", "the file cut short"])
def test_a_store_damaged_where_every_opener_looks_is_refused_at_open(store_path, damage):
    DAMAGES[damage][0](store_path)
    with pytest.raises(StoreDamaged) as caught:
        open_backend(f"sqlite:///{store_path}")
    assert str(caught.value).startswith(f"the queue database {store_path} is damaged: ")
    assert "\n" not in str(caught.value)


def test_an_operation_that_meets_a_damaged_page_fails_as_damage_not_as_an_outage(store_path):
    store_damage.overwrite_page(store_path, store_damage.leaf_page(store_path, "jobs"))
    store = open_backend(f"sqlite:///{store_path}")  # a page no opener reads
    try:
        with pytest.raises(StoreDamaged, match="corrupt or not a SQLite database"):
            for queue in ("q0", "q1", "q2"):
                store.list_jobs(queue=queue, limit=5000)
    finally:
        store.close()


def test_a_lost_log_with_committed_transactions_is_found_and_its_evidence_kept(store_path, capsys):
    before = check_store(store_path, Depth.FULL)
    assert before.healthy
    lost = store_damage.commit_then_die(store_path, 300)
    assert os.path.getsize(store_path + "-wal") > 0 and os.path.exists(store_path + "-shm")
    store_damage.lose_wal(store_path)
    for _ in range(2):  # refused every time: no opener rebuilds the index and erases the sign
        with pytest.raises(StoreDamaged, match="write-ahead log is gone while [0-9]+ committed page writes"):
            open_backend(f"sqlite:///{store_path}")
        code, out, _ = check(store_path, capsys=capsys)
        assert code == 3 and "  wal-lost: " in out, out
    # The operator who accepts the loss removes the index; the store is whole, without those jobs.
    os.unlink(store_path + "-shm")
    store = open_backend(f"sqlite:///{store_path}")
    try:
        assert store.list_jobs(limit=10)[0].id < lost[0]
    finally:
        store.close()


def test_a_log_lost_with_its_index_leaves_an_older_store_no_check_can_tell_from_a_whole_one(store_path):
    """The limit of what can be detected, stated in docs/guarantees.md."""
    store_damage.commit_then_die(store_path, 300)
    os.unlink(store_path + "-wal")
    os.unlink(store_path + "-shm")
    assert check_store(store_path, Depth.FULL).healthy


def test_a_running_store_with_its_log_is_whole(store_path):
    """A log in use (a worker has it open) is no loss: the frames it counts are there."""
    store = open_backend(f"sqlite:///{store_path}")
    try:
        store.database.connection.execute("PRAGMA wal_autocheckpoint = 0")
        store.enqueue([NewJob(task="t", payload=1)] * 50, now=T0)
        assert check_files(store_path) == []
        report = check_store(store_path, Depth.FULL)
        assert report.healthy, report.summary()
    finally:
        store.close()


def test_header_and_log_rules():
    good = store_damage_header(4096)
    assert header_problem(good, 4096 * 10) is None
    assert header_problem(b"", 0) is None  # a file about to be created
    assert header_problem(b"\xde" * 100, 4096).kind == "header"
    assert header_problem(good, 4096 * 10 + 7).kind == "truncated"
    shm = shm_header(committed=10, copied=4, salts=b"ABCDEFGH")
    wal_head = struct.pack(">II", 0x377F0682, 3007000) + b"\0" * 8 + b"ABCDEFGH" + b"\0" * 8
    full = 32 + 10 * (24 + 4096)
    assert wal_loss(shm, wal_head, full) is None
    assert wal_loss(shm, None, 0).kind == "wal-lost"
    assert wal_loss(shm, wal_head, full - 1).kind == "wal-lost"
    # Without a sync at each commit, a power loss may leave the index ahead of the log: the trade.
    assert wal_loss(shm, wal_head, full - 1, durable=False) is None
    # An index of another generation of the log (stale after a crash or a read-only file
    # system: SQLite never syncs it) says nothing about the log on disk.
    assert wal_loss(shm, wal_head[:16] + b"XXXXXXXX" + wal_head[24:], full) is None
    assert wal_loss(shm_header(committed=10, copied=10, salts=b"ABCDEFGH"), None, 0) is None  # all copied
    torn = shm[:64] + b"\x0b" + shm[65:]  # the second copy of mxFrame differs
    assert wal_loss(torn, None, 0) is None  # being written: says nothing


def store_damage_header(page_size: int) -> bytes:
    return b"SQLite format 3\x00" + struct.pack(">H", page_size) + b"\0" * 82


def shm_header(*, committed: int, copied: int, salts: bytes) -> bytes:
    header = (struct.pack("=IIIBBHII", 3007000, 0, 1, 1, 0, 4096, committed, 2) + b"\0" * 8 + salts
              + b"\0" * 8)
    assert len(header) == 48
    return header + header + struct.pack("=I", copied)


def test_nothing_to_check_is_an_error_not_a_verdict(tmp_path, capsys):
    code, out, err = check(str(tmp_path / "none.db"), capsys=capsys)
    assert code == flexiq.EXIT_ERROR == 1 and out == ""
    assert err.strip() == f"flexiq: there is no queue database at {tmp_path / 'none.db'} (nothing to check)"
    assert not os.path.exists(tmp_path / "none.db")  # checking created nothing
    with pytest.raises(StoreUnavailable):
        from flexiqd.queue.store_check import check_url_store
        check_url_store(f"sqlite:///{tmp_path / 'none.db'}", Depth.FULL)


def test_postgres_is_checked_by_its_schema_version_and_every_table_read(pg_url, capsys):
    store = open_backend(pg_url)
    store.enqueue([NewJob(task="t", payload=1)] * 10, now=T0)
    store.close()
    code = flexiq.main(["--url", pg_url, "check"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "is whole (schema version " in out and "tables read: ok)" in out
    store = open_backend(pg_url)
    store.database.write("drop a table", lambda tx: tx.conn.execute("DROP TABLE flexiq_executions"))
    store.close()
    code = flexiq.main(["--url", pg_url, "check"])
    out = capsys.readouterr().out
    assert code == 3 and "  schema: its table flexiq_executions is missing" in out, out


def test_the_files_are_not_read_while_this_process_holds_the_store_open(store_path):
    """Closing a descriptor of the file would drop this process's POSIX locks on it, SQLite's
    included: an application's own connection to the store keeps its locks."""
    import fcntl
    import sqlite3

    from flexiqd.queue.sqlite.check import held_here

    assert not held_here(store_path)
    conn = sqlite3.connect(store_path)  # the application's connection, open before the queue's
    conn.execute("SELECT COUNT(*) FROM jobs").fetchone()
    try:
        assert held_here(store_path)
        with open(store_path, "rb") as handle:  # a lock this process holds, as SQLite's are held
            fcntl.lockf(handle, fcntl.LOCK_SH, 1, 1000)
            store = open_backend(f"sqlite:///{store_path}")
            store.close()
            assert _locked_elsewhere(store_path), "opening the store dropped this process's locks"
    finally:
        conn.close()


def _locked_elsewhere(path: str) -> bool:
    import subprocess
    import sys

    code = ("import fcntl, sys\nf = open(sys.argv[1], 'r+b')\n"
            "try:\n    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 1000)\nexcept OSError:\n    sys.exit(3)\n")
    return subprocess.run([sys.executable, "-c", code, path]).returncode == 3


def test_counts_that_disagree_with_the_jobs_are_reported(store_path, capsys):
    """What no page check sees: the trigger-kept counts (what the policy scales on) against the jobs."""
    import sqlite3

    conn = sqlite3.connect(store_path)
    conn.execute("UPDATE counts SET n = n + 2 WHERE queue = 'q1' AND state = 'queued'")
    conn.commit()
    conn.close()
    code, out, _ = check(store_path, capsys=capsys)
    assert code == 3, out
    assert "  counts: the job counts disagree with the jobs: queue 'q1' state 'queued': " in out
    assert check(store_path, "--quick", capsys=capsys)[0] == 0  # the daemon's check at start reads pages only


def test_a_locked_store_is_out_of_reach_to_wait_for_not_damaged(store_path):
    """The daemon waits for a locked store (StoreUnreachable) and refuses only a damaged one."""
    import sqlite3

    from flexiqd.errors import StoreUnreachable
    from flexiqd.queue.store_check import check_url_store

    holder = sqlite3.connect(store_path, isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("UPDATE jobs SET priority = 1 WHERE id = 1")
    try:
        for depth in (Depth.QUICK, Depth.FULL):
            with pytest.raises(StoreUnreachable, match="locked"):
                check_url_store(f"sqlite:///{store_path}?busy_timeout=0.2", depth)
        with pytest.raises(StoreUnreachable):
            refuse_if_damaged(f"sqlite:///{store_path}?busy_timeout=0.2", Depth.QUICK)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    refuse_if_damaged(f"sqlite:///{store_path}", Depth.QUICK)  # whole once released
