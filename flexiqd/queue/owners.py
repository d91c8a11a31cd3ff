"""Who holds a lease: a worker's owner name, and whether that worker can still be running.

A lease owner is named ``<host>:<instance>:<pid>`` (``web1:default-3:4242``).
The name is what lets any process on the same host decide that a job's
holder is gone -- and only then may a started job run again.
"""

from __future__ import annotations

import os


def this_host() -> str:
    return os.uname().nodename


def owner_name(instance: str, pid: int | None = None, host: str | None = None) -> str:
    """The lease owner name of this process (or of ``pid`` on ``host``)."""
    return f"{host or this_host()}:{instance}:{pid if pid is not None else os.getpid()}"


def owner_parts(owner: str) -> tuple[str, str, int] | None:
    """(host, instance, pid) of a lease owner name; None for names not made by ``owner_name``."""
    parts = owner.rsplit(":", 2)
    if len(parts) != 3 or not parts[2].isdigit():
        return None
    return parts[0], parts[1], int(parts[2])


def process_exists(pid: int) -> bool:
    """Whether a process with this pid exists, even one we may not signal or see in /proc."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_alive_here(owner: str) -> bool | None:
    """True/False when ``owner`` is a process of this host that does/does not exist; None when
    this host cannot tell (another host's worker, or a name not made by ``owner_name``)."""
    parts = owner_parts(owner)
    if parts is None or parts[0] != this_host():
        return None
    return process_exists(parts[2])
