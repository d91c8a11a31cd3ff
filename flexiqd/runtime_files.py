"""Files the daemon publishes for its workers in its runtime directory (/run/flexiqd).

Both are written by the daemon (root) and only read by workers, so nobody who
may merely steer flexiqd can change what a worker loads or whether it claims:
- ``applied.yaml``: the config in force (a worker reads its pool's settings there);
- ``paused.json``: the pools an operator paused, so a worker that systemd
  (re)starts in a paused pool starts paused instead of claiming.

A worker finds them through ``$FLEXIQD_CONFIG`` and ``$FLEXIQD_PAUSED_FILE``,
which the daemon sets in each worker unit's drop-in.
"""

from __future__ import annotations

import json
import os

APPLIED_CONFIG = "applied.yaml"
PAUSED_FILE = "paused.json"
PAUSED_FILE_ENV = "FLEXIQD_PAUSED_FILE"
# Readable by the workers' group, writable by the daemon alone.
PUBLISHED_MODE = 0o640


def write_atomically(path: str, text: str, mode: int) -> None:
    """Replace ``path`` with ``text`` in one rename, with ``mode`` whatever the umask.  Raises OSError.

    The daemon runs with UMask=0007 (for the queue it shares with group flexiq), so a
    file it writes would otherwise be group-writable; and a reader never sees half a file.
    """
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # O_CREAT's mode is cut by the umask; an old file keeps its own
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            fd = -1
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
    finally:
        if fd >= 0:
            os.close(fd)
    os.replace(tmp, path)


def write_published(path: str, text: str) -> None:
    """Replace ``path`` atomically with ``text``, mode 0640.  Raises OSError."""
    write_atomically(path, text, PUBLISHED_MODE)


def write_paused_pools(path: str, pools: set[str] | list[str]) -> None:
    write_published(path, json.dumps({"paused": sorted(pools)}) + "\n")


def read_paused_pools(path: str | None) -> set[str]:
    """The pools paused by an operator; empty when there is no such file (nothing paused)."""
    if not path:
        return set()
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return set()
    except (OSError, ValueError):
        # Unreadable or garbled: claiming while an operator paused the pool is the worse error.
        return {"*"}
    paused = data.get("paused") if isinstance(data, dict) else None
    return {p for p in paused if isinstance(p, str)} if isinstance(paused, list) else {"*"}


def is_paused(path: str | None, pool: str) -> bool:
    pools = read_paused_pools(path)
    return pool in pools or "*" in pools
