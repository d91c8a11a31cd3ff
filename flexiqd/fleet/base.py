"""Where workers live, seen from the controller: start, drain-stop, list.

Two fleets implement it: systemd units (the product) and child processes (a
laptop or a container without systemd).  The controller never trusts its own
memory of which workers exist: it calls ``list()`` every tick.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import re
from typing import Iterable, Mapping

POOL_NAME = re.compile(r"^[a-z0-9_]+$")


class WorkerState(str, enum.Enum):
    STARTING = "starting"   # asked to start, not yet ready (not claiming yet)
    ACTIVE = "active"       # ready and claiming
    DRAINING = "draining"   # asked to stop: finishing or releasing its jobs
    FAILED = "failed"       # exited unsuccessfully; its leases need recovering


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What a fleet needs to run one pool's workers."""

    pool: str
    app: str
    queues: tuple[str, ...]
    concurrency: int
    drain_timeout: float
    lease_seconds: float
    store_url: str
    environment: Mapping[str, str] = dataclasses.field(default_factory=dict)
    memory_max: int | None = None     # bytes
    cpu_weight: int | None = None     # 1..10000
    batch_size: int | None = None     # most jobs a worker claims at once


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """One worker as the fleet's source of truth reports it."""

    pool: str
    index: int
    state: WorkerState
    pid: int | None = None
    started_at: float | None = None   # epoch seconds it became active, when known

    @property
    def instance(self) -> str:
        return instance_name(self.pool, self.index)


def instance_name(pool: str, index: int) -> str:
    """``<pool>-<n>``: the systemd instance name, and the worker's name in leases."""
    return f"{pool}-{index}"


def parse_instance(instance: str) -> tuple[str, int] | None:
    """``("default", 3)`` from ``default-3``; None for names flexiqd did not make."""
    pool, sep, index = instance.rpartition("-")
    if not sep or not POOL_NAME.match(pool) or not index.isdigit():
        return None
    return pool, int(index)


class Fleet(abc.ABC):
    """The controller's handle on running workers.  Methods block briefly; not thread-safe."""

    @abc.abstractmethod
    def list(self) -> list[WorkerInfo]:
        """Every worker flexiqd runs, of every pool, as it is now (failed ones included once)."""

    @abc.abstractmethod
    def configure(self, specs: Iterable[WorkerSpec]) -> None:
        """Make the fleet ready to run these pools (drop-ins, limits).  Idempotent."""

    @abc.abstractmethod
    def start(self, spec: WorkerSpec, indices: Iterable[int]) -> None:
        """Start workers ``<pool>-<index>``; returns once asked, not once ready."""

    @abc.abstractmethod
    def stop(self, workers: Iterable[WorkerInfo]) -> None:
        """Drain-stop: ask each to stop claiming, then to stop within its drain budget."""

    @abc.abstractmethod
    def pause(self, workers: Iterable[WorkerInfo], paused: bool) -> None:
        """Ask workers to stop claiming (``paused``) or to claim again.  Nothing is killed."""

    @abc.abstractmethod
    def forget(self, worker: WorkerInfo) -> None:
        """Acknowledge a FAILED worker (its leases were recovered) so ``list`` drops it."""

    def close(self) -> None:
        """Release the fleet's resources; running workers keep running."""
