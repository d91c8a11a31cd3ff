"""Every setting of flexiqd, defined once: key, type, unit, default and the sentence that documents it.

The config loader (``config.load``) and its model, the policy's dataclasses
(``policy.config``, ``policy.flexiq_compat``), a worker's settings
(``worker.settings_reader``, ``worker.settings``), ``flexiqd.autoscale.AutoscaleConfig`` and
the ``flexiq worker`` / ``flexiq autoscale`` / ``flexiq scaler`` options read their
defaults here, never from a literal of their own.  What cannot read them at run
time -- the shipped ``units/flexiqd.yaml`` and the flexiqd.yaml(5) page made from
it, the worker unit's ``TimeoutStopSec``, the docs that state a default, the
store's own copies -- is checked against this module by
``tests/unit/test_settings_schema.py``.

A key is the setting's path in the config file; ``<pool>`` and ``<name>`` stand
for any pool's, dependency's, tenant's or credential's name.  A duration's default
is in seconds.  A default of None means unset (the sentence says what that does);
``REQUIRED``, that the key must be given wherever its parent is.

Standard library only, and data only: every worker imports it at start-up, and
``fleet/`` and ``policy/`` read it without reaching up into ``config/``.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Mapping


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclasses.dataclass(frozen=True)
class Setting:
    """One key of the config file (or one option of ``flexiq autoscale`` of its own)."""

    key: str
    type: str                 # as the file writes it: duration, whole number, number, ...
    default: Any              # None: unset; REQUIRED: must be given
    doc: str                  # one sentence
    unit: str = ""            # what a number counts ("s" for every duration)
    choices: tuple[str, ...] = ()


def _frozen(value: Any) -> Any:
    """A mapping default read-only, so no reader can change what the next one gets."""
    if isinstance(value, dict):
        return types.MappingProxyType({key: _frozen(item) for key, item in value.items()})
    return value


def _s(key: str, type: str, default: Any, doc: str, unit: str = "", choices: tuple[str, ...] = ()) -> Setting:
    return Setting(key, type, _frozen(default), doc, "s" if type == "duration" else unit, choices)


_RATE_LIMIT = "{workers, percent, period}"

# The config file, in the order the loader names its keys (its "known: ..." lists).
SETTINGS: tuple[Setting, ...] = (
    _s("store", "store URL", "sqlite:////var/lib/flexiq/queue.db",
       "The job store: sqlite:///path on one machine, or postgresql://... shared by many machines."),
    _s("tick", "duration", 1.0,
       "How often every pool is sized, at the latest: new work, a delayed job coming due and a worker's "
       "change are decided on as they happen."),
    _s("heartbeat", "duration", 2.0,
       "How often each flexiqd records on a store shared by machines that its machine is alive."),
    _s("fleet", "choice", "systemd",
       "Where workers run: systemd units, or child processes on machines without systemd.",
       choices=("systemd", "process")),
    _s("retention", "duration", 7 * 86400.0, "How long finished jobs (done, cancelled) stay in the store."),
    _s("dead_retention", "duration", 30 * 86400.0, "How long dead-lettered jobs stay in the store."),
    _s("dependencies", "mapping", {}, "Shared dependencies (a database, an API) by name, with their capacity."),
    _s("dependencies.<name>.capacity", "number", REQUIRED,
       "What the dependency can serve, in its own unit.", unit="connections or requests/s"),
    _s("dependencies.<name>.reserved", "number", 0.0,
       "The part of the capacity kept for users outside the pools (the request path).",
       unit="connections or requests/s"),
    _s("dependencies.<name>.start_burst", "whole number", 8,
       "At most this many workers of the dependency's users start (and connect) at once.", unit="workers"),
    _s("dependencies.<name>.limit", "mapping", None,
       "A limit the workers enforce on the jobs of tasks that use the dependency (none: unlimited)."),
    _s("dependencies.<name>.limit.concurrency", "whole number", None,
       "At most this many jobs inside the dependency at once (none: no such bound).", unit="jobs"),
    _s("dependencies.<name>.limit.rate", "number", None,
       "At most this many job starts per second (none: no such bound).", unit="starts/s"),
    _s("dependencies.<name>.limit.burst", "whole number", None,
       "Starts allowed at once after a quiet spell (none: the rate rounded up).", unit="starts"),
    _s("dependencies.<name>.global", "boolean", False,
       "The capacity is the whole fleet's (every machine on the store), shared between the machines."),
    _s("dependencies.<name>.probe", "mapping", None,
       "A request the daemon times every tick on the dependency (one of postgresql, tcp, http): a rise "
       "of its latency as workers are added holds the pools that use it (none: no probe)."),
    _s("dependencies.<name>.probe.postgresql", "store URL", None,
       "Run statement on this PostgreSQL URL (its password from the URL, password_file or "
       "password_credential, as for the store)."),
    _s("dependencies.<name>.probe.statement", "text", "SELECT 1",
       "The statement a postgresql probe runs."),
    _s("dependencies.<name>.probe.tcp", "host:port", None, "Time a TCP connect to this address."),
    _s("dependencies.<name>.probe.http", "URL", None,
       "Time an HTTP GET of this http:// or https:// URL (an answer of 400 or more is a failure)."),
    _s("dependencies.<name>.probe.timeout", "duration", 1.0,
       "A probe not answered within this is a failure: no information, neither load nor calm."),
    _s("dependencies.<name>.probe.factor", "number", 5.0,
       "A latency above this many times its unloaded baseline (and 10 ms over it) is a rise.",
       unit="x baseline"),
    _s("tenants", "mapping", {}, "Caps on the jobs of one tenant running at once (\"*\": every other tenant)."),
    _s("tenants.<name>.max_running", "whole number", REQUIRED,
       "At most this many jobs of the tenant run at once, across every worker on the store.", unit="jobs"),
    _s("pools", "mapping", {"default": {}},
       "The pools of workers by name (a-z, 0-9, _); none: one pool, default, with every default."),
    _s("pools.<pool>.app", "module:attribute", "flexiqd.demo:queue",
       "The application: module:attribute of its flexiqd.Queue."),
    _s("pools.<pool>.python", "path", None,
       "The workers' Python: a virtual environment's bin/python, made with --system-site-packages so that "
       "flexiqd itself is found (none: the system's python3)."),
    _s("pools.<pool>.queues", "list of queue names", ("default",),
       "The queues the pool's workers claim from, in order of preference."),
    _s("pools.<pool>.concurrency", "whole number", 4, "Jobs one worker runs at once.", unit="jobs"),
    _s("pools.<pool>.batch_size", "whole number", None,
       "The most jobs a worker claims in one go (none: as many as it has free slots).", unit="jobs"),
    _s("pools.<pool>.drain_timeout", "duration", 30.0,
       "How long a stopped worker lets its running jobs finish before it releases them."),
    _s("pools.<pool>.lease", "duration", 30.0,
       "A running job's lease, renewed while it runs: a dead worker's jobs are free again after it at the latest."),
    _s("pools.<pool>.policy", "choice", "flexiqd",
       "The scaling policy: flexiqd's own, or the flexiq autoscaler's formula (options under flexiq).",
       choices=("flexiqd", "flexiq")),
    _s("pools.<pool>.environment", "mapping", {},
       "Variables for the workers' environment (readable by every local user: not for secrets)."),
    _s("pools.<pool>.unit_settings", "mapping", {},
       "More [Service] settings for the pool's worker units, as systemd spells them (ReadWritePaths: "
       "/srv/reports): what the workers' sandbox forbids, granted to this pool alone."),
    _s("pools.<pool>.credentials", "mapping", {},
       "Secrets for the workers as systemd credentials: name to a file, or to {encrypted: file}."),
    _s("pools.<pool>.credentials.<name>.encrypted", "path", None,
       "A file made by systemd-creds encrypt (LoadCredentialEncrypted=), in place of a plain file."),
    _s("pools.<pool>.resources", "section", {}, "The cgroup limits of each worker unit."),
    _s("pools.<pool>.resources.memory_max", "size", None,
       "The most memory one worker unit may use (MemoryMax=; none: no limit).", unit="bytes"),
    _s("pools.<pool>.resources.cpu_weight", "whole number", None,
       "The worker units' CPU weight, 1 to 10000 (CPUWeight=; none: systemd's default)."),
    _s("pools.<pool>.min_workers", "whole number", 1,
       "The fewest workers the pool runs (at least 1 unless scale_to_zero).", unit="workers"),
    _s("pools.<pool>.max_workers", "whole number, or {count: N, global: true} for the whole fleet", 10,
       "The most workers the pool runs on this machine, stopping ones included (each counts until "
       "its process has exited).", unit="workers"),
    _s("pools.<pool>.scale_to_zero", "boolean", False,
       "Let a pool go down to min_workers even when that is 0: when idle and, without drain_time, "
       "between jobs while a worker started later still starts every waiting job within the age target."),
    _s("pools.<pool>.cpu_bound", "boolean", False, "Use the workers' CPU as a signal too (CPU-bound jobs only)."),
    _s("pools.<pool>.targets", "section", {}, "What the pool aims for; each target feeds one signal."),
    _s("pools.<pool>.targets.age", "duration", 30.0,
       "How long the oldest runnable job may wait: the goal every other setting serves."),
    _s("pools.<pool>.targets.drain_time", "duration", None,
       "How soon the runnable backlog should drain (none: the age target alone sizes a backlog, and the "
       "pool may run up to one worker short of what its arrivals need while every job still starts "
       "within it)."),
    _s("pools.<pool>.targets.depth_per_worker", "number", None,
       "Runnable jobs per worker (none: off, since depth alone ignores how long jobs take).", unit="jobs"),
    _s("pools.<pool>.targets.utilisation", "number", 0.9,
       "Busy slots / slots (without drain_time, a pool runs busier where fewer workers keep the age "
       "target).", unit="fraction"),
    _s("pools.<pool>.targets.cpu", "number", 0.9,
       "Mean CPU of the active workers (cpu_bound pools only).", unit="fraction of a core"),
    _s("pools.<pool>.targets.lead_time", "duration", None,
       "How long a new worker takes to claim its first job (none: the start cost plus one tick, "
       "at most half the age target)."),
    _s("pools.<pool>.behavior", "section", {}, "How fast the worker count may follow the signals."),
    _s("pools.<pool>.behavior.up_window", "duration", 0.0,
       "Scale up only when every recommendation of this window agrees."),
    _s("pools.<pool>.behavior.start_cost", "duration", 1.0, "What a worker's start costs until one is measured."),
    _s("pools.<pool>.behavior.down_window", "duration", None,
       "Scale down only to the highest recommendation of this window (none: give an idle worker back "
       "once holding it has cost as much as starting one again)."),
    _s("pools.<pool>.behavior.tolerance", "number", 0.1,
       "No change while |wanted / current - 1| is at most this (growth up to a cap that holds the wish "
       "down is always taken).", unit="fraction"),
    _s("pools.<pool>.behavior.up_limit", _RATE_LIMIT, {"workers": 4, "percent": 100.0, "period": 15.0},
       "At most this many workers or percent more per period, whichever is larger, for the noisy signals "
       "(null: unlimited)."),
    _s("pools.<pool>.behavior.up_limit.workers", "whole number", REQUIRED, "Workers per period.", unit="workers"),
    _s("pools.<pool>.behavior.up_limit.percent", "number", REQUIRED, "Percent per period.", unit="%"),
    _s("pools.<pool>.behavior.up_limit.period", "duration", REQUIRED, "The period."),
    _s("pools.<pool>.behavior.down_limit", _RATE_LIMIT, {"workers": 0, "percent": 100.0, "period": 15.0},
       "At most this many workers or percent fewer per period, whichever is larger (null: unlimited)."),
    _s("pools.<pool>.behavior.down_limit.workers", "whole number", REQUIRED, "Workers per period.", unit="workers"),
    _s("pools.<pool>.behavior.down_limit.percent", "number", REQUIRED, "Percent per period.", unit="%"),
    _s("pools.<pool>.behavior.down_limit.period", "duration", REQUIRED, "The period."),
    _s("pools.<pool>.knee", "section", {}, "Ceiling discovery: stop adding workers that add no throughput."),
    _s("pools.<pool>.knee.enabled", "boolean", True, "Look for the knee at all."),
    _s("pools.<pool>.knee.min_throughput_gain", "number", 0.05,
       "More workers must complete at least this much more than fewer did.", unit="fraction"),
    _s("pools.<pool>.knee.max_duration_rise", "number", 0.2,
       "Not used: a rise of durations alone never decides a ceiling, completions do (accepted so that older files load).",
       unit="fraction"),
    _s("pools.<pool>.knee.settle_time", "duration", 60.0,
       "While the oldest job is late, the knee is re-probed after twice this (at most the age target) instead of "
       "reprobe_interval, and twice as long after each re-probe that confirms it (at most reprobe_interval)."),
    _s("pools.<pool>.knee.reprobe_interval", "duration", 300.0,
       "After this long at the knee, more workers are tried again."),
    _s("pools.<pool>.knee.sample_max_age", "duration", 900.0, "Samples older than this are not compared."),
    _s("pools.<pool>.uses", "mapping", {},
       "The dependencies (declared under dependencies) one worker of this pool uses, by name."),
    _s("pools.<pool>.uses.<name>.per_worker", "number", REQUIRED,
       "How much of the dependency one worker uses, in the dependency's unit."),
    _s("pools.<pool>.uses.<name>.weight", "number", 1.0, "The pool's share when pools compete for the dependency."),
    _s("pools.<pool>.uses.<name>.max_latency", "duration", None,
       "No more workers while the p95 time jobs held the dependency is above this "
       "(a dependency with a limit only; none: no such bound)."),
    _s("pools.<pool>.pressure", "mapping", None,
       "Hold the pool while its workers' cgroup pressure (PSI some: the share of time stalled) is at or above these "
       "percentages (fleet: systemd only; none: pressure is not heeded)."),
    _s("pools.<pool>.pressure.cpu", "number", None,
       "The workers' CPU pressure that holds the pool (none: not heeded).", unit="%"),
    _s("pools.<pool>.pressure.io", "number", None,
       "The workers' I/O pressure that holds the pool (none: not heeded).", unit="%"),
    _s("pools.<pool>.pressure.memory", "number", None,
       "The workers' memory pressure that holds the pool (none: not heeded).", unit="%"),
    # flexiq 2.1's defaults, for pools run with `policy: flexiq`.
    _s("pools.<pool>.flexiq", "section", {}, "The flexiq autoscaler's options, for policy: flexiq."),
    _s("pools.<pool>.flexiq.target_queue_depth_per_worker", "whole number", 15,
       "flexiq's formula: runnable jobs per worker.", unit="jobs"),
    _s("pools.<pool>.flexiq.target_utilisation", "number", 0.75,
       "flexiq's formula: busy slots / slots.", unit="fraction"),
    _s("pools.<pool>.flexiq.tolerance", "number", 0.1,
       "flexiq's formula: no change while the wanted count is within this fraction of the current.",
       unit="fraction"),
    _s("pools.<pool>.flexiq.scale_up_window", "duration", 0.0,
       "flexiq's window: scale up only when every count of this window wants it."),
    _s("pools.<pool>.flexiq.scale_down_window", "duration", 300.0,
       "flexiq's window: scale down only to the highest count of this window."),
    _s("schedules", "mapping", {},
       "Periodic jobs by name (a-z, A-Z, 0-9, _, . and -), each enqueued once per slot of its calendar "
       "by whichever daemon on the store decides the slot first (docs/schedules.md)."),
    _s("schedules.<name>.task", "task name", REQUIRED, "The task the job runs, as the application registers it."),
    _s("schedules.<name>.args", "list", (), "The task's positional arguments (JSON values)."),
    _s("schedules.<name>.kwargs", "mapping", {}, "The task's keyword arguments (JSON values)."),
    _s("schedules.<name>.queue", "queue name", "default", "The queue the job goes to."),
    _s("schedules.<name>.priority", "whole number", 0, "The job's priority: higher is claimed first."),
    _s("schedules.<name>.max_attempts", "whole number", 3,
       "Attempts before the job is dead-lettered.", unit="attempts"),
    _s("schedules.<name>.timeout", "duration", None, "How long one attempt may run (none: no limit)."),
    _s("schedules.<name>.tenant", "tenant name", None, "The job's tenant, for tenant caps (none: no tenant)."),
    _s("schedules.<name>.cron", "cron expression", REQUIRED,
       "When: minute hour day-of-month month day-of-week, and optionally seconds as a sixth field, "
       "matched against the wall clock of timezone."),
    _s("schedules.<name>.timezone", "IANA time zone", "UTC",
       "The zone whose wall clock the cron expression is matched in (Europe/Berlin, America/New_York, UTC)."),
    _s("schedules.<name>.catch_up", "choice", "latest",
       "What fires of the slots missed by more than max_delay: none, the newest of them, or all of them "
       "(at most a week back).", choices=("none", "latest", "all")),
    _s("schedules.<name>.max_delay", "duration", 300.0,
       "A slot decided at most this late fires whatever catch_up says; a later one is missed."),
    _s("schedules.<name>.overlap", "choice", "allow",
       "skip: a slot is skipped while the job of the slot before it is still queued or running.",
       choices=("allow", "skip")),
    _s("http", "section", None, "The HTTP endpoint: /metrics, /api/scaler and /health (none: off)."),
    _s("http.listen", "host:port", "127.0.0.1:8739",
       "Where to serve: an IP address or localhost, and a port outside Prometheus's exporter range."),
    _s("http.token_file", "path", None,
       "A root-owned file holding the bearer token clients must send (required off loopback)."),
    _s("http.allow_remote", "boolean", False, "Allow listening on an address that is not loopback."),
    _s("http.scaler_target", "whole number", 15,
       "The targetValue /api/scaler answers: jobs (runnable and running) per replica.", unit="jobs"),
)

# `flexiq autoscale` and flexiqd.autoscale.AutoscaleConfig (flexiq 2.1's autoscaler interface):
# the settings of their own, with flexiq's defaults where they differ from a pool's.
AUTOSCALE_SETTINGS: tuple[Setting, ...] = (
    _s("autoscale.poll_interval", "duration", 5.0,
       "How often the pool is sized (flexiq's poll interval; the config file's tick)."),
    _s("autoscale.policy", "choice", "flexiq",
       "flexiq's formula or flexiqd's age/drain-time policy.", choices=("flexiq", "flexiqd")),
    _s("autoscale.fleet", "choice", "process",
       "Where the workers run: child processes or systemd units.", choices=("process", "systemd")),
    _s("autoscale.pool", "pool name", "autoscale", "The pool's name (unit names use it)."),
)

# Each AutoscaleConfig field (and `flexiq autoscale` option): the setting it is.
AUTOSCALE_FIELDS: Mapping[str, str] = {
    "min_workers": "pools.<pool>.min_workers",
    "max_workers": "pools.<pool>.max_workers",
    "target_queue_depth_per_worker": "pools.<pool>.flexiq.target_queue_depth_per_worker",
    "target_utilisation": "pools.<pool>.flexiq.target_utilisation",
    "scale_up_window": "pools.<pool>.flexiq.scale_up_window",
    "scale_down_window": "pools.<pool>.flexiq.scale_down_window",
    "tolerance": "pools.<pool>.flexiq.tolerance",
    "poll_interval": "autoscale.poll_interval",
    "drain_timeout": "pools.<pool>.drain_timeout",
    "concurrency": "pools.<pool>.concurrency",
    "queues": "pools.<pool>.queues",
    "batch_size": "pools.<pool>.batch_size",
    "policy": "autoscale.policy",
    "target_age": "pools.<pool>.targets.age",
    "target_drain_time": "pools.<pool>.targets.drain_time",
    "scale_to_zero": "pools.<pool>.scale_to_zero",
    "cpu_bound": "pools.<pool>.cpu_bound",
    "fleet": "autoscale.fleet",
    "pool": "autoscale.pool",
}

BY_KEY: Mapping[str, Setting] = {s.key: s for s in SETTINGS + AUTOSCALE_SETTINGS}


def autoscale_default(field: str) -> Any:
    """The default of AutoscaleConfig's ``field`` (and of its ``flexiq autoscale`` option)."""
    return BY_KEY[AUTOSCALE_FIELDS[field]].default


def setting(key: str) -> Setting:
    """The setting at ``key`` (``pools.<pool>.drain_timeout``); KeyError for a key that is not one."""
    return BY_KEY[key]


def default(key: str) -> Any:
    """The default of the setting at ``key``: what an unset key means."""
    return BY_KEY[key].default


def listen_default() -> tuple[str, int]:
    """The host and port of ``http.listen``'s default."""
    host, _, port = BY_KEY["http.listen"].default.rpartition(":")
    return host, int(port)


def children(key: str) -> tuple[str, ...]:
    """The names of the keys right under ``key`` ("" for the top), in the schema's order."""
    prefix = f"{key}." if key else ""
    names: list[str] = []
    for s in SETTINGS:
        if s.key.startswith(prefix):
            name = s.key[len(prefix):].split(".", 1)[0]
            if name not in names:
                names.append(name)
    return tuple(names)


# Where a name of the user's own stands in a path: pools.<pool>, dependencies.<name>, ...
_NAMED = {"pools": "<pool>", "dependencies": "<name>", "tenants": "<name>", "uses": "<name>",
          "environment": "<name>", "credentials": "<name>", "schedules": "<name>"}


def schema_key(path: str) -> str:
    """The schema's key for a concrete path: ``pools.default.drain_timeout`` -> ``pools.<pool>.drain_timeout``."""
    parts = path.split(".")
    for i in range(1, len(parts)):
        if parts[i - 1] in _NAMED:  # a name already replaced is no longer one of these
            parts[i] = _NAMED[parts[i - 1]]
    return ".".join(parts)


def format_seconds(seconds: float) -> str:
    """A duration as the config file writes it: ``30s``, ``5m``, ``7d``, ``250ms``."""
    for suffix, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{suffix}"
    return f"{seconds * 1000:g}ms" if 0 < seconds < 1 else f"{seconds:g}s"


def show_default(key: str) -> str:
    """The default of ``key`` as the config file (or a command line) writes it."""
    s = BY_KEY[key]
    value = s.default
    if s.type == "duration" and isinstance(value, (int, float)):
        return format_seconds(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


# -- The stop grace --------------------------------------------------------------------------
# A stopping worker is killed STOP_GRACE after its drain budget: systemd's TimeoutStopSec is
# drain_timeout + STOP_GRACE, and the process fleet waits as long.  The worker spends the
# grace in this order (flexiqd.worker.runtime), each step bounded by its part:
LAST_FLUSH_TIME = 3.0    # the drain's last commit of finished jobs' results, once the budget is spent
INTERRUPT_GRACE = 1.0    # interrupted tasks unwind; a job whose task still runs after it is abandoned
FINAL_SETTLE_TIME = 3.0  # keep trying to commit the last results: a result lost here is a job run again
EXIT_TIME = 2.0          # mark the abandoned jobs in the store, kill the tasks' processes, exit
KILL_MARGIN = 1.0        # spare: a worker that keeps every bound above is never killed
STOP_GRACE = LAST_FLUSH_TIME + INTERRUPT_GRACE + FINAL_SETTLE_TIME + EXIT_TIME + KILL_MARGIN
# While it drains, a worker promises systemd its next word (EXTEND_TIMEOUT_USEC) within this:
# it checks every second, and a check may wait on a slow store call.
PROGRESS_PROMISE = 2.0
