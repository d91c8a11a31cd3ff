"""The daemon's own record of the SQLite store it last saw: is the store older than that now?

A write-ahead log deleted together with its ``-shm`` index, or a store file replaced
by an older copy, leaves a store that SQLite finds whole -- only older: the
transactions committed since are gone, and no check of the files can tell
(flexiqd.queue.sqlite.check).  So the daemon keeps, outside the store (in its state
directory), the time of the last heartbeat it committed to it; at its next start a
store whose row for this host is older than that has lost transactions.

The same evidence is what restoring a backup leaves, which is an operator's choice:
so this is said (the journal, ``MESSAGE_ID`` STORE_OLDER), not refused.  Only for a
store with ``synchronous`` full or extra: with ``normal`` or ``off`` a power cut may
lose the last commits by design.

``judge`` is pure; ``read_mark`` and ``write_mark`` are the I/O (a small JSON file,
replaced whole by rename).  ``write_mark`` is called on the heartbeat's thread.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from urllib.parse import parse_qsl, urlsplit

MARK_FILE = "store-mark.json"
# A store setting under which a committed transaction survives a power cut.
_DURABLE = ("full", "extra")


@dataclasses.dataclass(frozen=True)
class StoreMark:
    store: str      # the store's URL as the config gives it
    host: str       # this daemon's host name in the store
    beat: float     # the last heartbeat committed to it (epoch seconds, as written to the store)


def marked_store(url: str) -> bool:
    """Whether the store of ``url`` is one the mark is kept for: SQLite, committed durably."""
    if urlsplit(url).scheme != "sqlite":
        return False
    synchronous = dict(parse_qsl(urlsplit(url).query)).get("synchronous", "full").lower()
    return synchronous in _DURABLE


def judge(mark: StoreMark | None, store: str, host: str, stored_beat: float | None) -> str | None:
    """Why the store looks older than the daemon last saw it, or None.  Pure.

    ``stored_beat``: this host's last beat as the store holds it (None: no row)."""
    if mark is None or mark.store != store or mark.host != host:
        return None
    if stored_beat is not None and stored_beat >= mark.beat:
        return None
    held = "no heartbeat of this host" if stored_beat is None else f"its last at {_when(stored_beat)}"
    return (f"the queue database is older than flexiqd last saw it: its heartbeat of {_when(mark.beat)} is "
            f"missing ({held}). Transactions committed since are lost: its write-ahead log was lost "
            f"together with its -shm index, or the file was replaced by an older copy (a restored "
            f"backup). flexiqd starts on it as it is")


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def read_mark(path: str) -> StoreMark | None:
    """The mark at ``path``; None when there is none or it cannot be read (no evidence)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        return StoreMark(store=str(data["store"]), host=str(data["host"]), beat=float(data["beat"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_mark(path: str, mark: StoreMark) -> None:
    """Replace the mark at ``path`` whole (OSError is the caller's to log)."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(dataclasses.asdict(mark), handle)
    os.replace(temporary, path)
