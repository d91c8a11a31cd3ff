"""Text for people from flexiqd's documents: the status table and event lines.  Pure.

The documents are the JSON that ``Status`` and ``Events`` return (docs/dbus-api.md);
every function here takes that parsed JSON and returns text, so it is tested
without a bus.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from ..durations import format_duration

LABEL_WIDTH = len("utilisation")  # the longest label: every pool's table lines up, and watch does not jitter


def _count(value: Any) -> str:
    return "-" if value is None else str(value)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}/s"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"




def _override(pool: Mapping[str, Any], now: float) -> str:
    """``paused``, ``pinned at 3 for 52s more``, ``pinned at 0 until unpinned``, or empty."""
    parts = []
    if pool.get("paused"):
        parts.append("paused")
    pinned = pool.get("pinned")
    if pinned:
        until = pinned.get("until")
        left = "until unpinned" if until is None else f"for {format_duration(max(0.0, until - now))} more"
        parts.append(f"pinned at {pinned['workers']} {left}")
    return ", ".join(parts)


def _start_cost(cost: Mapping[str, Any] | None) -> str:
    """``0.62s to first claim (ready in 0.41s), median of 9 starts`` or ``not measured yet``."""
    if not cost:
        return "not measured yet"
    ready = cost.get("ready")
    return (f"{format_duration(cost['seconds'])} to first claim"
            + (f" (ready in {format_duration(ready)})" if ready is not None else "")
            + f", median of {cost['samples']} start{'s' if cost['samples'] != 1 else ''}")


# A finished restart stays in the status table this long (the Status document keeps the last one).
RESTART_SHOWN_FOR = 3600.0


def restart_progress(restart: Mapping[str, Any]) -> str:
    """A pool's restart in one line: ``replacing: 2 old serving, 1 old draining, 3 new ready, 1
    starting (target 4, steps of 1); waiting for ...``, ``done at ...``, ``FAILED at ...: why``."""
    state = restart["state"]
    if state == "done":
        return f"done at {_clock(restart['finished_at'])} (requested at {_clock(restart['requested_at'])})"
    if state == "failed":
        return (f"FAILED at {_clock(restart['finished_at'])}: {restart['error']}; the old workers left keep "
                f"running")
    if restart.get("old_serving") is None:
        return f"{state}: requested at {_clock(restart['requested_at'])}, the first step at the next tick"
    line = f"{state}: {restart['old_serving']} old serving"
    if restart.get("old_draining"):
        line += f", {restart['old_draining']} old draining"
    line += f", {restart['new_ready']} new ready"
    if restart.get("new_starting"):
        line += f", {restart['new_starting']} starting"
    line += f" (target {_count(restart.get('target'))}, steps of {_count(restart.get('step'))})"
    if restart.get("waiting"):
        line += f"; {restart['waiting']}"
    return line


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def evidence_line(source: Mapping[str, Any]) -> str:
    """``db: 4.1 ms (baseline 2.0 ms, holds above 6.0 ms)``, ``cpu: 72% (holds at 60%): held at 4
    workers``, or why there is no reading."""
    kind, _, name = source["source"].partition(":")
    probe = kind == "probe"
    show = _ms if probe else (lambda value: "-" if value is None else f"{value:.0f}%")
    if source.get("note"):
        line = f"{name}: no reading ({source['note']})"
    else:
        line = f"{name}: {show(source.get('reading'))}"
    if probe:
        line += (f" (baseline {_ms(source.get('baseline'))}, holds above {_ms(source.get('bound'))})"
                 if source.get("baseline") is not None else " (no baseline yet: learned while the pool is idle)")
    else:
        line += f" (holds at {source['threshold']:g}% and above)"
    if source.get("held_at") is not None:
        line += f": held at {source['held_at']} workers, the count before the rise"
    return line


def ceiling_line(ceiling: Mapping[str, Any]) -> str:
    """``held at 2 workers (80.0 jobs/s) since 12:01:55; 4 workers gave 79.0 jobs/s at 12:03:10``:
    the ceiling measured from throughput, and the count above it that gave no more (a count
    tried below the best, while the knee is trimmed, is not measured yet)."""
    def rate(value: float | None) -> str:
        return "not measured yet" if value is None else f"{value:.1f} jobs/s"

    line = f"held at {ceiling['workers']} workers ({rate(ceiling.get('jobs_per_second'))})"
    if ceiling.get("since") is not None:
        line += f" since {_clock(ceiling['since'])}"
    above = ceiling.get("above")
    if above:
        line += f"; {above['workers']} workers gave {rate(above.get('jobs_per_second'))} at {_clock(above['at'])}"
    return line


def pool_rows(pool: Mapping[str, Any], now: float) -> list[tuple[str, str]]:
    """(label, value) rows of one pool's table."""
    workers = pool.get("workers")
    rows = []
    if workers is None:
        rows.append(("workers", "not sized yet (configured by a reload)"))
    else:
        line = f"{workers['active']} active"
        for key in ("starting", "draining", "failed"):
            if workers.get(key):
                line += f", {workers[key]} {key}"
        rows.append(("workers", line))
    if pool.get("app_problem"):
        rows.append(("APP PROBLEM", f"its workers cannot run: {pool['app_problem']} (flexiqd --check-config)"))
    loop = pool.get("crash_loop")
    if loop:
        rows.append(("CRASH LOOP", f"{loop['failures']} workers failed since "
                                   f"{_clock(loop['since'])}, the last at {_clock(loop['last_at'])}: "
                                   f"{loop['last_error'] or 'how it ended is unknown'}; "
                                   f"no new worker before {_clock(loop['next_start_at'])}"))
    restart = pool.get("restart")
    if restart and (restart["state"] in ("replacing", "finishing")
                    or now - (restart.get("finished_at") or 0) < RESTART_SHOWN_FOR):
        rows.append(("restart", restart_progress(restart)))
    desired = f"{_count(pool.get('desired'))} (min {pool['min_workers']}, max {pool['max_workers']})"
    if pool.get("binding_cap"):
        desired += f", capped by {pool['binding_cap']}"
    rows.append(("desired", desired))
    if workers is not None:
        rows.append(("startup", _start_cost(pool.get("start_cost"))))
    metrics = pool.get("metrics")
    if metrics is None:
        error = pool.get("stats_error")
        rows.append(("queue", "-" if workers is None else
                     f"stats unavailable, the pool is held: {error}" if error else "stats unavailable"))
    else:
        queue = f"{metrics['runnable']} runnable, {metrics['delayed']} delayed, {metrics['running']} running"
        if metrics.get("coming_due"):
            queue += (f", {metrics['coming_due']} coming due within "
                      f"{format_duration(metrics['coming_due_within'])}")
        rows.append(("queue", queue))
        drain = metrics["time_to_drain"]
        rows.append(("waiting", f"oldest {format_duration(metrics['oldest_runnable_age'])}, drains in "
                                f"{'never (nothing completes)' if drain is None else format_duration(drain)}"))
        rows.append(("rates", f"{_rate(metrics['arrival_rate'])} in, {_rate(metrics['completion_rate'])} done"))
        slots = (workers or {}).get("active", 0) * pool.get("concurrency", 0)
        rows.append(("utilisation", f"{_percent(pool.get('utilisation'))} ({metrics['running']} running "
                                    f"in {slots} slots)"))
        rows.append(("durations", f"p50 {format_duration(metrics['duration_p50'])}, "
                                  f"p95 {format_duration(metrics['duration_p95'])}, "
                                  f"p99 {format_duration(metrics['duration_p99'])}"))
    decision = pool.get("decision")
    if decision is not None:
        rows.append(("decision", decision["rationale"] or decision["reason"]))
    if pool.get("ceiling"):
        rows.append(("ceiling", ceiling_line(pool["ceiling"])))
    for source in pool.get("evidence") or ():
        rows.append((source["source"].split(":", 1)[0], evidence_line(source)))
    upcoming = pool.get("next_schedule")
    if upcoming:
        rows.append(("schedule", f"next fire {_clock(upcoming['at'])} ({_until(upcoming['at'], now)}): "
                                 f"{upcoming['schedule']} to queue {upcoming['queue']}"))
    return rows


def _until(at: float, now: float) -> str:
    return f"in {format_duration(at - now)}" if at >= now else f"due {format_duration(now - at)} ago"


def _slot(row: Mapping[str, Any] | None) -> str:
    """``2026-03-08 03:00:00: fired, job 42 (done)`` or ``...: skipped (overlap)``."""
    if not row:
        return "none yet"
    when = _clock(row["slot"])
    if row["outcome"] == "fired":
        state = f" ({row['job_state']})" if row.get("job_state") else " (job deleted since)"
        return f"{when}: fired, job {row['job_id']}{state}"
    count = f"{row['slots']} slots up to " if row.get("slots", 1) > 1 else ""
    return f"{count}{when}: {row['outcome'] or 'being decided'}" + (f" ({row['reason']})" if row.get("reason") else "")


def render_schedules(document: Mapping[str, Any], now: float | None = None) -> str:
    """``flexiqctl schedules``: each schedule's calendar, next fire, last slot and totals."""
    now = time.time() if now is None else now
    schedules = document.get("schedules") or {}
    if not schedules:
        return "no schedules configured"
    lines: list[str] = []
    for name, entry in schedules.items():
        if lines:
            lines.append("")
        lines.append(f"schedule {name}" + (" (paused)" if entry.get("paused") else ""))
        pools = ", ".join(entry.get("pools") or []) or "none on this host"
        rows = [
            ("job", f"{entry['task']} to queue {entry['queue']} (pools: {pools})"),
            ("calendar", f"'{entry['cron']}' in {entry['timezone']}; catch_up {entry['catch_up']}, max_delay "
                         f"{format_duration(entry['max_delay'])}, overlap {entry['overlap']}"),
            ("next fire", "-" if entry.get("next_fire") is None
             else f"{_clock(entry['next_fire'])} ({_until(entry['next_fire'], now)})"),
            ("last slot", _slot(entry.get("last"))),
            ("slots", f"{entry.get('fired', 0)} fired, {entry.get('skipped', 0)} skipped (every host)"),
        ]
        if entry.get("last_run"):
            run = entry["last_run"]
            rows.append(("last run", f"{_clock(run['slot'])}: job {run['job_id']}"
                                     + (f" ({run['job_state']})" if run.get("job_state") else "")))
        lines.extend(f"  {label:<{LABEL_WIDTH}}  {value}" for label, value in rows)
    return "\n".join(lines)


def render_status(document: Mapping[str, Any], now: float | None = None) -> str:
    """``flexiqctl status``: a header, then a two-column table per pool."""
    if now is None:
        now = document.get("generated_at") or time.time()
    lines = [f"flexiqd {document.get('version', '?')}, config {document.get('config_path', '?')}"]
    if document.get("config_error"):
        lines.append(f"config rejected, running on the previous one: {document['config_error']}")
    if document.get("store_problem"):
        lines.append(f"the queue takes no writes (nothing is enqueued or claimed): {document['store_problem']}")
    if document.get("fleet_problem"):
        lines.append(f"holding every pool, the workers cannot be listed: {document['fleet_problem']}")
    pools = document.get("pools") or {}
    if not pools:
        lines.append("")
        lines.append("no pools configured")
    for name, pool in pools.items():
        lines.append("")
        state = _override(pool, now)
        lines.append(f"pool {name}" + (f" ({state})" if state else ""))
        lines.extend(f"  {label:<{LABEL_WIDTH}}  {value}" for label, value in pool_rows(pool, now))
    hosts = document.get("hosts")
    # One machine alone with nothing shared: nothing worth a section.
    if hosts and (len(hosts.get("members") or []) > 1 or hosts.get("global")
                  or hosts.get("beat_failing_for") is not None or hosts.get("rescued_jobs")):
        lines.append("")
        lines.extend(hosts_lines(hosts, now))
    return "\n".join(lines)


def _units(value: float) -> str:
    return f"{value:g}"


def hosts_lines(hosts: Mapping[str, Any], now: float) -> list[str]:
    """The fleet part of ``flexiqctl status``: the hosts sharing the store, each global cap's use."""
    members = hosts.get("members") or []
    alive = sum(1 for member in members if member.get("alive"))
    lines = [f"hosts: {alive} alive of {len(members)} (this host: {hosts.get('host')})"]
    failing = hosts.get("beat_failing_for")
    if failing is not None:
        lines.append(f"  this host's heartbeat has been failing for {failing:.0f}s")
    for member in members:
        age = now - member["last_beat"]
        state = "alive" if member.get("alive") else "dead"
        lines.append(f"  {member['name']:<{LABEL_WIDTH}}  {state}, beat {age:.1f}s ago "
                     f"(every {_units(member['interval'])}s)")
    if hosts.get("rescued_jobs"):
        lines.append(f"  jobs handed back from dead hosts: {hosts['rescued_jobs']}")
    for name, cap in (hosts.get("global") or {}).items():
        lines.append(f"  {'global ' + name:<{LABEL_WIDTH}}  fleet uses {_units(cap['fleet_use'])} of "
                     f"{_units(cap['capacity'])}; this host's share {_units(cap['share'])} "
                     f"(uses {_units(cap['use'])})")
    return lines


def render_event(event: Mapping[str, Any]) -> str:
    """One ``flexiqctl events`` line: when, sequence number, then the decision's own line."""
    text = event.get("rationale") or (f"{event['pool']} {event['previous']} -> {event['desired']}: "
                                      f"{event['reason']}")
    return f"{_clock(event.get('at'))}  #{event['seq']}  {text}"


def _clock(at: float | None) -> str:
    """An epoch time as the local clock's ``HH:MM:SS`` ("-" for none)."""
    return "-" if at is None else time.strftime("%H:%M:%S", time.localtime(at))
