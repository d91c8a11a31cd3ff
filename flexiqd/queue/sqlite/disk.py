"""The file system under a store that is a file (SQLite): full, or mounted read-only.

SQLite says only "database or disk is full" or "attempt to write a readonly
database"; an operator needs to know which disk, and that the store itself is
sound.  ``disk_problem`` looks at the file system (``statvfs``, and on request a write)
and says it in a sentence that names the store and its mount point.  Cheap, so the
daemon asks every tick (and writes a probe every few seconds).  Thread-safe; no state.
"""

from __future__ import annotations

import errno
import os
import re

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


def disk_problem(path: str, *, write_probe: bool = False) -> str | None:
    """Why the file system under the store file ``path`` takes no writes, or None if it does.

    ``write_probe``: also create and remove an empty file beside the store.  A file system
    that turned read-only after an error (ext4's ``errors=remount-ro`` on Linux 6.x, an XFS
    shutdown) still says read-write to ``statvfs``; only a write finds out.
    """
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
    if write_probe:
        refused = _write_refused(folder)
        if refused is not None:
            return f"the file system {mount} holding the queue database {path} takes no writes ({refused})"
    return None


_FREE_LEFT = re.compile(r" \(\d+ KiB free\)$")


def same_problem(one: str | None, other: str | None) -> bool:
    """Whether two of ``disk_problem``'s sentences say the same but for the free space left: a
    full disk's last kilobytes come and go with every write on it, and are not news."""
    if one is None or other is None:
        return one is other
    return _FREE_LEFT.sub("", one) == _FREE_LEFT.sub("", other)


def _write_refused(folder: str) -> str | None:
    """The error of creating a file in ``folder``, if it is one the file system gives (read-only,
    I/O error, full); None when the write works or fails for another reason (permissions)."""
    probe = os.path.join(folder, f".flexiq-write-probe-{os.getpid()}")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    except OSError as exc:
        return exc.strerror if exc.errno in (errno.EROFS, errno.EIO, errno.ENOSPC, errno.EDQUOT) else None
    try:
        os.unlink(probe)
    except OSError:
        pass  # a probe left behind is an empty file; the next one replaces it
    return None
