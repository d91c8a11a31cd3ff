"""A pool's cgroup pressure (PSI): how much of the last tick its workers stalled on a resource.

Each worker unit (``flexiq-worker@<pool>-<n>.service``) is a cgroup of its own,
in system.slice; the kernel keeps ``cpu.pressure``, ``io.pressure`` and
``memory.pressure`` in it where PSI is on (Linux 4.20+, cgroup v2 -- the
unified hierarchy, alone or beside v1's).  A worker's cgroup is read from
``/proc/<pid>/cgroup`` (its ``0::`` line), under wherever cgroup2 is mounted
(``/proc/self/mountinfo``).  A worker's pressure is the share of the time
since the previous read in which some of its tasks stalled on the resource: the
growth of the file's ``some total`` (microseconds) over the time between the
two reads -- not ``avg10``, which trails a pool that doubles in a second by ten
seconds.  The pool's pressure is the mean of its active workers' (each worker
counts alike, whatever its own size); a worker read for the first time has none
yet.  A host without PSI, a worker whose file cannot be read: no reading -- no
information, never "no pressure".

The parsing is pure (``parse_pressure``); the reads are the only I/O.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Iterable

RESOURCES = ("cpu", "io", "memory")


def parse_pressure(text: str) -> dict[str, float]:
    """From a ``*.pressure`` file's text: ``some``/``full`` -> avg10 (percent) and ``some_total``/
    ``full_total`` -> the stalled time so far (microseconds); {} if it says neither."""
    found = {}
    for line in text.splitlines():
        kind, _, fields = line.partition(" ")
        if kind not in ("some", "full"):
            continue
        for field in fields.split():
            name, _, value = field.partition("=")
            key = {"avg10": kind, "total": f"{kind}_total"}.get(name)
            if key is not None:
                try:
                    found[key] = float(value)
                except ValueError:
                    pass
    return found


def stalled_share(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    """Percent of the time between two reads ``(some total in microseconds, when in seconds)`` that
    was stalled; None when no time passed or the counter went back (a new cgroup of the same name)."""
    elapsed = after[1] - before[1]
    grown = after[0] - before[0]
    if elapsed <= 0 or grown < 0:
        return None
    return min(100.0, grown / 1e6 / elapsed * 100.0)


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
    """Reads the pools' pressure; finds the cgroup v2 mount once, and keeps each worker's last
    total to measure the next read against.  Not thread-safe."""

    def __init__(self, proc: str = "/proc", clock: Callable[[], float] = time.monotonic) -> None:
        self.proc = proc
        self.clock = clock
        self._mount: str | None | bool = False  # False: not looked for yet
        self._last: dict[tuple[int, str], tuple[float, float]] = {}  # (pid, resource) -> (total, when)

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
        """Per resource, the mean share of time (percent) the workers ``pids`` stalled since this
        reader last read each of them (None: none could be read twice, or no workers).  Workers
        not in ``pids`` are forgotten for the resources read."""
        pids = list(pids)
        found: dict[str, float | None] = {}
        for resource in resources:
            now, values = self.clock(), []
            for pid in pids:
                total = self.worker(pid, resource).get("some_total")
                previous = self._last.pop((pid, resource), None)
                if total is None:
                    continue
                self._last[(pid, resource)] = (total, now)
                share = stalled_share(previous, (total, now)) if previous is not None else None
                if share is not None:
                    values.append(share)
            for key in [key for key in self._last if key[1] == resource and key[0] not in pids]:
                del self._last[key]
            found[resource] = sum(values) / len(values) if values else None
        return found
