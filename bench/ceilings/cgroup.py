"""A CPU quota for a set of processes, straight on the kernel's cgroup files (no systemd).

``CpuCap(cpus)`` makes a child cgroup with a CPU quota of ``cpus`` CPUs per period and
moves processes into it (``add``); what they fork afterwards stays inside.  It uses
cgroup v2 where the ``cpu`` controller is on a writable cgroup2 hierarchy
(``cpu.max``), and otherwise cgroup v1's ``cpu`` controller (``cpu.cfs_quota_us`` /
``cpu.cfs_period_us``): on a hybrid host (v1 controllers on /sys/fs/cgroup/<name>,
an empty cgroup2 on /sys/fs/cgroup/unified) only v1 can cap CPU.  ``remove`` moves
whatever is left back to the parent and deletes the cgroup.
"""

from __future__ import annotations

import os
import pathlib
import time


def _mounts() -> list[tuple[str, str, list[str]]]:
    rows = []
    with open("/proc/self/mounts", encoding="utf-8") as handle:
        for line in handle:
            _dev, where, kind, options, *_ = line.split()
            rows.append((where, kind, options.split(",")))
    return rows


def find_hierarchy() -> tuple[str, pathlib.Path] | tuple[None, str]:
    """("v2" | "v1", the directory to make the child under), or (None, why not)."""
    reasons = []
    for where, kind, _options in _mounts():
        if kind != "cgroup2":
            continue
        root = pathlib.Path(where)
        controllers = (root / "cgroup.controllers").read_text().split() if (root / "cgroup.controllers").exists() else []
        if "cpu" in controllers and os.access(root, os.W_OK):
            return "v2", root
        reasons.append(f"cgroup2 at {where} has controllers {controllers or 'none'}, no cpu")
    for where, kind, options in _mounts():
        if kind == "cgroup" and "cpu" in options and os.access(where, os.W_OK):
            return "v1", pathlib.Path(where)
    reasons.append("no writable cgroup v1 cpu controller")
    return None, "; ".join(reasons)


class CpuCap:
    """A cgroup with ``cpus`` CPUs of quota (0.5: half a CPU), ``period_us`` per period."""

    def __init__(self, cpus: float, *, period_us: int = 20_000, name: str | None = None) -> None:
        version, where = find_hierarchy()
        if version is None:
            raise RuntimeError(f"cannot cap CPU here: {where}")
        self.version = version
        self.cpus = cpus
        self.period_us = period_us
        self.path = pathlib.Path(where) / (name or f"flexiq-ceiling-{os.getpid()}")
        self.path.mkdir()
        quota = max(1000, int(cpus * period_us))
        try:
            if version == "v2":
                subtree = self.path.parent / "cgroup.subtree_control"
                if "cpu" not in subtree.read_text().split():
                    subtree.write_text("+cpu")
                (self.path / "cpu.max").write_text(f"{quota} {period_us}")
            else:
                (self.path / "cpu.cfs_period_us").write_text(str(period_us))
                (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        except OSError:
            self.path.rmdir()
            raise

    def describe(self) -> str:
        files = "cpu.max" if self.version == "v2" else "cpu.cfs_quota_us/cpu.cfs_period_us"
        return (f"cgroup {self.version} {self.path} ({files}: {int(self.cpus * self.period_us)} us "
                f"per {self.period_us} us = {self.cpus:g} CPU)")

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]

    def throttled(self) -> dict[str, int]:
        """cpu.stat's counters (nr_periods, nr_throttled, throttled time)."""
        out = {}
        for line in (self.path / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                out[key] = int(value)
        return out

    def remove(self) -> None:
        """Move what is left to the parent cgroup, then delete this one."""
        if not self.path.exists():
            return
        for _ in range(50):
            pids = self.pids()
            for pid in pids:
                try:
                    (self.path.parent / "cgroup.procs").write_text(str(pid))
                except OSError:
                    pass  # it exited meanwhile
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"could not remove {self.path}")
