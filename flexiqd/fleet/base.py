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

from ..settings_schema import STOP_GRACE

POOL_NAME = re.compile(r"^[a-z0-9_]+$")
# STOP_GRACE: a worker's stop timeout is its drain budget plus this -- time to interrupt what
# is still running, hand back (or abandon) its jobs and exit before anything is killed.  Its
# parts, each a step of the worker's end game, are in flexiqd.settings_schema.


class WorkerState(str, enum.Enum):
    STARTING = "starting"   # asked to start, not yet ready (not claiming yet)
    ACTIVE = "active"       # ready and claiming
    DRAINING = "draining"   # asked to stop: finishing or releasing its jobs
    FAILED = "failed"       # exited unsuccessfully; its leases need recovering


@dataclasses.dataclass(frozen=True)
class Credential:
    """A secret file handed to each worker of a pool (systemd's ``LoadCredential=``).

    The worker reads it as ``$CREDENTIALS_DIRECTORY/<name>``; ``encrypted`` ones were
    made with ``systemd-creds encrypt`` (``LoadCredentialEncrypted=``).
    """

    name: str
    path: str
    encrypted: bool = False


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
    credentials: tuple[Credential, ...] = ()
    python: str | None = None         # the workers' interpreter (a virtual environment's); None: the system's
    unit_settings: tuple[tuple[str, str], ...] = ()   # the pool's own [Service] lines (unit_settings)
    # Instances 1..ready_ahead are made ready to start before they are needed (the systemd
    # fleet writes their drop-ins at configure): a scale-up then waits for no daemon-reload.
    ready_ahead: int = 0

    @property
    def stop_timeout(self) -> float:
        """How long a stopping worker may take before it is killed (systemd's TimeoutStopSec)."""
        return self.drain_timeout + STOP_GRACE


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """One worker as the fleet's source of truth reports it."""

    pool: str
    index: int
    state: WorkerState
    pid: int | None = None
    started_at: float | None = None   # epoch seconds it became active, when known
    #: Seconds from the start's beginning to ready (systemd's inactive-exit to
    #: active-enter, READY=1 for Type=notify, on the monotonic clock), when known.
    ready_after: float | None = None
    #: When its current process was started, in seconds on CLOCK_MONOTONIC (systemd's
    #: ExecMainStartTimestampMonotonic; ``time.monotonic()`` in this process), when known:
    #: the code it runs is the code installed before then (see daemon.restarts).
    launched: float | None = None

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
    """The controller's handle on running workers.  Methods block briefly; not thread-safe.

    Signals that pause or resume claiming go only to ACTIVE (ready) workers: a worker
    that is still starting has no handler yet, and reads the pools' paused state
    itself when it starts.
    """

    def __init__(self) -> None:
        self._told_paused: dict[int, bool] = {}   # pid -> what it was last told

    @abc.abstractmethod
    def list(self) -> list[WorkerInfo]:
        """Every worker flexiqd runs, of every pool, as it is now (failed ones included once)."""

    @abc.abstractmethod
    def configure(self, specs: Iterable[WorkerSpec]) -> None:
        """Run these pools' workers with these specs: future starts, and the limits and stop
        timeout of workers already running.  Idempotent."""

    @abc.abstractmethod
    def start(self, spec: WorkerSpec, indices: Iterable[int]) -> None:
        """Start workers ``<pool>-<index>``; returns once asked, not once ready."""

    @abc.abstractmethod
    def stop(self, workers: Iterable[WorkerInfo]) -> None:
        """Drain-stop: ask each to stop claiming, then to stop within its stop timeout."""

    def stop_pool(self, pool: str) -> None:
        """Drain-stop every worker of ``pool``."""
        self.stop([w for w in self.list() if w.pool == pool
                   and w.state in (WorkerState.ACTIVE, WorkerState.STARTING)])

    def how_it_ended(self, instance: str, pid: int | None) -> str | None:
        """How worker ``instance``'s process ``pid`` ended ("killed by SIGKILL", "out of memory:
        killed by the kernel's OOM killer", "exited with status 75"), when the fleet knows;
        None otherwise (``pid`` None: its last process, whichever it was).  For the reason a
        dead worker's jobs are recorded with, and a crash loop's."""
        return None

    @abc.abstractmethod
    def leave(self) -> None:
        """What becomes of the workers when the daemon exits (each fleet says in its own docs)."""

    def set_paused(self, workers: Iterable[WorkerInfo], paused: bool) -> None:
        """Tell ACTIVE workers to stop claiming (``paused``) or to claim again.  Nothing is killed.

        Idempotent: a worker (by pid) already told the same is not signalled again, so
        the controller may call this every tick to catch workers that became ready (or
        were restarted) since.
        """
        for worker in workers:
            if worker.state is not WorkerState.ACTIVE or not worker.pid:
                continue
            if self._told_paused.get(worker.pid) is paused:
                continue
            self._signal_pause(worker, paused)
            self._told_paused[worker.pid] = paused

    def _forget_pids(self, live: Iterable[int]) -> None:
        live = set(live)
        for pid in [pid for pid in self._told_paused if pid not in live]:
            del self._told_paused[pid]

    @abc.abstractmethod
    def _signal_pause(self, worker: WorkerInfo, paused: bool) -> None:
        """Send the pause (or resume) signal to one ACTIVE worker."""

    @abc.abstractmethod
    def forget(self, worker: WorkerInfo) -> None:
        """Acknowledge a FAILED worker (its leases were recovered) so ``list`` drops it."""

    def close(self) -> None:
        """Release the fleet's resources; running workers keep running."""
