"""The queue's value types: what callers put in and get out of any backend."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from .limits import TenantCaps


class JobState(str, enum.Enum):
    """Where a job is in its life.

    queued -> running -> done | dead | queued (retry, release, lease expiry);
    queued | running | dead -> cancelled.  A queued job whose ``run_at`` lies
    in the future is *delayed*; only ``run_at <= now`` is *runnable* -- unless
    a worker deferred it for a full dependency: then it is *waiting for the
    dependency* until a worker claims it again (see ``Stats``).
    """

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    DEAD = "dead"
    CANCELLED = "cancelled"


FINISHED_STATES = (JobState.DONE, JobState.DEAD, JobState.CANCELLED)

# Seconds of completions behind ``Stats.recent_duration_p50``: short enough that the
# jobs in it ran with about as many workers as run now.
RECENT_WINDOW = 15.0


@dataclass(frozen=True)
class NewJob:
    """One job to enqueue.  ``payload`` must be JSON-serialisable.

    ``run_at`` (epoch seconds) wins over ``delay``; neither means "now".
    ``timeout`` bounds one attempt's run time (None: no limit).
    ``idempotency_key``: while a job with this key is queued or running, a
    second enqueue with the same key returns that job instead of a new one.
    ``from_declaration``: see ``declarations.by_name``.
    """

    task: str
    payload: Any = None
    queue: str = "default"
    priority: int = 0
    delay: float = 0.0
    run_at: float | None = None
    max_attempts: int = 3
    timeout: float | None = None
    idempotency_key: str | None = None
    tenant: str | None = None
    # Options (of ``declarations.DECLARED_OPTIONS``) the producer did not give: taken from
    # the task's declaration in the store where one is known, else the values above.
    from_declaration: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Job:
    """A job as stored.  ``attempts`` counts attempts started and not released."""

    id: int
    queue: str
    task: str
    payload: Any
    priority: int
    state: JobState
    run_at: float
    attempts: int
    max_attempts: int
    timeout: float | None
    idempotency_key: str | None
    tenant: str | None
    lease_owner: str | None
    lease_expires: float | None
    enqueued_at: float
    started_at: float | None
    finished_at: float | None
    result: Any = None
    error: str | None = None


class OutcomeKind(str, enum.Enum):
    ACK = "ack"          # finished; ``result`` is kept
    FAIL = "fail"        # raised; retried with backoff until max_attempts, then dead
    DEAD = "dead"        # cannot ever succeed (unknown task, bad payload): dead at once
    RELEASE = "release"  # not run to the end by choice (drain): runnable again, no attempt used
    DEFER = "defer"      # never started: a dependency it uses was full (see Backend.admit)


@dataclass(frozen=True)
class Outcome:
    """What a worker reports about one job it holds the lease of."""

    job_id: int
    kind: OutcomeKind
    result: Any = None
    error: str | None = None
    # DEFER only: the dependency it waits for, and the seconds until it could be admitted.
    waiting_for: str | None = None
    wait: float = 0.0

    @classmethod
    def ack(cls, job_id: int, result: Any = None) -> "Outcome":
        return cls(job_id, OutcomeKind.ACK, result=result)

    @classmethod
    def fail(cls, job_id: int, error: str) -> "Outcome":
        return cls(job_id, OutcomeKind.FAIL, error=error)

    @classmethod
    def dead(cls, job_id: int, error: str) -> "Outcome":
        return cls(job_id, OutcomeKind.DEAD, error=error)

    @classmethod
    def release(cls, job_id: int) -> "Outcome":
        return cls(job_id, OutcomeKind.RELEASE)

    @classmethod
    def defer(cls, job_id: int, deferral: "Deferral") -> "Outcome":
        return cls(job_id, OutcomeKind.DEFER, waiting_for=deferral.dependency, wait=deferral.wait)


@dataclass(frozen=True)
class Deferral:
    """``Backend.admit``'s refusal: ``dependency`` is full for about ``wait`` more seconds."""

    dependency: str
    wait: float


@dataclass(frozen=True)
class Exchanged:
    """What ``Backend.exchange`` did: the jobs it settled, the jobs it claimed, and the jobs
    it was asked to admit but could not (deferred in the same transaction, with why)."""

    settled: list[int]
    claimed: list[Job]
    refused: dict[int, Deferral] = field(default_factory=dict)


@dataclass(frozen=True)
class DependencyStats:
    """One limited dependency as the store sees it (``Backend.dependency_stats``).

    ``in_use``: jobs holding a slot now.  ``waiting``: jobs deferred for it and
    not yet due again (counted up to ``COMING_DUE_LIMIT``).
    ``hold_p50``/``hold_p95``: seconds a job held it, over the holds that ended
    in the last ``window`` seconds (None: none ended).  ``admitted_rate`` and
    ``deferred_rate``: admissions and refusals per second over the window.
    """

    dependency: str
    in_use: int
    waiting: int
    hold_p50: float | None
    hold_p95: float | None
    holds_ended: int
    admitted_rate: float
    deferred_rate: float
    window: float

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ClaimRequest:
    """Claim up to ``limit`` runnable jobs from ``queues`` (in that order of preference).

    ``tenant_caps``: the jobs of a tenant already running its cap's worth (across
    every worker sharing the store) are skipped, so other tenants' jobs are claimed
    instead.  The store keeps the caps last given, for ``Stats.held_by_tenant_cap``;
    None leaves them as they are (a worker without a config file).
    """

    owner: str
    queues: tuple[str, ...]
    limit: int
    lease_seconds: float = 30.0
    tenant_caps: TenantCaps | None = None


@dataclass(frozen=True)
class Stats:
    """What an autoscaler needs to know about one queue (or one tenant of it).

    Rates are per second over the last ``window`` seconds; durations are in
    seconds over recent completions (None when there were none; a tenant's come
    from its share of the queue's sample).
    ``oldest_runnable_age`` is the age of the oldest job that could run now,
    counted from when it became runnable (its ``run_at``); 0 when none.

    ``arrival_rate`` counts jobs as they become runnable: at enqueue, or when
    the ``run_at`` of a delayed job comes (in that second) -- jobs due tomorrow
    are not work arriving today.  A dead job revived by ``retry_dead`` arrives
    again.  A retry coming due does not: the job arrived once and completes
    once, so counting each attempt would make one job read as several arrivals
    against one completion and inflate the capacity asked for; its failed
    attempts show in ``failure_rate`` and its wait in ``runnable``.
    ``tenants`` has the named tenants with jobs queued, running or dead, or with
    events in the window.

    ``coming_due``: delayed jobs whose run-at falls within the next
    ``coming_due_within`` seconds (the horizon asked for; 0: not asked), counted
    up to ``COMING_DUE_LIMIT`` -- a forecast of work to start workers for.
    ``next_due``: the run-at of the delayed job that comes due first (None:
    none delayed), so a reader can look again then.
    ``running_age_mean``: how long the running jobs have run so far, on average
    (None: none running).  ``recent_duration_p50``, ``recent_duration_p95`` and
    ``recent_completions``: the p50 and p95 durations and the count of the jobs
    of the duration sample that finished in the last ``RECENT_WINDOW`` seconds --
    the durations of now, where the percentiles above span minutes.
    ``completion_series``: (second, jobs completed in it) over the same
    seconds, oldest first, seconds without completions left out -- what lets a
    reader count the completions between any two instants of the last few
    seconds (the knee's evidence).  All of the whole queue, not given per
    tenant.

    ``waiting_for_dependency``: queued jobs a worker deferred because a
    dependency they use was at its limit (``Backend.admit``), until a worker
    claims one again (it may be claimed once its short wait is over).  They
    are in none of ``runnable``, ``delayed``, ``coming_due`` and
    ``oldest_runnable_age``: more workers would not start them sooner, so an
    autoscaler must not count them as work to scale for.  They do not count
    as arrivals again.

    ``held_by_tenant_cap``: due jobs of tenants that run as many jobs as their
    cap allows (``ClaimRequest.tenant_caps``, the caps the workers last claimed
    with): a tenant with a cap of c, r jobs running (in every queue of the
    store) and q due jobs here has max(0, q - max(0, c - r)) of them held.
    Like the jobs waiting for a dependency, they are in none of ``runnable``
    and ``oldest_runnable_age`` (a tenant whose due jobs are all held has no
    oldest runnable job): more workers would not start them sooner.

    Every queued job is in exactly one of runnable, delayed,
    waiting_for_dependency, held_by_tenant_cap.
    """

    queue: str
    runnable: int
    delayed: int
    running: int
    dead: int
    oldest_runnable_age: float
    arrival_rate: float
    completion_rate: float
    failure_rate: float
    duration_p50: float | None
    duration_p95: float | None
    duration_p99: float | None
    window: float
    tenants: dict[str, "Stats"] = field(default_factory=dict)
    coming_due: int = 0
    coming_due_within: float = 0.0
    running_age_mean: float | None = None
    recent_duration_p50: float | None = None
    recent_completions: int = 0
    next_due: float | None = None
    recent_window: float = RECENT_WINDOW
    waiting_for_dependency: int = 0
    held_by_tenant_cap: int = 0
    completion_series: tuple[tuple[int, int], ...] = ()
    recent_duration_p95: float | None = None

    @property
    def time_to_drain(self) -> float | None:
        """Runnable depth / completion rate: None when nothing completes."""
        if self.runnable == 0:
            return 0.0
        if self.completion_rate <= 0:
            return None
        return self.runnable / self.completion_rate

    def as_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "tenants"}
        data["time_to_drain"] = self.time_to_drain
        data["tenants"] = {name: t.as_dict() for name, t in self.tenants.items()}
        return data
