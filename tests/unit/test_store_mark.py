"""flexiqd's record of the last heartbeat it committed to a SQLite store, and the judgement at
its next start: a store older than that lost transactions (or was restored from a backup)."""

from __future__ import annotations

from flexiqd.daemon.store_mark import StoreMark, judge, marked_store, read_mark, write_mark

URL = "sqlite:////var/lib/flexiq/queue.db"
T = 1_764_900_000.0


def test_only_a_durable_sqlite_store_is_marked():
    assert marked_store(URL)
    assert marked_store(URL + "?synchronous=extra&busy_timeout=2")
    assert not marked_store(URL + "?synchronous=normal")  # a power cut may lose commits by design
    assert not marked_store("postgresql://flexiq@db/flexiq")


def test_a_store_older_than_the_record_is_said_and_nothing_else_is():
    mark = StoreMark(store=URL, host="vm", beat=T)
    assert judge(mark, URL, "vm", T) is None
    assert judge(mark, URL, "vm", T + 2) is None
    older = judge(mark, URL, "vm", T - 6)
    assert older.startswith("the queue database is older than flexiqd last saw it: its heartbeat of ")
    assert "is missing (its last at " in older and "restored backup" in older
    assert "no heartbeat of this host" in judge(mark, URL, "vm", None)
    assert judge(None, URL, "vm", None) is None                 # no record yet
    assert judge(mark, "sqlite:////srv/other.db", "vm", None) is None  # another store
    assert judge(mark, URL, "other-host", None) is None         # another host's record


def test_the_record_is_written_whole_and_a_broken_one_is_no_evidence(tmp_path):
    path = str(tmp_path / "store-mark.json")
    assert read_mark(path) is None
    write_mark(path, StoreMark(store=URL, host="vm", beat=T))
    assert read_mark(path) == StoreMark(store=URL, host="vm", beat=T)
    assert [p.name for p in tmp_path.iterdir()] == ["store-mark.json"]
    (tmp_path / "store-mark.json").write_text("{\"store\": ")
    assert read_mark(path) is None
