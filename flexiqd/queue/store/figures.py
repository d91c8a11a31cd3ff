"""A queue's ``Stats`` from the rows a dialect read (``StatsRows``): pure, shared by both stores
and by the simulator, which measures its queue with the same bounds.

A stats read never counts the backlog: depth comes from the counts rows, rates
from per-second buckets, durations from a bounded sample of recent completions.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from ..limits import TenantCaps
from ..limits import nearest_rank as percentile
from ..types import RECENT_WINDOW, Stats

# Durations for percentiles come from at most this many completions of the last
# DURATION_HORIZON seconds (or of the window, when longer).
DURATION_SAMPLE = 1000
DURATION_HORIZON = 300.0
# Delayed jobs coming due, and jobs waiting for a dependency, are counted up to this many:
# an index range of at most this length (a few milliseconds), however many there are.
COMING_DUE_LIMIT = 100_000
# The counts buckets a stats read needs (finished jobs are counted too, but never read there).
READ_BUCKETS = ("queued", "delayed", "waiting", "running", "dead")


Percentiles = tuple[float, float, float]  # nearest-rank p50, p95, p99


@dataclasses.dataclass
class Durations:
    """What the duration sample says: its percentiles, each named tenant's share's, and the
    median, p95 and number of the completions of the last ``RECENT_WINDOW`` seconds."""

    overall: Percentiles | None = None
    by_tenant: dict[str, Percentiles] = dataclasses.field(default_factory=dict)
    recent_p50: float | None = None
    recent: int = 0
    recent_p95: float | None = None


@dataclasses.dataclass
class StatsRows:
    """What a dialect reads for one queue's stats, in one snapshot.

    ``counts``: tenant -> bucket -> jobs ('' is the untenanted share); ``events``: tenant ->
    (arrivals, completions, failures) in the window; ``durations``: the sample of the newest
    completions (at most ``DURATION_SAMPLE``, see ``durations_of``); ``first_run_at``: the
    oldest runnable job's run_at per tenant with runnable jobs; ``caps`` and
    ``running_by_tenant`` (in every queue) when tenant caps are stored; ``coming_due``: delayed
    jobs due within the horizon, ``next_due`` the run-at of the first of them all; ``running``:
    (jobs, total seconds they have run).
    """

    counts: dict[str, dict[str, int]]
    events: dict[str, tuple[int, int, int]]
    durations: Durations
    first_run_at: dict[str, float]
    caps: dict[str, int]
    running_by_tenant: dict[str, int]
    coming_due: int
    running: tuple[int, float]
    next_due: float | None = None
    unfolded: int = 0  # count changes read that are not folded into their totals yet
    completions_by_second: dict[int, int] = dataclasses.field(default_factory=dict)  # the recent window's


def durations_of(sample: Sequence[tuple[str, float, float]], *, now: float) -> Durations:
    """``Durations`` of a sample of (tenant, finished_at, seconds), newest first."""
    recent_since = now - RECENT_WINDOW
    everything, recent = [], []
    shares: dict[str, list[float]] = {}  # of named tenants: the untenanted share is never shown
    for tenant, finished_at, seconds in sample:
        everything.append(seconds)
        if finished_at >= recent_since:
            recent.append(seconds)
        if tenant:
            shares.setdefault(tenant, []).append(seconds)
    recent.sort()
    return Durations(overall=_percentiles(everything),
                     by_tenant={tenant: _percentiles(values) for tenant, values in shares.items()},
                     recent_p50=percentile(recent, 0.50), recent=len(recent),
                     recent_p95=percentile(recent, 0.95))


def _percentiles(values: list[float]) -> Percentiles | None:
    if not values:
        return None
    values.sort()
    return (percentile(values, 0.50), percentile(values, 0.95), percentile(values, 0.99))  # type: ignore[return-value]


def stats_from_rows(queue: str, rows: StatsRows, *, now: float, window: float, due_within: float) -> Stats:
    """Queue-wide and per-tenant stats, each tenant's from its counts, rates and share of the
    queue's duration sample."""
    per_tenant = {}
    for tenant in sorted(rows.counts.keys() | rows.events.keys()):
        by_state = rows.counts.get(tenant, {})
        first = rows.first_run_at.get(tenant)
        oldest = now - first if by_state.get("queued") and first is not None and first <= now else 0.0
        arrivals, completions, failures = rows.events.get(tenant, (0, 0, 0))
        per_tenant[tenant] = _stats(
            queue, window, runnable=by_state.get("queued", 0), delayed=by_state.get("delayed", 0),
            waiting=by_state.get("waiting", 0), running=by_state.get("running", 0),
            dead=by_state.get("dead", 0), oldest=oldest, arrivals=arrivals, completions=completions,
            failures=failures, durations=rows.durations.by_tenant.get(tenant))
    caps = TenantCaps(dict(rows.caps))
    if caps and any(p.runnable for p in per_tenant.values()):
        per_tenant = hold_capped(per_tenant, caps, rows.running_by_tenant)
    parts = per_tenant.values()
    count, total = rows.running
    events = rows.events.values()
    overall = _stats(
        queue, window, runnable=sum(p.runnable for p in parts), delayed=sum(p.delayed for p in parts),
        waiting=sum(p.waiting_for_dependency for p in parts),
        running=sum(p.running for p in parts), dead=sum(p.dead for p in parts),
        oldest=max((p.oldest_runnable_age for p in parts), default=0.0),
        held=sum(p.held_by_tenant_cap for p in parts),
        arrivals=sum(e[0] for e in events), completions=sum(e[1] for e in events),
        failures=sum(e[2] for e in events), durations=rows.durations.overall,
        tenants={name: stats for name, stats in per_tenant.items() if name})
    return dataclasses.replace(overall, coming_due=rows.coming_due, coming_due_within=float(due_within),
                               next_due=rows.next_due,
                               running_age_mean=max(0.0, total / count) if count else None,
                               recent_duration_p50=rows.durations.recent_p50,
                               recent_duration_p95=rows.durations.recent_p95,
                               recent_completions=rows.durations.recent,
                               completion_series=tuple(sorted(rows.completions_by_second.items())))


def hold_capped(per_tenant: dict[str, Stats], caps: TenantCaps, running: Mapping[str, int]) -> dict[str, Stats]:
    """Each tenant's stats with the due jobs its cap holds back moved from runnable to
    ``held_by_tenant_cap`` (see ``Stats``); ``running``: its running jobs in every queue."""
    held_back = {}
    for tenant, stats in per_tenant.items():
        cap = caps.cap_of(tenant)
        if cap is None or not stats.runnable:
            held_back[tenant] = stats
            continue
        room = max(0, cap - int(running.get(tenant, 0)))
        held = max(0, stats.runnable - room)
        held_back[tenant] = dataclasses.replace(
            stats, runnable=stats.runnable - held, held_by_tenant_cap=held,
            oldest_runnable_age=stats.oldest_runnable_age if stats.runnable > held else 0.0)
    return held_back


def _stats(queue: str, window: float, *, runnable: int, delayed: int, running: int, dead: int,
           oldest: float, arrivals: int, completions: int, failures: int,
           durations: Percentiles | None, tenants: dict[str, Stats] | None = None, waiting: int = 0,
           held: int = 0) -> Stats:
    return Stats(queue=queue, runnable=runnable, delayed=delayed, running=running, dead=dead,
                 waiting_for_dependency=waiting, held_by_tenant_cap=held,
                 oldest_runnable_age=oldest, arrival_rate=arrivals / window,
                 completion_rate=completions / window, failure_rate=failures / window,
                 duration_p50=durations[0] if durations else None,
                 duration_p95=durations[1] if durations else None,
                 duration_p99=durations[2] if durations else None, window=window, tenants=tenants or {})
