"""A worker's settings: how it claims, how many jobs it runs at once, how long it may drain."""

from __future__ import annotations

import dataclasses
from typing import Mapping

from ..queue.limits import DependencyLimit, TenantCaps
from ..queue.owners import owner_name
from ..settings_schema import default


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """How one worker claims and drains.  ``name`` is its lease owner name (``host:instance:pid``).

    The defaults are a pool's left at its defaults (``flexiqd.settings_schema``).
    """

    queues: tuple[str, ...] = default("pools.<pool>.queues")
    concurrency: int = default("pools.<pool>.concurrency")
    lease_seconds: float = default("pools.<pool>.lease")
    drain_timeout: float = default("pools.<pool>.drain_timeout")
    idle_poll_min: float = 0.05
    idle_poll_max: float = 0.5
    # The most jobs claimed at once (None: as many as free slots).
    batch_size: int | None = default("pools.<pool>.batch_size")
    name: str = dataclasses.field(default_factory=lambda: owner_name("worker"))
    # The config's dependencies.<name>.limit: a job of a task that uses one starts only
    # once the store admits it (Backend.admit); dependencies not here are not limited.
    dependency_limits: Mapping[str, DependencyLimit] = dataclasses.field(default_factory=dict)
    # The config's tenants.<name>.max_running, passed with every claim (ClaimRequest.tenant_caps);
    # None (no config file): claims skip nothing and leave the store's caps as they are.
    tenant_caps: TenantCaps | None = None
    # The config's heartbeat: on a store shared by hosts, the leases follow it (queue.hosts).
    heartbeat: float = default("heartbeat")

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be positive, got {self.lease_seconds}")
        if self.heartbeat <= 0:
            raise ValueError(f"heartbeat must be positive, got {self.heartbeat}")
        if self.drain_timeout < 0:
            raise ValueError(f"drain_timeout must not be negative, got {self.drain_timeout}")
