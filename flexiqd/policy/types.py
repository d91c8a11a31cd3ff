"""What goes into a decision (observation, history) and what comes out of it (Decision).

All frozen: the caller keeps the ``History`` a decision returns and passes it
to the next call; nothing here is mutated or remembered between calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence


@dataclass(frozen=True, kw_only=True)
class DependencyObservation:
    """A shared dependency as the pool's workers see it: its latency in seconds."""

    name: str
    latency: float


def merge_series(per_queue: Sequence[Any]) -> tuple[tuple[int, int], ...]:
    """The queues' ``completion_series`` added up second by second."""
    total: dict[int, int] = {}
    for stats in per_queue:
        for second, count in getattr(stats, "completion_series", ()):
            total[second] = total.get(second, 0) + count
    return tuple(sorted(total.items()))


@dataclass(frozen=True, kw_only=True)
class PoolMetrics:
    """The queue's side of an observation.  Counts are of one pool's queue.

    ``runnable_depth`` counts queued jobs whose run-at is not in the future
    (delayed and backing-off jobs excluded).  ``oldest_runnable_age`` is
    counted from the job's run-at.  Rates are jobs/s over the last
    ``rate_window`` seconds (None: not known yet).  Durations are of recently
    completed jobs -- over about the rate window: the knee compares p50
    between worker counts a minute apart.  ``cpu_utilisation`` is the mean
    over the active workers across the rate window, 0..1 (None: not measured).
    ``coming_due``: delayed jobs whose run-at falls within the next
    ``coming_due_within`` seconds (a forecast the store holds).
    ``running_age_mean``: how long the running jobs have run so far, on average
    (None: none running) -- a lower bound on their duration before any completes.
    ``recent_duration_p50`` / ``recent_duration_p95`` / ``recent_completions``:
    the jobs that finished in the last ``recent_window`` seconds (None: not
    reported) -- the durations of now, for the knee.  ``completion_series``:
    (whole second, jobs completed in it) over the recent window, oldest first
    (seconds without completions left out): the knee counts completions
    between any two instants with it;
    ``series_reported``: whether the source reports that series at all (an
    empty one then means nothing completed).
    """

    runnable_depth: int
    running: int
    oldest_runnable_age: float = 0.0
    arrival_rate: float | None = None
    completion_rate: float | None = None
    rate_window: float | None = None
    duration_p50: float | None = None
    duration_p95: float | None = None
    duration_p99: float | None = None
    cpu_utilisation: float | None = None
    dependencies: tuple[DependencyObservation, ...] = ()
    coming_due: int = 0
    coming_due_within: float = 0.0
    running_age_mean: float | None = None
    recent_duration_p50: float | None = None
    recent_duration_p95: float | None = None
    recent_completions: int = 0
    recent_window: float | None = None
    completion_series: tuple[tuple[int, int], ...] = ()
    series_reported: bool = False

    def __post_init__(self) -> None:
        if self.runnable_depth < 0 or self.running < 0:
            raise ValueError(f"counts must not be negative: depth={self.runnable_depth} running={self.running}")
        if self.oldest_runnable_age < 0:
            raise ValueError(f"oldest_runnable_age must not be negative, got {self.oldest_runnable_age}")

    @property
    def in_flight_age(self) -> float | None:
        """``running_age_mean`` while jobs run; None when none does or it is not reported."""
        return self.running_age_mean if self.running else None

    @classmethod
    def from_queue_stats(
        cls,
        stats: Any,
        *,
        cpu_utilisation: float | None = None,
        dependencies: tuple[DependencyObservation, ...] = (),
    ) -> "PoolMetrics":
        """From a ``flexiqd.queue.Stats`` (read by attribute, so any look-alike works).

        ``stats.runnable`` is used, never ``stats.delayed``: future-dated jobs
        need no worker yet.
        """
        return cls(
            runnable_depth=stats.runnable,
            running=stats.running,
            oldest_runnable_age=stats.oldest_runnable_age,
            arrival_rate=stats.arrival_rate,
            completion_rate=stats.completion_rate,
            rate_window=stats.window,
            duration_p50=stats.duration_p50,
            duration_p95=stats.duration_p95,
            duration_p99=stats.duration_p99,
            cpu_utilisation=cpu_utilisation,
            dependencies=dependencies,
            coming_due=stats.coming_due,
            coming_due_within=stats.coming_due_within,
            running_age_mean=stats.running_age_mean,
            recent_duration_p50=getattr(stats, "recent_duration_p50", None),
            recent_duration_p95=getattr(stats, "recent_duration_p95", None),
            recent_completions=getattr(stats, "recent_completions", 0),
            recent_window=getattr(stats, "recent_window", None),
            completion_series=tuple(getattr(stats, "completion_series", ())),
            series_reported=hasattr(stats, "completion_series"),
        )

    @classmethod
    def from_queues(cls, per_queue: Sequence[Any]) -> "PoolMetrics":
        """One pool's metrics from the ``Stats`` of each queue it serves.

        Counts and rates add up; the rate window and the duration percentiles
        are the busiest queue's (the one completing most), p99 the longest of
        any; the running jobs' mean age is weighted by their count.
        """
        if len(per_queue) == 1:
            return cls.from_queue_stats(per_queue[0])
        busiest = max(per_queue, key=lambda s: s.completion_rate)
        ages = [(s.running_age_mean, s.running) for s in per_queue if s.running_age_mean is not None]
        running = sum(n for _, n in ages)
        return cls(
            runnable_depth=sum(s.runnable for s in per_queue), running=sum(s.running for s in per_queue),
            oldest_runnable_age=max(s.oldest_runnable_age for s in per_queue),
            arrival_rate=sum(s.arrival_rate for s in per_queue),
            completion_rate=sum(s.completion_rate for s in per_queue), rate_window=busiest.window,
            duration_p50=busiest.duration_p50, duration_p95=busiest.duration_p95,
            duration_p99=max((s.duration_p99 for s in per_queue if s.duration_p99 is not None), default=None),
            coming_due=sum(s.coming_due for s in per_queue),
            coming_due_within=min(s.coming_due_within for s in per_queue),
            running_age_mean=sum(a * n for a, n in ages) / running if running else None,
            recent_duration_p50=busiest.recent_duration_p50, recent_duration_p95=busiest.recent_duration_p95,
            recent_completions=busiest.recent_completions,
            recent_window=busiest.recent_window, completion_series=merge_series(per_queue),
            series_reported=all(hasattr(s, "completion_series") for s in per_queue))

    @property
    def time_to_drain(self) -> float | None:
        """Runnable depth / completion rate: 0 with nothing waiting, None when nothing completes."""
        if self.runnable_depth == 0:
            return 0.0
        if not self.completion_rate:
            return None
        return self.runnable_depth / self.completion_rate

    def dependency_latency(self, name: str) -> float | None:
        for observed in self.dependencies:
            if observed.name == name:
                return observed.latency
        return None


@dataclass(frozen=True, kw_only=True)
class Observation:
    """One pool at one instant: its workers (from the fleet) and its queue metrics.

    ``active`` workers claim jobs; ``starting`` ones were asked for and are
    booting (they count as capacity, so a boot is not answered with more
    boots); ``draining`` ones are leaving and do not count.  ``metrics`` is
    None when reading them failed: the decision then holds the pool.
    ``start_cost``: what starting one worker costs this pool, in seconds from the
    decision to the worker's first claim, as measured (None: not measured yet).
    ``tick``: seconds between decisions (None: the daemon's default), the longest
    a change in the queue waits before a decision can answer it.
    ``other_hosts``: other live hosts of a fleet serving this pool; the store's
    counts (completions, running) are then theirs too, not this host's workers' alone.
    ``evidence``: direct evidence of a ceiling read this tick (a dependency's probe, the
    pool's cgroup pressure; see ``evidence``).
    """

    pool: str
    active: int
    starting: int = 0
    draining: int = 0
    concurrency: int = 1
    metrics: PoolMetrics | None
    start_cost: float | None = None
    tick: float | None = None
    other_hosts: int = 0
    evidence: tuple["EvidenceReading", ...] = ()

    def __post_init__(self) -> None:
        if min(self.active, self.starting, self.draining) < 0:
            raise ValueError(f"pool {self.pool}: worker counts must not be negative")
        if self.concurrency < 1:
            raise ValueError(f"pool {self.pool}: concurrency must be >= 1, got {self.concurrency}")

    @property
    def current(self) -> int:
        """The worker count decisions start from: active plus starting."""
        return self.active + self.starting


class TimedCount(NamedTuple):
    """A recommended worker count and when it was made.

    ``sustained``: the part of ``workers`` that keeps up with arrivals,
    without what draining the backlog of that instant added (None: all of
    it).  Once the backlog has been gone for a while, the down window counts
    only this part (see ``decide.down_window_view``).
    """

    at: float
    workers: int
    sustained: int | None = None

    @property
    def after_drain(self) -> int:
        """What this recommendation still asks for once its backlog has drained."""
        return self.workers if self.sustained is None else min(self.workers, self.sustained)


class ScaleChange(NamedTuple):
    """A decided change of the worker count (signed) and when."""

    at: float
    change: int


class LoadSample(NamedTuple):
    """What one decision saw, kept to average over time (Little's law, utilisation, CPU).

    ``runnable``: the runnable depth, which tells when the pool last had a backlog.
    """

    at: float
    active: int
    running: int
    completion_rate: float | None
    arrival_rate: float | None
    runnable: int = 0


class ThroughputSample(NamedTuple):
    """Completion rate of a saturated pool of ``workers`` working workers, measured at ``at`` over
    ``completions`` completions, counted from ``duration`` seconds (the jobs' mean duration then)
    after the count settled.  ``error``: the rate's standard error as the per-second counts
    spread (None: as a Poisson count's)."""

    workers: int
    completion_rate: float
    duration: float
    at: float
    completions: int = 0
    error: float | None = None


class KneeProbe(NamedTuple):
    """A step under way: from ``start`` (the sample before it) to ``to_workers``, begun at ``since``;
    its sample is counted from ``lag`` seconds after the new count settles.  ``start_age``: the
    mean age of the jobs in flight when it began (None: not reported)."""

    start: ThroughputSample
    to_workers: int
    since: float
    lag: float
    start_age: float | None = None


class KneeTrim(NamedTuple):
    """A knee being trimmed: the counts between ``floor`` (measured short of ``best``, or the count
    measured below it when it was held) and ``best`` (the best count measured) are tried."""

    best: int
    floor: int


class KneeDescent(NamedTuple):
    """A count under way below one reached without a smaller count: ``start`` (that count's sample)
    compared with ``to_workers``, begun at ``since``; counted from ``counting_from`` (None: not
    yet, the pool is still above it), less ``stopping`` completions (the workers stopping then
    end at most one job each, among the others')."""

    start: ThroughputSample
    to_workers: int
    since: float
    counting_from: float | None = None
    stopping: int = 0


@dataclass(frozen=True, kw_only=True)
class KneeState:
    """Ceiling discovery's memory (see ``knee``).

    ``samples``: the latest throughput sample per worker count.
    ``backlog_since``: since when the pool has had runnable jobs at every
    decision (None: not now).  ``held_at``: the knee, the count of the best
    throughput measured or fewer that complete as much (trimmed; None: no knee known);
    ``held_rate``: the best measured count's completion rate
    when it was held (jobs/s; None: not known); ``held_since``: when it was
    found or last confirmed.  ``probe``: a step being judged.
    ``waiting_since``: since when growth has waited for a first sample at the
    count now (None: not waiting).  ``trim``: while set, the held count is below
    the best measured and not yet measured itself: once it is, it is held if it
    completes as much, and a count fewer is tried.  ``unclear_from``: the count
    the last step started from when its verdict stayed unclear; the next step is
    judged against it too (None: the last step was clear, or none was taken).
    ``confirmed``: re-probes in a row that showed the ceiling again, or whose unclear
    count leaned flat (each doubles the wait for the next while the oldest job is late).
    ``lean_at``: the last decision that held or shrank the pool on the lean count (None: never).
    ``descent``: a count under way below a count reached without one (its ``start``: that
    count's sample; ``to_workers``: the fewer counted), while nothing smaller compares;
    ``descended_at``: when the last one began (one per ``sample_max_age``).
    ``count_at``: while growth waits for a first count, the workers it is taken at where the
    count now is too slow to be had in time (None: at the count now).
    ``waiting_budget``: while growth waits for a first count, how long it may (the probe budget,
    or a share of the backlog's drain at the most workers when that is longer, up to the age target).
    """

    samples: tuple[ThroughputSample, ...] = ()
    backlog_since: float | None = None
    held_at: int | None = None
    held_since: float | None = None
    held_rate: float | None = None
    probe: KneeProbe | None = None
    waiting_since: float | None = None
    trim: KneeTrim | None = None
    unclear_from: ThroughputSample | None = None
    confirmed: int = 0
    lean_at: float | None = None
    descent: KneeDescent | None = None
    count_at: int | None = None
    descended_at: float | None = None
    waiting_budget: float | None = None


class EvidenceReading(NamedTuple):
    """One reading of direct evidence: ``source`` is ``probe:<dependency>`` (``value``: the probe's
    latency in seconds) or ``pressure:<resource>`` (``value``: the share of the time
    since the previous tick its workers stalled on it, PSI ``some``, in percent).  ``value`` None: no information (the probe failed or timed out, no PSI here)."""

    source: str
    value: float | None


@dataclass(frozen=True, kw_only=True)
class EvidenceTrack:
    """What one source of direct evidence remembers between decisions (see ``evidence``).

    ``recent``: its last readings (no information left out).  ``unloaded`` /
    ``small``: a probe's readings while the pool ran no job / at most one
    worker's slots of jobs (its baseline is learned from them).  ``last_good``:
    the workers at work at the last reading within bounds (the count before a
    rise); ``before``: the workers at work at the previous reading.
    ``held_at``: the count the pool is held at (None: not held);
    ``high_at``: the last reading beyond bounds.
    """

    source: str
    recent: tuple[float, ...] = ()
    unloaded: tuple[float, ...] = ()
    small: tuple[float, ...] = ()
    last_good: int | None = None
    before: int | None = None
    held_at: int | None = None
    high_at: float | None = None


@dataclass(frozen=True, kw_only=True)
class History:
    """Everything one decision leaves for the next.  Start with ``History()`` (or None).

    ``seeded`` turns true at the first decision with metrics, which records the
    then-current count as a recommendation: a restart holds the pool for a
    whole down window before any scale-down.
    """

    seeded: bool = False
    recommendations: tuple[TimedCount, ...] = ()
    changes: tuple[ScaleChange, ...] = ()
    load: tuple[LoadSample, ...] = ()
    knee: KneeState = field(default_factory=KneeState)
    evidence: tuple[EvidenceTrack, ...] = ()


class SignalRecommendation(NamedTuple):
    """One signal's opinion: the worker count it asks for and why."""

    signal: str
    workers: int
    detail: str


class CapValue(NamedTuple):
    """A ceiling on the worker count: ``max``, ``dependency:<name>``, ``latency:<name>``, ``knee``,
    ``probe:<name>``, ``pressure:<resource>``, ... (see ``caps``)."""

    cap: str
    workers: int


@dataclass(frozen=True, kw_only=True)
class Decision:
    """The outcome of one decision, every stage's value named.

    ``raw_desired``: the largest signal recommendation; ``capped``: after the
    tolerance band and the caps; ``stabilized``: after the windows;
    ``desired``: after rate limits and the final clamp -- the count to apply.
    ``reason`` is a stable token (``ScaleUpAge``, ``CappedByDependency``, ...);
    ``message`` a sentence.  ``history`` must be passed to the next call.
    """

    pool: str
    current: int
    desired: int
    raw_desired: int
    capped: int
    stabilized: int
    reason: str
    message: str
    recommendations: tuple[SignalRecommendation, ...]
    winner: str | None
    caps: tuple[CapValue, ...]
    binding_cap: CapValue | None
    smoothing: tuple[str, ...]
    history: History

    @property
    def changed(self) -> bool:
        return self.desired != self.current

    def line(self) -> str:
        """One log line: ``pool cur -> new: Reason: message (signals; cap; smoothing)``.

        The cap shown is the one that bound the count, else ``max``.
        """
        details = [" ".join(f"{r.signal}={r.workers}" for r in self.recommendations) or "no signals"]
        shown_cap = self.binding_cap or next((cap for cap in self.caps if cap.cap == "max"), None)
        if shown_cap is not None:
            details.append(f"cap {shown_cap.cap}={shown_cap.workers}")
        if self.smoothing:
            details.append(", ".join(self.smoothing))
        return f"{self.pool} {self.current} -> {self.desired}: {self.reason}: {self.message} ({'; '.join(details)})"

    def __str__(self) -> str:
        return self.line()
