"""What the tick reads of direct evidence for each pool: its dependencies' probes and its pressure.

The policy judges the readings (``policy.evidence``); this module gathers them:
the newest result of each probe the pool heeds (``probes``), and the pool's
workers' cgroup pressure for each resource it heeds (``pressure``).  A source
without a reading this tick gets None, and why in ``notes`` (for the status).
"""

from __future__ import annotations

from typing import Iterable

from ..config.model import DaemonConfig, PoolConfig
from ..policy.types import EvidenceReading
from .pressure import PressureReader
from .probes import ProbeResult, ProbeSet


class EvidenceReader:
    """Owns the probes' threads (``stop`` ends them).  Not thread-safe: the control loop calls it."""

    def __init__(self, config: DaemonConfig, pressure: PressureReader | None = None) -> None:
        self.probes = ProbeSet(config.probes, config.tick)
        self.pressure = pressure or PressureReader()
        self._results: dict[str, ProbeResult | None] = {}
        #: Per pool, per source: why it gave no reading at the last tick.
        self.notes: dict[str, dict[str, str]] = {}

    def reconfigure(self, config: DaemonConfig) -> None:
        self.probes.reconfigure(config.probes, config.tick)
        self.notes = {name: notes for name, notes in self.notes.items() if name in config.pools}

    def begin_tick(self) -> None:
        """Take each probe's new result, once for every pool of this tick."""
        self._results = self.probes.take()

    def read(self, pool: PoolConfig, pids: Iterable[int]) -> tuple[EvidenceReading, ...]:
        """The readings of every source the pool heeds (None where there is no information)."""
        rules = pool.policy.evidence if pool.policy is not None else ()
        readings, notes = [], {}
        resources = [rule.source.split(":", 1)[1] for rule in rules if rule.source.startswith("pressure:")]
        pressure = self.pressure.pool(pids, resources) if resources else {}
        for rule in rules:
            kind, _, name = rule.source.partition(":")
            value: float | None
            if kind == "probe":
                result = self._results.get(name)
                value = result.latency if result is not None else None
                if result is None:
                    latest = self.probes.latest().get(name)
                    notes[rule.source] = (latest.error if latest is not None and latest.error
                                          else "no new answer since the last tick")
                elif result.error:
                    notes[rule.source] = result.error
            else:
                value = pressure.get(name)
                if value is None:
                    notes[rule.source] = (f"no {name}.pressure readable for its workers (PSI off, cgroup v1 "
                                          f"only, or no worker running)")
            readings.append(EvidenceReading(rule.source, value))
        self.notes[pool.name] = notes
        return tuple(readings)

    def stop(self) -> None:
        self.probes.stop()
