"""The one mapping from a pool's config to the settings its workers run with.

``flexiq worker --instance <pool>-<n>`` takes its pool's settings from the
config file (``--config``, else ``$FLEXIQD_CONFIG`` -- the daemon points its
workers at the config it applied -- else the default path); flags given on the
command line override them.  The config's dependency limits
(``dependencies.<name>.limit``) reach every worker that reads the file: read
at its start, and again whenever the file changes (``LimitsReader``), so a
reload reaches workers already running; so do its tenant caps (``tenants``,
``TenantCapsReader``).  At the start of a drain the worker reads its
pool's ``drain_timeout`` again (``drain_timeout_now``), so a budget changed by a
reload reaches workers already running.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Mapping

from ..config.load import load_config
from ..config.model import DEFAULT_CONFIG_PATH, PoolConfig
from ..errors import ConfigError, FlexiqdError
from ..fleet.base import parse_instance
from ..queue.limits import DependencyLimit, TenantCaps
from ..queue.owners import owner_name
from ..queue.url import URL_ENV
from ..settings_schema import default
from .settings import WorkerConfig

log = logging.getLogger(__name__)

CONFIG_ENV = "FLEXIQD_CONFIG"
# A worker started with --app alone: the settings of a pool left at its defaults.
DEFAULT_SETTINGS: Mapping[str, Any] = {
    "queues": default("pools.<pool>.queues"), "concurrency": default("pools.<pool>.concurrency"),
    "lease_seconds": default("pools.<pool>.lease"), "drain_timeout": default("pools.<pool>.drain_timeout"),
    "batch_size": default("pools.<pool>.batch_size")}


@dataclasses.dataclass(frozen=True)
class WorkerSetup:
    """Everything a worker process needs to start: what to run, where, and how."""

    app: str
    store_url: str | None       # None: the app's own (``Queue(url)``, else the packaged default)
    config: WorkerConfig
    pool: str | None = None     # the pool it belongs to (--instance), for the paused-pools file
    config_path: str | None = None  # where a drain re-reads its budget (None: the budget is fixed)
    limits_path: str | None = None  # where the dependency limits are re-read (None: none, fixed)


def pool_settings(pool: PoolConfig) -> dict[str, Any]:
    """The ``WorkerConfig`` fields of a worker of ``pool``."""
    return {"queues": tuple(pool.queues), "concurrency": pool.concurrency, "lease_seconds": pool.lease,
            "drain_timeout": pool.drain_timeout, "batch_size": pool.batch_size}


def config_path(given: str | None) -> str:
    return given or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH


def pool_of_instance(instance: str, path: str) -> tuple[PoolConfig, str]:
    """The pool worker ``<pool>-<n>`` belongs to, and the store, from the config file at ``path``."""
    parsed = parse_instance(instance)
    if parsed is None:
        raise FlexiqdError(f"worker: --instance {instance!r} is not <pool>-<n>, as in default-3")
    config = load_config(path, policies=False)
    pool = config.pools.get(parsed[0])
    if pool is None:
        raise FlexiqdError(f"worker {instance}: {path} has no pool {parsed[0]!r} "
                           f"(pools: {', '.join(sorted(config.pools)) or 'none'})")
    return pool, config.store


def worker_setup(*, app: str | None, url: str | None, instance: str | None, config: str | None,
                 overrides: Mapping[str, Any]) -> WorkerSetup:
    """A worker's setup from its command line: ``overrides`` are the flags given (None: not given).

    Without ``app``, ``instance`` names the pool whose settings (and app, and store)
    the config file holds.
    """
    settings = dict(DEFAULT_SETTINGS)
    parsed = parse_instance(instance) if instance else None
    pool_name = parsed[0] if parsed else None
    path = None
    if app is None:
        if not instance:
            raise FlexiqdError("worker: give --app module:attribute, or --instance <pool>-<n> to take "
                               "the pool's settings from the config file")
        path = config_path(config)
        pool, store = pool_of_instance(instance, path)
        app, url, pool_name = pool.app, url or store, pool.name
        settings.update(pool_settings(pool))
    elif config or os.environ.get(CONFIG_ENV):
        path = config_path(config)  # --app given: the file is asked for the limits (and, with
        # --instance, for the pool's drain budget)
    if url is None:
        # --app without --url: $FLEXIQ_URL (how a fleet without a config file names the
        # store), else the application's own Queue(url).
        url = os.environ.get(URL_ENV) or None
    limits_path = path
    if instance is None:
        path = None  # no pool to read a drain budget for
    if limits_path is not None:
        # Not optional: a worker that ran without them could push a dependency past its quota.
        loaded = load_config(limits_path, policies=False)
        settings["dependency_limits"] = loaded.dependency_limits
        settings["tenant_caps"] = loaded.tenant_caps
        settings["heartbeat"] = loaded.heartbeat  # the lease timing on a store shared by hosts
    given = {key: value for key, value in overrides.items() if value is not None}
    settings.update(given)
    if "drain_timeout" in given:
        path = None  # a budget given on the command line is not the file's to change
    name = owner_name(instance or "worker")
    return WorkerSetup(app=app, store_url=url, config=WorkerConfig(name=name, **settings),
                       pool=pool_name, config_path=path, limits_path=limits_path)


class _ConfigPartReader:
    """One part of the config file now: read again only when the file changed.

    A file that cannot be read or is invalid keeps the part last read (with a
    warning): a bad edit must not lift every limit.  Not thread-safe.
    """

    what = "settings"

    def __init__(self, setup: WorkerSetup, initial: Any) -> None:
        self._setup = setup
        self._path = setup.limits_path
        self._value = initial
        self._seen = self._signature()

    def _signature(self) -> tuple[int, int] | None:
        try:
            stat = os.stat(self._path) if self._path else None
        except OSError:
            return None
        return (stat.st_mtime_ns, stat.st_size) if stat else None

    def _pick(self, config: Any) -> Any:
        raise NotImplementedError

    def _describe(self, value: Any) -> str:
        return ", ".join(sorted(value)) or "none"

    def __call__(self) -> Any:
        if self._path is None:
            return self._value
        signature = self._signature()
        if signature == self._seen:
            return self._value
        self._seen = signature
        try:
            value = self._pick(load_config(self._path, policies=False))
        except ConfigError as exc:
            log.warning("Worker %s keeps its %s: %s", self._setup.config.name, self.what, exc)
            return self._value
        if value != self._value:
            log.info("Worker %s now enforces the %s of %s: %s.", self._setup.config.name, self.what,
                     self._path, self._describe(value))
        self._value = value
        return value


class LimitsReader(_ConfigPartReader):
    """The config file's dependency limits now (see ``_ConfigPartReader``)."""

    what = "dependency limits"

    def __init__(self, setup: WorkerSetup) -> None:
        super().__init__(setup, setup.config.dependency_limits)

    def _pick(self, config: Any) -> Mapping[str, DependencyLimit]:
        return config.dependency_limits


class TenantCapsReader(_ConfigPartReader):
    """The config file's tenant caps now (see ``_ConfigPartReader``); None for a worker
    without a config file, whose claims leave the store's caps as they are."""

    what = "tenant caps"

    def __init__(self, setup: WorkerSetup) -> None:
        super().__init__(setup, setup.config.tenant_caps)

    def _pick(self, config: Any) -> TenantCaps:
        return config.tenant_caps

    def _describe(self, value: TenantCaps) -> str:
        return ", ".join(f"{tenant} {cap}" for tenant, cap in sorted(value.max_running.items())) or "none"


def drain_timeout_now(setup: WorkerSetup) -> float:
    """The pool's drain budget in the config file now; the worker's own when it cannot tell."""
    if setup.config_path is None or setup.pool is None:
        return setup.config.drain_timeout
    try:
        pool = load_config(setup.config_path, policies=False).pools.get(setup.pool)
    except ConfigError as exc:
        log.warning("Worker %s keeps its drain budget of %gs: %s", setup.config.name,
                    setup.config.drain_timeout, exc)
        return setup.config.drain_timeout
    return pool.drain_timeout if pool is not None else setup.config.drain_timeout
