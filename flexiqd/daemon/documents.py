"""The documents flexiqd publishes: its status, each pool's, each scale event's.

Pure: built from the controller's published snapshot (``published.Published``) with the
time as an argument, and used by every surface that shows them (the D-Bus API's JSON
methods, the pool objects' typed properties -- dbus.pools.pool_properties reads this pool
document -- and whatever else reads the daemon's state).  The keys are documented in docs/dbus-api.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from .. import __version__

if TYPE_CHECKING:
    from ..config.model import DaemonConfig
    from .published import PoolView
    from .hosts import HostHeartbeat
    from .events import ScaleEvent
    from .overrides import Override
    from .schedules import ScheduleView
    from ..policy.types import KneeState
    from ..queue.types import DependencyStats


def pool_document(name: str, config: "DaemonConfig", view: "PoolView | None",
                  override: "Override | None") -> dict[str, Any]:
    """One pool's entry of the Status document (keys documented in docs/dbus-api.md)."""
    pool = config.pools[name]
    document: dict[str, Any] = {
        "name": name,
        "queues": list(pool.queues),
        "concurrency": pool.concurrency,
        "min_workers": pool.policy.min_workers,
        "max_workers": pool.policy.max_workers,
        "target_age": pool.policy.targets.age,
        "workers": None,
        "desired": None,
        "binding_cap": None,
        "binding_cap_workers": None,
        "start_cost": None,
        "metrics": None,
        "stats_error": None,
        "crash_loop": None,
        "app_problem": None,
        "restart": None,
        "utilisation": None,
        "decision": None,
        "ceiling": None,
        "evidence": [],
        "paused": bool(override and override.paused),
        "pinned": (None if override is None or override.pinned is None
                   else {"workers": override.pinned, "until": override.until}),
    }
    if view is None:
        return document  # configured by a reload and not sized yet
    document["workers"] = {"active": view.active, "starting": view.starting,
                           "draining": view.draining, "failed": view.failed}
    if view.start_cost is not None:
        document["start_cost"] = view.start_cost.as_dict()
    if view.decision is not None:
        document["desired"] = view.decision.desired
        cap = view.decision.binding_cap
        document["binding_cap"] = cap.cap if cap is not None else None
        document["binding_cap_workers"] = cap.workers if cap is not None else None
        document["decision"] = {"reason": view.decision.reason, "rationale": view.line}
        document["ceiling"] = ceiling_document(view.decision.history.knee)
        document["evidence"] = evidence_document(pool.policy.evidence, view.decision.history.evidence,
                                                 view.evidence_notes)
    document["stats_error"] = view.stats_error
    document["crash_loop"] = view.crash_loop.as_dict() if view.crash_loop is not None else None
    document["app_problem"] = view.app_problem
    document["restart"] = view.restart
    metrics = view.metrics
    if metrics is not None:
        document["metrics"] = {
            "runnable": metrics.runnable_depth,
            "delayed": sum(s.delayed for s in view.stats),
            "running": metrics.running,
            "oldest_runnable_age": metrics.oldest_runnable_age,
            "time_to_drain": metrics.time_to_drain,
            "arrival_rate": metrics.arrival_rate,
            "completion_rate": metrics.completion_rate,
            "duration_p50": metrics.duration_p50,
            "duration_p95": metrics.duration_p95,
            "duration_p99": metrics.duration_p99,
            "coming_due": metrics.coming_due,
            "coming_due_within": metrics.coming_due_within,
            "running_age_mean": metrics.running_age_mean,
            # Queued jobs more workers would not start sooner: their tenant is at its cap, or
            # a worker deferred them for a dependency at its limit.
            "held_by_tenant_cap": sum(s.held_by_tenant_cap for s in view.stats),
            "waiting_for_dependency": sum(s.waiting_for_dependency for s in view.stats),
        }
        slots = view.active * pool.concurrency
        # Busy slots of the active workers, as the policy's utilisation signal counts them.
        document["utilisation"] = metrics.running / slots if slots else None
    return document


def ceiling_document(knee: "KneeState") -> dict[str, Any] | None:
    """The ceiling measured for a pool (its knee): the count held at, what it completed, when that
    was found or confirmed, and the count above it that gave no more; None while none is known."""
    if knee.held_at is None:
        return None
    by_count = {sample.workers: sample for sample in knee.samples}
    held = by_count.get(knee.held_at)
    above = [sample for sample in knee.samples if sample.workers > knee.held_at]
    tried = max(above, key=lambda sample: sample.at) if above else None
    return {"workers": knee.held_at, "jobs_per_second": held.completion_rate if held else None,
            "since": knee.held_since,
            "above": None if tried is None else {"workers": tried.workers, "jobs_per_second": tried.completion_rate,
                                                 "at": tried.at}}


def evidence_document(rules, tracks, notes: Mapping[str, str]) -> list[dict[str, Any]]:
    """Each source of direct evidence the pool heeds (policy.evidence): its last reading (None:
    no information, ``note`` says why), the level judged (median of the recent readings), a
    probe's baseline, the bound above which it holds the pool, and the count it holds at."""
    from ..policy.evidence import baseline, bound, level

    by_source = {track.source: track for track in tracks}
    documents = []
    for rule in rules:
        track = by_source.get(rule.source)
        note = notes.get(rule.source)
        documents.append({
            "source": rule.source,
            "threshold": rule.threshold,
            "reading": track.recent[-1] if track is not None and track.recent and note is None else None,
            "note": note,
            "level": level(track) if track is not None else None,
            "baseline": baseline(track) if track is not None and rule.source.startswith("probe:") else None,
            "bound": bound(track, rule) if track is not None else None,
            "held_at": track.held_at if track is not None else None,
            "count_before": track.last_good if track is not None else None,
        })
    return documents


def dependency_use(config: "DaemonConfig", views: Mapping[str, "PoolView"]) -> dict[str, float]:
    """What the pools' workers (running, starting or draining) hold of each declared dependency,
    in its own unit."""
    use = {name: 0.0 for name in config.dependencies}
    for name, pool in config.pools.items():
        view = views.get(name)
        if view is None or pool.policy is None:
            continue
        workers = view.active + view.starting + view.draining
        for uses in pool.policy.dependencies:
            use[uses.dependency] = use.get(uses.dependency, 0.0) + workers * uses.per_worker
    return use


def dependencies_document(config: "DaemonConfig", views: Mapping[str, "PoolView"],
                          held: Mapping[str, "DependencyStats"]) -> list[dict[str, Any]]:
    """Each dependency declared (with a capacity) or limited: its capacity against what the pools'
    workers hold of it, and its limit against the jobs inside it and deferred for it (``held``:
    the store's figures of the limited ones, as the last tick read them)."""
    use = dependency_use(config, views)
    documents = []
    for name in sorted(set(config.dependencies) | set(config.dependency_limits)):
        declared = config.dependencies.get(name)
        limit = config.dependency_limits.get(name)
        figures = held.get(name)
        documents.append({
            "name": name,
            "capacity": declared.capacity if declared is not None else None,
            "reserved": declared.reserved if declared is not None else None,
            "use": use.get(name) if declared is not None else None,
            "limit": None if limit is None else {"concurrency": limit.concurrency, "rate": limit.rate},
            "in_use": figures.in_use if figures is not None else None,
            "waiting": figures.waiting if figures is not None else None,
        })
    return documents


def status_document(config: "DaemonConfig | None", config_path: str, config_error: str | None,
                    views: Mapping[str, "PoolView"], overrides: Mapping[str, "Override"],
                    now: float, hosts: Mapping[str, Any] | None = None,
                    held: Mapping[str, "DependencyStats"] | None = None,
                    schedules: Mapping[str, "ScheduleView"] | None = None,
                    counters: Any = None, store_problem: str | None = None,
                    fleet_problem: str | None = None) -> dict[str, Any]:
    """The whole Status document: the daemon, then every configured pool by name, the
    dependencies, then the fleet of hosts sharing the store (``hosts``: a ``hosts_document``;
    None when not known).  ``schedules``: the firing loop's views, for each pool's next fire.
    ``store_problem``: why the store takes no writes (its disk); ``fleet_problem``: why the
    workers could not be listed at the last tick (every pool is held)."""
    pools = {}
    if config is not None:
        for name in sorted(config.pools):
            pools[name] = pool_document(name, config, views.get(name), overrides.get(name))
            pools[name]["next_schedule"] = next_schedule(config.pools[name].queues, schedules or {})
    return {
        "version": __version__,
        "config_path": config_path,
        "config_error": config_error,
        "store_problem": store_problem,
        "fleet_problem": fleet_problem,
        "fleet": config.fleet if config is not None else None,
        "tick": config.tick if config is not None else None,
        "generated_at": now,
        "pools": pools,
        "dependencies": dependencies_document(config, views, held or {}) if config is not None else [],
        "hosts": hosts,
        "schedules": schedules_document(schedules or {}, config)["schedules"],
        "schedules_decided_here": counters.document() if counters is not None else None,
    }


def next_schedule(queues: "tuple[str, ...]", schedules: Mapping[str, "ScheduleView"]) -> dict[str, Any] | None:
    """The next fire of the schedules whose queue the pool serves: ``{"schedule", "at", "queue"}``
    (None: no such schedule, or none paused-free with a known next fire)."""
    upcoming = [(view.next_fire, name, view.config.queue) for name, view in schedules.items()
                if view.config.queue in queues and view.next_fire is not None
                and not (view.record is not None and view.record.paused)]
    if not upcoming:
        return None
    at, name, queue = min(upcoming)
    return {"schedule": name, "at": at, "queue": queue}


def schedules_document(schedules: Mapping[str, "ScheduleView"], config: "DaemonConfig | None",
                       counters: Any = None) -> dict[str, Any]:
    """The Schedules document (docs/dbus-api.md): each schedule's calendar, next fire, totals and
    last slot, by name; and what this daemon decided since it started (``counters``)."""
    pools = config.pools if config is not None else {}
    entries = {}
    for name, view in sorted(schedules.items()):
        schedule, record = view.config, view.record
        entries[name] = {
            "task": schedule.task, "queue": schedule.queue, "cron": schedule.cron, "timezone": schedule.timezone,
            "catch_up": schedule.catch_up.catch_up, "max_delay": schedule.catch_up.max_delay,
            "overlap": schedule.catch_up.overlap,
            "pools": sorted(pool for pool, entry in pools.items() if schedule.queue in entry.queues),
            "next_fire": view.next_fire,
            "paused": record.paused if record is not None else False,
            "fired": record.fired if record is not None else 0,
            "skipped": record.skipped if record is not None else 0,
            "since": record.since if record is not None else None,
            "last": _ledger_row(record.last) if record is not None else None,
            "last_run": _ledger_row(record.last_run) if record is not None else None,
        }
    document: dict[str, Any] = {"schedules": entries}
    if counters is not None:
        document["decided_here"] = counters.document()
    return document


def _ledger_row(row: Any) -> dict[str, Any] | None:
    if row is None:
        return None
    return {"slot": row.at, "outcome": row.outcome, "reason": row.reason, "slots": row.slots, "job_id": row.job_id,
            "job_state": row.job_state.value if row.job_state is not None else None, "decided_by": row.host,
            "decided_at": row.decided_at}


def hosts_document(heartbeat: "HostHeartbeat", capacities: Mapping[str, float], now: float) -> dict[str, Any]:
    """The hosts sharing the store and each global cap's use across them (docs/dbus-api.md).

    ``fleet_use``: what the live hosts' workers use (as each last reported);
    ``fleet_claimed``: what they claimed; ``share``: what this host was granted.
    """
    fleet = heartbeat.fleet()
    grants = heartbeat.grants(now)
    caps: dict[str, dict[str, Any]] = {
        name: {"capacity": capacity, "fleet_use": 0.0, "fleet_claimed": 0.0, "share": 0.0, "use": 0.0}
        for name, capacity in sorted(capacities.items())}
    for host in fleet:
        if not host.alive and host.name != heartbeat.host:
            continue
        for pool, entry in (host.report.get("pools") or {}).items():
            for name, use in (entry.get("uses") or {}).items():
                if name not in caps or not isinstance(use, list) or not use:
                    continue
                caps[name]["fleet_use"] += float(entry.get("current", 0)) * float(use[0])
                caps[name]["fleet_claimed"] += float(entry.get("claim", 0)) * float(use[0])
                if host.name == heartbeat.host:
                    caps[name]["use"] += float(entry.get("current", 0)) * float(use[0])
                    granted = (grants or {}).get(pool, {}).get(name)
                    caps[name]["share"] += float(granted if granted is not None else 0) * float(use[0])
    return {
        "host": heartbeat.host,
        "beat_failing_for": heartbeat.failing_for(now),
        "rescued_jobs": heartbeat.rescued,
        "members": [{"name": host.name, "alive": host.alive, "last_beat": host.last_beat,
                     "interval": host.interval} for host in fleet],
        "global": caps,
    }


def event_document(event: "ScaleEvent") -> dict[str, Any]:
    return {"seq": event.seq, "at": event.at, "pool": event.pool, "previous": event.previous,
            "desired": event.desired, "reason": event.reason, "rationale": event.rationale}
