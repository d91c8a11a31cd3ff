"""A pool's cgroup pressure (PSI): how much of the last 10 s its workers stalled on a resource.

Each worker unit (``flexiq-worker@<pool>-<n>.service``) is a cgroup of its own,
in system.slice; the kernel keeps ``cpu.pressure``, ``io.pressure`` and
``memory.pressure`` in it where PSI is on (Linux 4.20+, cgroup v2 -- the
unified hierarchy, alone or beside v1's).  A worker's cgroup is read from
``/proc/<pid>/cgroup`` (its ``0::`` line), under wherever cgroup2 is mounted
(``/proc/self/mountinfo``).  The pool's pressure is the mean of its active
workers' ``some avg10`` (each worker counts alike, whatever its own size).  A
host without PSI, a worker whose file cannot be read: no reading -- no
information, never "no pressure".

The parsing is pure (``parse_pressure``); the reads are the only I/O.
"""

from __future__ import annotations

import os
from typing import Iterable

RESOURCES = ("cpu", "io", "memory")


def parse_pressure(text: str) -> dict[str, float]:
    """``some``/``full`` -> avg10 (percent) from a ``*.pressure`` file's text; {} if it says neither."""
    found = {}
    for line in text.splitlines():
        kind, _, fields = line.partition(" ")
        if kind not in ("some", "full"):
            continue
        for field in fields.split():
            name, _, value = field.partition("=")
            if name == "avg10":
                try:
                    found[kind] = float(value)
                except ValueError:
                    pass
    return found


def unified_mount(mountinfo: str) -> str | None:
    """Where the cgroup v2 hierarchy is mounted, from ``/proc/self/mountinfo``'s text."""
    for line in mountinfo.splitlines():
        before, sep, after = line.partition(" - ")
        if sep and after.split(" ", 1)[0] == "cgroup2":
            return before.split()[4]
    return None


def unified_path(proc_cgroup: str) -> str | None:
    """A process's cgroup v2 path (``/system.slice/x.service``) from ``/proc/<pid>/cgroup``'s text."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


class PressureReader:
    """Reads the pools' pressure; finds the cgroup v2 mount once.  Not thread-safe."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self._mount: str | None | bool = False  # False: not looked for yet

    @property
    def mount(self) -> str | None:
        if self._mount is False:
            text = _read(os.path.join(self.proc, "self", "mountinfo"))
            self._mount = unified_mount(text) if text is not None else None
        return self._mount  # type: ignore[return-value]

    def worker(self, pid: int, resource: str) -> dict[str, float]:
        """One worker's ``some``/``full`` avg10 for ``resource``; {} when it cannot be read."""
        if self.mount is None:
            return {}
        cgroup = _read(os.path.join(self.proc, str(pid), "cgroup"))
        path = unified_path(cgroup) if cgroup is not None else None
        if path is None:
            return {}
        text = _read(os.path.join(self.mount, path.lstrip("/"), f"{resource}.pressure"))
        return parse_pressure(text) if text is not None else {}

    def pool(self, pids: Iterable[int], resources: Iterable[str]) -> dict[str, float | None]:
        """Per resource, the mean ``some avg10`` of the workers ``pids`` whose file could be read
        (None: none could, or no workers)."""
        pids = list(pids)
        found: dict[str, float | None] = {}
        for resource in resources:
            values = [reading["some"] for reading in (self.worker(pid, resource) for pid in pids)
                      if "some" in reading]
            found[resource] = sum(values) / len(values) if values else None
        return found
