"""The scale-event history: bounded, kept across restarts, tolerant of a damaged file."""

from __future__ import annotations

from flexiqd.daemon.events import EventLog


def test_events_survive_a_restart_and_keep_numbering(tmp_path):
    path = str(tmp_path / "events.jsonl")
    first = EventLog(path)
    first.record(1.0, "default", 1, 3, "ScaleUpAge", "default 1 -> 3: ...")
    first.record(2.0, "default", 3, 2, "ScaleDownStabilized", "default 3 -> 2: ...")
    again = EventLog(path)
    assert [(e.seq, e.previous, e.desired) for e in again.since(0)] == [(1, 1, 3), (2, 3, 2)]
    assert again.record(3.0, "default", 2, 1, "ScaleDownIdle", "...").seq == 3
    assert [e.seq for e in EventLog(path).since(1)] == [2, 3]


def test_the_history_is_bounded_in_memory_and_on_disk(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(str(path), limit=5)
    for n in range(23):
        log.record(float(n), "p", n, n + 1, "ScaleUpAge", "")
    assert len(log) == 5 and [e.seq for e in log.since(0)] == [19, 20, 21, 22, 23]
    assert len(path.read_text().splitlines()) <= 10
    assert [e.seq for e in EventLog(str(path), limit=5).since(0)] == [19, 20, 21, 22, 23]


def test_a_damaged_line_is_skipped_not_fatal(tmp_path, caplog):
    path = tmp_path / "events.jsonl"
    log = EventLog(str(path))
    log.record(1.0, "p", 0, 1, "RaisedToMinimum", "")
    with open(path, "a") as handle:
        handle.write("{not json\n")
    log2 = EventLog(str(path))
    assert [e.seq for e in log2.since(0)] == [1]
    assert "unreadable line 2" in caplog.text


def test_without_a_path_events_live_in_memory_only():
    log = EventLog(None)
    log.record(1.0, "p", 0, 1, "RaisedToMinimum", "")
    assert len(log) == 1 and log[-1].pool == "p"


def test_the_history_file_is_private_to_the_daemon(tmp_path):
    import os

    path = tmp_path / "events.jsonl"
    old = os.umask(0)
    try:
        EventLog(str(path)).record(1.0, "default", 1, 2, "ScaleUp", "default 1 -> 2")
    finally:
        os.umask(old)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    path.chmod(0o666)  # as an older version left it
    EventLog(str(path))
    assert oct(path.stat().st_mode & 0o777) == "0o600"
