"""The mark a store move leaves in the old SQLite file: where the store went.

``flexiq move-store`` writes the table ``flexiq_moved`` (the new store's URL, shown
without its password, and when) and triggers that abort any write to the jobs, the
hosts and the schedules with a message naming the new store.  The triggers stop a
producer that opened the file before the move and still holds it open (a file's
mode is checked only when it is opened); opening the file again is refused by
``SQLiteDatabase`` (``moved_to``), before anything is written, even as root.
"""

from __future__ import annotations

import sqlite3

MARKER_TABLE = "flexiq_moved"
# Every table a daemon, a worker or a producer writes while it works: a write to any of
# them is refused.  Only names that exist in the store's schema at every version since
# the hosts and the schedules came (v7 and v10): the mark is written after a migration.
_GUARDED = ("jobs", "hosts", "schedules", "schedule_slots")


def moved_message(path: str, target: str) -> str:
    return (f"the queue database {path} was moved to {target} (flexiq move-store): set store: {target} "
            f"in /etc/flexiqd/flexiqd.yaml (and FLEXIQ_URL or --url where a program names the old file)")


def mark_moved(conn: sqlite3.Connection, path: str, target: str, now: float) -> None:
    """Write the mark into the open transaction of ``conn`` (``target``: the URL as shown)."""
    conn.execute(f"CREATE TABLE {MARKER_TABLE} (target TEXT NOT NULL, moved_at REAL NOT NULL)")
    conn.execute(f"INSERT INTO {MARKER_TABLE} (target, moved_at) VALUES (?, ?)", (target, now))
    # RAISE takes a literal: quote the message as SQL text.
    message = moved_message(path, target).replace("'", "''")
    for table in _GUARDED:
        for event in ("INSERT", "UPDATE", "DELETE"):
            conn.execute(f"CREATE TRIGGER {MARKER_TABLE}_{table}_{event.lower()} BEFORE {event} ON {table} "
                         f"BEGIN SELECT RAISE(ABORT, '{message}'); END")


def marked_target(conn: sqlite3.Connection) -> str | None:
    """The store a marked file was moved to, or None; read with ``conn``, writing nothing."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                    (MARKER_TABLE,)).fetchone() is None:
        return None
    row = conn.execute(f"SELECT target FROM {MARKER_TABLE} LIMIT 1").fetchone()
    return row[0] if row else None


def moved_to(path: str) -> str | None:
    """The store the file at ``path`` was moved to, or None (also when it cannot be read:
    opening it the ordinary way then says why)."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
    except sqlite3.Error:
        return None
    try:
        return marked_target(conn)
    except sqlite3.Error:
        return None
    finally:
        conn.close()
