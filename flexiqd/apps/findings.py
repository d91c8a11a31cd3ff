"""What is wrong, and what is risky, about a pool's app as a probe found it.  Pure.

Wrong (``error``): the app does not import; it loads code that the workers' sandbox hides
from them; a schedule that the pool serves names a task the app does not register.
Risky (``warning``): the workers load code from a place that the workers' user or group
can change -- the group that may steer the daemon would then decide what workers run.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from typing import Callable, Iterable, Mapping, Sequence

# Where the worker unit's sandbox hides files from the workers (units/flexiq-worker@.service).
HIDDEN_BY_SANDBOX = (("/home/", "ProtectHome="), ("/root/", "ProtectHome="), ("/run/user/", "ProtectHome="),
                     ("/tmp/", "PrivateTmp="), ("/var/tmp/", "PrivateTmp="))
# At most this many writable places are named per pool; the rest are counted.
SHOWN_WRITABLE = 3


@dataclasses.dataclass(frozen=True)
class Finding:
    pool: str
    severity: str  # "error" or "warning"
    text: str

    def __str__(self) -> str:
        return f"{self.severity}: pool {self.pool}: {self.text}"


@dataclasses.dataclass(frozen=True)
class ScheduleNeed:
    """A schedule's task, which the pools serving its queue must register."""

    schedule: str
    task: str
    queue: str


def app_findings(pool: str, app: str, error: str | None, tasks: Mapping[str, str], files: Sequence[str],
                 queues: Sequence[str], needs: Iterable[ScheduleNeed], sandboxed: bool = True) -> list[Finding]:
    """Errors a worker of ``pool`` would meet: ``error`` (the import's), files its sandbox hides
    (``sandboxed``: the workers are units), tasks a schedule needs."""
    if error is not None:
        return [Finding(pool, "error", f"app {app}: {error}")]
    found = []
    for path, directive in hidden_files(files) if sandboxed else ():
        found.append(Finding(pool, "error", f"app {app} loads {path}, which the workers' sandbox hides "
                                            f"from them ({directive}): install the code under /opt or /usr/local"))
    for need in needs:
        if need.queue in queues and need.task not in tasks:
            found.append(Finding(pool, "error", f"schedule {need.schedule} enqueues task {need.task} to queue "
                                                f"{need.queue}, but app {app} registers no task of that name"))
    return found


def hidden_files(files: Iterable[str]) -> list[tuple[str, str]]:
    """Each file under a directory the worker sandbox hides, with the directive that hides it."""
    hidden = []
    for path in files:
        for prefix, directive in HIDDEN_BY_SANDBOX:
            if path.startswith(prefix):
                hidden.append((path, directive))
                break
    return hidden


def writable_findings(pool: str, files: Iterable[str], uid: int, gids: Sequence[int], who: str,
                      stat_of: Callable[[str], os.stat_result] = os.stat) -> list[Finding]:
    """A warning for the places holding the app's code that the workers' user or groups can change.

    A file can be changed through itself or through any directory above it (a writable
    directory lets its entries be replaced), so each is checked up to ``/``.
    """
    places = set()
    for path in files:
        places.add(path)
        parent = os.path.dirname(path)
        while parent and parent not in places:
            places.add(parent)
            if parent == "/":
                break
            parent = os.path.dirname(parent)
    writable = sorted(place for place in places if _writable(place, uid, gids, stat_of))
    # Name the topmost ones: a writable directory makes everything under it so.
    top = [place for place in writable
           if not any(place != other and place.startswith(other.rstrip("/") + "/") for other in writable)]
    if not top:
        return []
    shown = ", ".join(top[:SHOWN_WRITABLE]) + (f" and {len(top) - SHOWN_WRITABLE} more" if len(top) > SHOWN_WRITABLE
                                               else "")
    return [Finding(pool, "warning", f"its workers load code from {shown}, which {who} can change: whoever "
                                     f"is in that group could choose what the workers run (make it root's, "
                                     f"not group- or world-writable)")]


def _writable(path: str, uid: int, gids: Sequence[int], stat_of: Callable[[str], os.stat_result]) -> bool:
    try:
        info = stat_of(path)
    except OSError:
        return False
    mode = info.st_mode
    if info.st_uid == uid:  # the owner may chmod it, whatever its mode
        return True
    if info.st_gid in gids and mode & stat.S_IWGRP:
        return not (stat.S_ISDIR(mode) and mode & stat.S_ISVTX)
    if mode & stat.S_IWOTH:
        return not (stat.S_ISDIR(mode) and mode & stat.S_ISVTX)
    return False
