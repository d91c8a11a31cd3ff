"""The file system under a store that is a file (SQLite): full, or mounted read-only.

SQLite says only "database or disk is full" or "attempt to write a readonly
database"; an operator needs to know which disk, and that the store itself is
sound.  ``disk_problem`` looks at the file system (``statvfs``) and says it in a
sentence that names the store and its mount point.  Cheap (two system calls), so
the daemon asks every tick.  Thread-safe; no state.
"""

from __future__ import annotations

import os

# Below this many free bytes the disk counts as full: SQLite needs room for its WAL and
# a checkpoint, and a few kilobytes left by a filled disk let no transaction through.
FULL_BELOW = 1 << 20


def mount_point(path: str) -> str:
    """The mount point of the file system holding ``path`` (its nearest existing folder's)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    device = os.stat(path).st_dev
    while path != "/":
        parent = os.path.dirname(path)
        if os.stat(parent).st_dev != device:
            return path
        path = parent
    return path


def disk_problem(path: str) -> str | None:
    """Why the file system under the store file ``path`` takes no writes, or None if it does."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fs = os.statvfs(folder)
        mount = mount_point(folder)
    except OSError:
        return None  # a folder that is gone is the store's own error to report
    if fs.f_flag & os.ST_RDONLY:
        return f"the file system {mount} holding the queue database {path} is mounted read-only"
    free = fs.f_bavail * fs.f_frsize
    if free < FULL_BELOW:
        return f"the disk {mount} holding the queue database {path} is full ({free // 1024} KiB free)"
    return None
