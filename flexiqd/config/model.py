"""The daemon's configuration as validated values (built by ``flexiqd.config.load``)."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Mapping

from ..fleet.base import Credential, WorkerSpec
from ..queue.limits import DependencyLimit, TenantCaps
from ..queue.types import NewJob
from ..schedules.words import CatchUp
from ..settings_schema import default, listen_default

if TYPE_CHECKING:  # the decision code is loaded by who decides, not by a worker reading its pool
    from ..schedules.calendar import Calendar
    from ..policy.config import Dependency, PoolPolicy
    from ..policy.fleet import PoolInput
    from ..policy.types import History, Observation

DEFAULT_CONFIG_PATH = "/etc/flexiqd/flexiqd.yaml"
DEFAULT_STORE = default("store")


@dataclasses.dataclass(frozen=True)
class FlexiqOptions:
    """The flexiq autoscaler's options, for pools run with ``policy: flexiq``."""

    target_queue_depth_per_worker: int = default("pools.<pool>.flexiq.target_queue_depth_per_worker")
    target_utilisation: float = default("pools.<pool>.flexiq.target_utilisation")
    tolerance: float = default("pools.<pool>.flexiq.tolerance")
    scale_up_window: float = default("pools.<pool>.flexiq.scale_up_window")
    scale_down_window: float = default("pools.<pool>.flexiq.scale_down_window")


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    """One pool: what its workers run and how many of them there should be."""

    name: str
    app: str
    queues: tuple[str, ...]
    concurrency: int
    drain_timeout: float
    lease: float
    policy_kind: str                    # "flexiqd" or "flexiq"
    policy: PoolPolicy                  # None in a worker's reading (load_config(policies=False))
    flexiq: FlexiqOptions
    environment: Mapping[str, str]
    memory_max: int | None
    cpu_weight: int | None
    batch_size: int | None = None
    credentials: tuple[Credential, ...] = ()
    python: str | None = None           # the workers' interpreter; None: the system's
    unit_settings: tuple[tuple[str, str], ...] = ()   # more [Service] lines of its worker units

    def decision_input(self, observation: Observation, history: History | None,
                       fleet_grants: Mapping[str, int] | None = None, stopping: int = 0) -> PoolInput:
        """This pool's arguments to ``policy.decide_fleet`` (``stopping``: its workers asked to
        stop whose processes have not exited yet)."""
        from ..policy.fleet import PoolInput

        return PoolInput(observation=observation, policy=self.policy, history=history, kind=self.policy_kind,
                         flexiq=self.flexiq, fleet_grants=fleet_grants, stopping=stopping)

    def worker_spec(self, store_url: str) -> WorkerSpec:
        return WorkerSpec(pool=self.name, app=self.app, queues=self.queues,
                          concurrency=self.concurrency, drain_timeout=self.drain_timeout,
                          lease_seconds=self.lease, store_url=store_url,
                          environment=dict(self.environment), memory_max=self.memory_max,
                          cpu_weight=self.cpu_weight, batch_size=self.batch_size,
                          credentials=self.credentials, python=self.python,
                          unit_settings=self.unit_settings,
                          ready_ahead=self.policy.max_workers if self.policy is not None else 0)


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    """One periodic job (``schedules.<name>``): the job it enqueues and when (docs/schedules.md)."""

    name: str
    task: str
    cron: str
    timezone: str
    calendar: Calendar = dataclasses.field(compare=False, repr=False)
    args: tuple = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    queue: str = default("schedules.<name>.queue")
    priority: int = default("schedules.<name>.priority")
    max_attempts: int = default("schedules.<name>.max_attempts")
    timeout: float | None = default("schedules.<name>.timeout")
    tenant: str | None = default("schedules.<name>.tenant")
    catch_up: CatchUp = CatchUp()

    def new_job(self, slot: float | None = None) -> NewJob:
        """The job of one firing: of the slot at ``slot`` (its idempotency key names the slot,
        ``schedule:<name>:<slot in UTC>``), or of a run outside the slots (no key)."""
        return NewJob(task=self.task, payload={"args": list(self.args), "kwargs": dict(self.kwargs)},
                      queue=self.queue, priority=self.priority, max_attempts=self.max_attempts,
                      timeout=self.timeout, tenant=self.tenant,
                      idempotency_key=slot_key(self.name, slot) if slot is not None else None)


def slot_key(schedule: str, slot: float) -> str:
    """The idempotency key of a slot's job: ``schedule:nightly:2026-03-08T07:00:00Z``."""
    return f"schedule:{schedule}:{datetime.fromtimestamp(slot, timezone.utc):%Y-%m-%dT%H:%M:%SZ}"


# Where flexiqd serves /metrics and /api/scaler unless told otherwise: loopback, on a port
# outside the 9100-9999 range of Prometheus's port allocations, which is fully taken
# (docs/metrics.md).
DEFAULT_HTTP_HOST, DEFAULT_HTTP_PORT = listen_default()


@dataclasses.dataclass(frozen=True)
class HttpConfig:
    """The HTTP endpoint: /metrics, /api/scaler and /health."""

    host: str = DEFAULT_HTTP_HOST
    port: int = DEFAULT_HTTP_PORT
    token_file: str | None = default("http.token_file")        # a bearer token, required off loopback
    allow_remote: bool = default("http.allow_remote")          # must be said to bind a non-loopback address
    scaler_target: int = default("http.scaler_target")         # KEDA's targetValue: jobs per replica


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
    """``dependencies.<name>.probe``: a request the daemon times every tick (``daemon.probes``).

    ``kind``: postgresql, tcp or http; ``target``: the URL or ``host:port`` as written (a
    postgresql URL may hold a password: show ``shown``, never ``target``)."""

    dependency: str
    kind: str
    target: str
    statement: str = default("dependencies.<name>.probe.statement")
    timeout: float = default("dependencies.<name>.probe.timeout")
    factor: float = default("dependencies.<name>.probe.factor")

    @property
    def shown(self) -> str:
        """The target with any password hidden: what messages and the status show."""
        from ..queue.url import safe_url

        return self.target if self.kind == "tcp" else safe_url(self.target)


@dataclasses.dataclass(frozen=True)
class DaemonConfig:
    """The whole file."""

    path: str
    store: str
    tick: float
    fleet: str                          # "systemd" or "process"
    dependencies: Mapping[str, Dependency]
    pools: Mapping[str, PoolConfig]
    retention: float = default("retention")            # finished (done, cancelled) jobs are kept this long
    dead_retention: float = default("dead_retention")  # dead-lettered jobs are kept this long
    http: HttpConfig | None = None        # None: no HTTP endpoint
    source: str = dataclasses.field(default="", repr=False)  # the file's text, as validated
    # dependencies.<name>.limit: enforced by the workers of every pool (flexiqd.queue.limits)
    dependency_limits: Mapping[str, DependencyLimit] = dataclasses.field(default_factory=dict)
    # tenants.<name>.max_running: enforced by the claims of every worker (flexiqd.queue.limits)
    tenant_caps: TenantCaps = dataclasses.field(default_factory=TenantCaps)
    # Hosts sharing the store: each daemon beats this often (flexiqd.queue.hosts).
    heartbeat: float = default("heartbeat")
    # dependencies.<name>.global: the capacity is the whole fleet's, shared between live hosts.
    global_dependencies: frozenset[str] = frozenset()
    # pools.<name>.max_workers: {count: N, global: true}: N for the whole fleet, not per host.
    global_max_workers: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # dependencies.<name>.probe: timed every tick (daemon.probes); the pools that use it heed it.
    probes: Mapping[str, ProbeConfig] = dataclasses.field(default_factory=dict)
    # schedules.<name>: periodic jobs, by name (none in a worker's reading).
    schedules: Mapping[str, ScheduleConfig] = dataclasses.field(default_factory=dict)
