"""``/metrics``: a snapshot as Prometheus metric families.  Pure; names in docs/metrics.md.

Conventions: base units (seconds, ratios), ``_total`` on counters, labels
``queue``, ``task``, ``pool``, ``state``, ``cap``, ``dependency``, ``direction``,
``reason`` -- never a job id.  A value the daemon does not know (a pool not sized
yet, a start cost not measured) is left out rather than shown as 0.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Mapping

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily,
                                    InfoMetricFamily, Metric)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from ..queue.types import Stats
from .counters import QueueTally
from .snapshot import Snapshot

WORKER_STATES = ("active", "starting", "draining", "failed")


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=list(labels))


def queue_families(queues: Iterable[str], queue_stats: Mapping[str, Stats],
                   counters: Mapping[str, QueueTally]) -> list[Metric]:
    """The queue-level families, the daemon's and ``flexiq scaler``'s: ``queues`` served,
    ``queue_stats`` as last read (a queue whose read failed has none), ``counters`` since start."""
    q = ("queue",)
    runnable = _gauge("flexiqd_queue_runnable_jobs", "Jobs that could run now and wait for a worker.", q)
    delayed = _gauge("flexiqd_queue_delayed_jobs", "Queued jobs whose run-at has not come (delayed, retry backoff).", q)
    running = _gauge("flexiqd_queue_running_jobs", "Jobs leased to a worker.", q)
    dead = _gauge("flexiqd_queue_dead_jobs", "Dead-lettered jobs held in the store.", q)
    age = _gauge("flexiqd_queue_oldest_runnable_age_seconds", "Age of the oldest runnable job, since it became runnable.", q)
    drain = _gauge("flexiqd_queue_time_to_drain_seconds", "Runnable jobs / completion rate (absent while nothing completes).", q)
    arrivals = _counter("flexiqd_queue_arrivals_total", "Jobs that became runnable for the first time (enqueued, came due, revived).", q)
    completions = _counter("flexiqd_queue_completions_total", "Attempts that finished successfully.", q)
    failures = _counter("flexiqd_queue_failures_total", "Attempts that failed (raised, timed out, dead at once, or lost with their worker).", q)
    dead_letters = _counter("flexiqd_queue_dead_letters_total", "Jobs moved to the dead letters.", q)
    releases = _counter("flexiqd_queue_drain_releases_total", "Jobs given back unfinished by a draining worker (no attempt used).", q)
    reruns = _counter("flexiqd_queue_crash_reruns_total", "Attempts lost with a worker that died; the job runs again.", q)
    durations = HistogramMetricFamily("flexiqd_job_duration_seconds", "Run time of successful attempts.",
                                      labels=["queue", "task"])
    for name in sorted(set(queues) | set(queue_stats)):
        stats = queue_stats.get(name)
        if stats is not None:
            runnable.add_metric([name], stats.runnable)
            delayed.add_metric([name], stats.delayed)
            running.add_metric([name], stats.running)
            dead.add_metric([name], stats.dead)
            age.add_metric([name], stats.oldest_runnable_age)
            if stats.time_to_drain is not None:
                drain.add_metric([name], stats.time_to_drain)
        tally = counters.get(name, QueueTally())
        arrivals.add_metric([name], tally.arrivals)
        completions.add_metric([name], tally.completions)
        failures.add_metric([name], tally.failures)
        dead_letters.add_metric([name], tally.dead_letters)
        releases.add_metric([name], tally.releases)
        reruns.add_metric([name], tally.crash_reruns)
        for task, histogram in sorted(tally.durations.items()):
            durations.add_metric([name, task], histogram.cumulative(), histogram.total)
    return [runnable, delayed, running, dead, age, drain, arrivals, completions, failures, dead_letters,
            releases, reruns, durations]


def pool_families(snapshot: Snapshot) -> list[Metric]:
    p = ("pool",)
    workers = _gauge("flexiqd_pool_workers", "Workers by state.", ("pool", "state"))
    desired = _gauge("flexiqd_pool_desired_workers", "The worker count the last decision asked for.", p)
    minimum = _gauge("flexiqd_pool_min_workers", "Configured minimum workers.", p)
    maximum = _gauge("flexiqd_pool_max_workers", "Configured maximum workers.", p)
    cap = _gauge("flexiqd_pool_binding_cap_workers", "The ceiling that held the last decision down, by cap "
                 "(max, dependency:<name>, latency:<name>, starting:<name>, stopping, stopping:<name>, knee, "
                 "probe:<name>, pressure:<resource>); absent when none did.",
                 ("pool", "cap"))
    utilisation = _gauge("flexiqd_pool_utilisation_ratio", "Busy slots / slots of the active workers.", p)
    start_cost = _gauge("flexiqd_pool_start_cost_seconds", "Measured time from a worker's start to its first claim.", p)
    paused = _gauge("flexiqd_pool_paused", "1 while an operator has paused the pool.", p)
    queues = _gauge("flexiqd_pool_queue_info", "1 for each queue a pool's workers claim from (for joins).",
                    ("pool", "queue"))
    age = _gauge("flexiqd_pool_oldest_runnable_age_seconds", "Age of the oldest runnable job of the pool's queues.", p)
    target_age = _gauge("flexiqd_pool_target_age_seconds", "The pool's age target (targets.age).", p)
    ceiling = _gauge("flexiqd_pool_measured_ceiling_workers", "The worker count of a ceiling measured from "
                     "throughput (the knee) that holds the pool; absent while none is known.", p)
    ceiling_rate = _gauge("flexiqd_pool_measured_ceiling_jobs_per_second", "What the pool completed at its "
                          "measured ceiling; absent while none is known.", p)
    crash_loop = _gauge("flexiqd_pool_crash_looping", "1 while the pool's workers keep failing (3 or more within "
                        "5 minutes; new starts back off), else 0.", p)
    failures = _gauge("flexiqd_pool_recent_worker_failures", "Workers of the pool that failed within the last "
                      "5 minutes, while it is crash-looping (else 0).", p)
    app_problem = _gauge("flexiqd_pool_app_problem", "1 while the last check of the pool's app (at start and "
                         "each reload, imported as its workers would) found that its workers cannot run it.", p)
    restart_old = _gauge("flexiqd_pool_restart_old_workers", "Workers started before the pool's restart in "
                         "progress (flexiqctl restart) that still run, serving or draining; 0 when none runs.", p)
    probe = _gauge("flexiqd_pool_probe_latency_seconds", "A dependency's probe as the pool's last decision "
                   "judged it: the median of its last three readings; absent before its first reading.",
                   ("pool", "dependency"))
    probe_baseline = _gauge("flexiqd_pool_probe_baseline_seconds", "The probe's unloaded latency, learned while "
                            "the pool ran no job; absent while none is learned.", ("pool", "dependency"))
    pressure = _gauge("flexiqd_pool_pressure_percent", "The mean of the pool's workers' cgroup pressure (PSI "
                      "some: the share of time stalled since the previous tick) for a resource the pool "
                      "heeds; absent without a reading.", ("pool", "resource"))
    held = _gauge("flexiqd_pool_evidence_held_workers", "The count a rise of a probe or of the pressure holds "
                  "the pool at (the count before it); absent while none holds.", ("pool", "source"))
    events = _counter("flexiqd_scale_events_total", "Changes of a pool's desired count, by direction and reason.",
                      ("pool", "direction", "reason"))
    for name, document in sorted(snapshot.status["pools"].items()):
        loop = document.get("crash_loop")
        crash_loop.add_metric([name], 1 if loop else 0)
        app_problem.add_metric([name], 1 if document.get("app_problem") else 0)
        restart = document.get("restart")
        running = restart is not None and restart["state"] in ("replacing", "finishing")
        restart_old.add_metric([name], ((restart.get("old_serving") or 0) + (restart.get("old_draining") or 0))
                               if running else 0)
        failures.add_metric([name], loop["failures"] if loop else 0)
        minimum.add_metric([name], document["min_workers"])
        maximum.add_metric([name], document["max_workers"])
        paused.add_metric([name], 1 if document["paused"] else 0)
        for queue in document["queues"]:
            queues.add_metric([name, queue], 1)
        if name in snapshot.target_ages:
            target_age.add_metric([name], snapshot.target_ages[name])
        if document.get("metrics") is not None:
            age.add_metric([name], document["metrics"]["oldest_runnable_age"])
        if document["workers"] is not None:
            for state in WORKER_STATES:
                workers.add_metric([name, state], document["workers"][state])
        if document["desired"] is not None:
            desired.add_metric([name], document["desired"])
        if document["utilisation"] is not None:
            utilisation.add_metric([name], document["utilisation"])
        if document["start_cost"] is not None and document["start_cost"].get("seconds") is not None:
            start_cost.add_metric([name], document["start_cost"]["seconds"])
        if name in snapshot.binding_caps:
            which, workers_at_cap = snapshot.binding_caps[name]
            cap.add_metric([name, which], workers_at_cap)
        if document.get("ceiling") is not None:
            ceiling.add_metric([name], document["ceiling"]["workers"])
            if document["ceiling"]["jobs_per_second"] is not None:
                ceiling_rate.add_metric([name], document["ceiling"]["jobs_per_second"])
        for source in document.get("evidence") or ():
            kind, _, which = source["source"].partition(":")
            if kind == "probe":
                if source["level"] is not None:
                    probe.add_metric([name, which], source["level"])
                if source["baseline"] is not None:
                    probe_baseline.add_metric([name, which], source["baseline"])
            elif source["level"] is not None:
                pressure.add_metric([name, which], source["level"])
            if source["held_at"] is not None:
                held.add_metric([name, source["source"]], source["held_at"])
    for (pool, direction, reason), count in sorted(snapshot.scale_events.items()):
        events.add_metric([pool, direction, reason], count)
    return [workers, desired, minimum, maximum, cap, utilisation, start_cost, paused, queues, age, target_age,
            ceiling, ceiling_rate, crash_loop, failures, app_problem, restart_old, probe, probe_baseline, pressure,
            held, events]


def dependency_families(snapshot: Snapshot) -> list[Metric]:
    d = ("dependency",)
    capacity = _gauge("flexiqd_dependency_capacity", "A dependency's declared capacity, in its own unit.", d)
    reserved = _gauge("flexiqd_dependency_reserved", "The part of the capacity kept for others (the request path).", d)
    use = _gauge("flexiqd_dependency_use", "What the pools' workers hold of it (workers x per_worker), in its unit.", d)
    for figures in snapshot.dependencies:
        capacity.add_metric([figures.name], figures.capacity)
        reserved.add_metric([figures.name], figures.reserved)
        use.add_metric([figures.name], figures.use)
    return [capacity, reserved, use]


def schedule_families(snapshot: Snapshot) -> list[Metric]:
    """The schedules: this daemon's decisions (counters) and each schedule's calendar state (gauges)."""
    s = ("schedule",)
    fired = _counter("flexiqd_schedule_slots_fired_total", "Slots of a schedule this daemon enqueued the job of.", s)
    late = _counter("flexiqd_schedule_slots_late_total", "Slots this daemon fired later than max_delay "
                    "(caught up after an outage or a clock step).", s)
    skipped = _counter("flexiqd_schedule_slots_skipped_total", "Slots this daemon skipped, by reason "
                       "(missed, overlap, paused).", ("schedule", "reason"))
    runs = _counter("flexiqd_schedule_runs_total", "Jobs enqueued by flexiqctl schedule run through this daemon.", s)
    upcoming = _gauge("flexiqd_schedule_next_fire_timestamp_seconds", "When the schedule fires next (epoch seconds).", s)
    last = _gauge("flexiqd_schedule_last_slot_timestamp_seconds",
                  "The newest slot decided by any host (epoch seconds).", s)
    paused = _gauge("flexiqd_schedule_paused", "1 while the schedule is paused (for every host).", s)
    decided = snapshot.status.get("schedules_decided_here") or {}
    by_reason = {}
    for key, count in (decided.get("skipped") or {}).items():
        name, _, reason = key.rpartition(":")
        by_reason[(name, reason)] = count
    for name, entry in sorted((snapshot.status.get("schedules") or {}).items()):
        fired.add_metric([name], (decided.get("fired") or {}).get(name, 0))
        late.add_metric([name], (decided.get("late") or {}).get(name, 0))
        runs.add_metric([name], (decided.get("runs") or {}).get(name, 0))
        for reason in ("missed", "overlap", "paused"):
            skipped.add_metric([name, reason], by_reason.get((name, reason), 0))
        if entry.get("next_fire") is not None:
            upcoming.add_metric([name], entry["next_fire"])
        if entry.get("last") is not None:
            last.add_metric([name], entry["last"]["slot"])
        paused.add_metric([name], 1 if entry.get("paused") else 0)
    return [fired, late, skipped, runs, upcoming, last, paused]


def daemon_families(snapshot: Snapshot) -> list[Metric]:
    daemon = snapshot.daemon
    families: list[Metric] = []
    info = InfoMetricFamily("flexiqd_build", "flexiqd's version.")
    info.add_metric([], {"version": daemon.version})
    families.append(info)
    ticks = _counter("flexiqd_ticks_total", "Control-loop ticks completed.")
    ticks.add_metric([], daemon.ticks)
    families.append(ticks)
    if daemon.tick_durations is not None:
        durations = HistogramMetricFamily("flexiqd_tick_duration_seconds", "How long each tick took.")
        durations.add_metric([], daemon.tick_durations.cumulative(), daemon.tick_durations.total)
        families.append(durations)
    if daemon.last_tick_at is not None:
        last = _gauge("flexiqd_last_tick_timestamp_seconds", "When the last tick ended (epoch seconds).")
        last.add_metric([], daemon.last_tick_at)
        families.append(last)
    if daemon.last_stats_read_at is not None:
        read = _gauge("flexiqd_last_stats_read_timestamp_seconds",
                      "When every pool's queue stats were last read successfully (epoch seconds).")
        read.add_metric([], daemon.last_stats_read_at)
        families.append(read)
    failed = _counter("flexiqd_stats_read_failures_total", "Ticks in which a pool's queue stats could not be read.")
    failed.add_metric([], daemon.stats_read_failures)
    generation = _gauge("flexiqd_config_generation", "1 for the config read at start, +1 per applied reload.")
    generation.add_metric([], daemon.config_generation)
    reload_ok = _gauge("flexiqd_config_last_reload_successful", "0 when the last reload was rejected.")
    reload_ok.add_metric([], 1 if daemon.last_reload_ok else 0)
    held = _gauge("flexiqd_workers_unlisted", "1 while systemd could not be asked for the workers at the last "
                  "tick (the system bus away): every pool is held.")
    held.add_metric([], 1 if snapshot.status.get("fleet_problem") else 0)
    families.extend([failed, generation, reload_ok, held])
    return families


def families(snapshot: Snapshot) -> list[Metric]:
    return [*queue_families(snapshot.served_queues(), snapshot.queue_stats, snapshot.counters),
            *pool_families(snapshot), *dependency_families(snapshot), *schedule_families(snapshot),
            *daemon_families(snapshot)]


class _Collector:
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # nothing to check at registration: the registry is made per scrape

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)


def exposition(metrics: list[Metric]) -> bytes:
    """The Prometheus text exposition of ``metrics``, in a registry of its own (never the global one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(metrics))
    return generate_latest(registry)


def render(snapshot: Snapshot) -> bytes:
    """The daemon's /metrics: everything ``snapshot`` holds."""
    return exposition(families(snapshot))
