"""The last hour of every pool, for charts: a bounded ring of samples taken after each tick.

A tick may come every second (or sooner, when work arrives); a chart of an hour needs
far fewer points.  So ticks are summed up in steps of ``STEP`` seconds: a step keeps its
last worker counts and decision, and the most runnable jobs, running jobs and the
oldest age any of its ticks saw, so a short burst still shows as its peak.  A pool keeps
``SPAN / STEP`` steps in fixed arrays of floats (about 50 KiB a pool, whatever the tick),
which are written to the state folder and read back at start, with the operators'
intent, so a restart keeps the charts.  Pure but for the arrays it owns.
"""

from __future__ import annotations

import array
import math
from typing import Any, Iterable, Mapping

STEP = 5.0       # seconds of ticks summed up in one sample
SPAN = 3600.0    # seconds of samples kept
CAPACITY = int(SPAN / STEP)
# A sample's fields, in the order of the arrays (NaN: not known).
FIELDS = ("t", "active", "starting", "draining", "desired", "runnable", "running", "delayed", "oldest_age")
_PEAKS = frozenset({"runnable", "running", "oldest_age"})  # of a step: the most any tick saw


class PoolSamples:
    """One pool's ring: ``CAPACITY`` samples, oldest overwritten first."""

    def __init__(self) -> None:
        self._columns = {name: array.array("d", [math.nan]) * CAPACITY for name in FIELDS}
        self._next = 0      # where the next new sample goes
        self._count = 0

    def record(self, values: Mapping[str, float | None], now: float) -> None:
        """This tick's values: a new sample when a new step began, else folded into the last."""
        last = (self._next - 1) % CAPACITY
        if self._count and math.floor(now / STEP) == math.floor(self._columns["t"][last] / STEP):
            at = last
        else:
            at = self._next
            self._next = (self._next + 1) % CAPACITY
            self._count = min(self._count + 1, CAPACITY)
            for column in self._columns.values():
                column[at] = math.nan
        self._columns["t"][at] = now
        for name in FIELDS[1:]:
            value = values.get(name)
            value = math.nan if value is None else float(value)
            column = self._columns[name]
            if name in _PEAKS and not math.isnan(column[at]) and not math.isnan(value):
                value = max(value, column[at])
            elif math.isnan(value) and name in _PEAKS:
                value = column[at]
            column[at] = value

    def since(self, since: float) -> list[dict[str, float | None]]:
        """The samples at or after ``since``, oldest first; unknown values None."""
        first = (self._next - self._count) % CAPACITY
        found = []
        for i in range(self._count):
            at = (first + i) % CAPACITY
            if self._columns["t"][at] >= since:
                found.append({name: _known(self._columns[name][at]) for name in FIELDS})
        return found

    def copy(self) -> "PoolSamples":
        """A ring of its own with the same samples (the arrays copied: a few KiB)."""
        twin = PoolSamples()
        twin._columns = {name: array.array("d", column) for name, column in self._columns.items()}
        twin._next, twin._count = self._next, self._count
        return twin

    def rows(self) -> list[list[float | None]]:
        """Every sample as a list of FIELDS' values, oldest first (for the state file)."""
        return [[sample[name] for name in FIELDS] for sample in self.since(-math.inf)]


def _known(value: float) -> float | None:
    return None if math.isnan(value) else value


def tick_values(view: Any) -> dict[str, float | None]:
    """What a sample records of a pool's view (``published.PoolView``) after a tick."""
    metrics = view.metrics
    return {
        "active": view.active, "starting": view.starting, "draining": view.draining,
        "desired": view.decision.desired if view.decision is not None else None,
        "runnable": metrics.runnable_depth if metrics is not None else None,
        "running": metrics.running if metrics is not None else None,
        "delayed": sum(s.delayed for s in view.stats) if view.stats else None,
        "oldest_age": metrics.oldest_runnable_age if metrics is not None else None,
    }


class Samples:
    """Every pool's ring.  Not thread-safe: the daemon's I/O thread records and reads it."""

    def __init__(self) -> None:
        self.pools: dict[str, PoolSamples] = {}

    def record(self, views: Mapping[str, Any], now: float) -> None:
        for name, view in views.items():
            self.pools.setdefault(name, PoolSamples()).record(tick_values(view), now)

    def forget_others(self, pools: Iterable[str]) -> None:
        """Drop the rings of pools no longer configured (after a reload)."""
        keep = set(pools)
        for name in [name for name in self.pools if name not in keep]:
            del self.pools[name]

    def since(self, pool: str, since: float) -> list[dict[str, float | None]]:
        ring = self.pools.get(pool)
        return ring.since(since) if ring is not None else []

    def copy(self) -> "Samples":
        """Rings of their own with the same samples: for readers on other threads."""
        twin = Samples()
        twin.pools = {name: ring.copy() for name, ring in self.pools.items()}
        return twin

    def to_document(self) -> dict[str, Any]:
        """What the state file keeps: {"step", "fields", "pools": {name: [[values...], ...]}}."""
        return {"step": STEP, "fields": list(FIELDS), "pools": {name: ring.rows() for name, ring in self.pools.items()}}

    @classmethod
    def from_document(cls, document: Any, pools: Iterable[str]) -> "Samples":
        """The rings kept in the state file, for the pools still configured; a document of
        another shape (another version, a damaged file) gives empty rings."""
        samples = cls()
        if not isinstance(document, dict) or document.get("fields") != list(FIELDS):
            return samples
        kept = document.get("pools")
        if not isinstance(kept, dict):
            return samples
        for name in pools:
            rows = kept.get(name)
            if not isinstance(rows, list):
                continue
            ring = samples.pools[name] = PoolSamples()
            for row in rows[-CAPACITY:]:
                if isinstance(row, list) and len(row) == len(FIELDS) and isinstance(row[0], (int, float)):
                    ring.record(dict(zip(FIELDS[1:], row[1:])), float(row[0]))
        return samples
