"""Damage a SQLite store the ways a host does: a page overwritten, the file cut short, the
write-ahead log lost with committed transactions in it.

Used by the unit tests on local files and, as a script, by the system test inside the
sandbox (the checkout is visible there at the same path)::

    python3 tests/store_damage.py page-of-jobs|page-of-index|claim-head|header|truncate|lose-wal FILE
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

# Garbage that is no valid b-tree page of any kind (a page starts with its type byte).
GARBAGE_BYTE = 0xDE


def page_size(path: str) -> int:
    with open(path, "rb") as handle:
        head = handle.read(18)
    size = int.from_bytes(head[16:18], "big")
    return 65536 if size == 1 else size


def leaf_page(path: str, name: str, *, first: bool = False) -> int:
    """A leaf page of table or index ``name`` (SQLite's dbstat): the middle one of its leaves in
    key order, or with ``first`` the one that holds its lowest keys."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        pages = [row[0] for row in conn.execute(
            "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = 'leaf' ORDER BY path", (name,))]
    finally:
        conn.close()
    if not pages:
        raise ValueError(f"{path}: {name} has no leaf page")
    return pages[0] if first else pages[len(pages) // 2]


def checkpoint(path: str) -> None:
    """Copy a write-ahead log left beside the file into it: a page damaged in the file while a
    newer copy of it waits in the log would be read from the log, and then overwritten."""
    if os.path.exists(path + "-wal") and os.path.getsize(path + "-wal"):
        conn = sqlite3.connect(path)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()


def root_page(path: str, name: str) -> int:
    """The first page of table or index ``name`` (a small table's only one)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0]
    finally:
        conn.close()


def overwrite_page(path: str, page: int) -> None:
    """Page ``page`` (1 is the header page) written over with garbage, as a bad sector or a
    stray write would leave it."""
    size = page_size(path)
    with open(path, "r+b") as handle:
        handle.seek((page - 1) * size)
        handle.write(bytes([GARBAGE_BYTE]) * size)
        handle.flush()
        os.fsync(handle.fileno())


def truncate(path: str) -> None:
    """The file cut short in the middle of a page, as a copy stopped half-way leaves it."""
    os.truncate(path, os.path.getsize(path) // 2 + 100)


_COMMIT_THEN_DIE = """
import os, sys, time
sys.path.insert(0, {repo!r})
from flexiqd.queue.sqlite.database import SQLiteBackend
from flexiqd.queue.types import NewJob
store = SQLiteBackend({path!r})
store.database.connection.execute("PRAGMA wal_autocheckpoint = 0")  # nothing copied into the file
ids = store.enqueue([NewJob(task="lost", payload={{"n": n}}) for n in range({count})], now=time.time())
print(ids[0], ids[-1], flush=True)
os._exit(0)  # dies without closing: the log keeps what it committed
"""


def commit_then_die(path: str, count: int) -> list[int]:
    """Enqueue ``count`` jobs in a process that then dies, its write-ahead log not copied into
    the database; the ids it reported."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", _COMMIT_THEN_DIE.format(repo=repo, path=path, count=count)],
                          check=True, capture_output=True, text=True)
    first, last = map(int, done.stdout.split())
    return list(range(first, last + 1))


def lose_wal(path: str) -> None:
    """The write-ahead log deleted (a clean-up script, a copy of the .db file alone)."""
    os.unlink(path + "-wal")


def main(argv: list[str]) -> int:
    what, path = argv
    if what != "lose-wal":
        checkpoint(path)
    if what == "page-of-jobs":
        overwrite_page(path, leaf_page(path, "jobs"))
    elif what == "page-of-index":
        overwrite_page(path, leaf_page(path, "jobs_claim"))
    elif what == "claim-head":
        overwrite_page(path, leaf_page(path, "jobs_claim", first=True))
    elif what == "header":
        overwrite_page(path, 1)
    elif what == "truncate":
        truncate(path)
    elif what == "lose-wal":
        lose_wal(path)
    else:
        raise SystemExit(f"unknown damage {what!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
