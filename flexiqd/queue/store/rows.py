"""A job as a row, and a row as a job: the one encoding both SQL dialects store.

How a job's life is stored, in both stores (the dialects' partial indexes repeat
these terms, so each hot path is one index range):

- *runnable*: ``state = 'queued'``, not ``delayed``, ``waiting_for`` NULL;
- *delayed*: ``state = 'queued'``, ``delayed``, ``waiting_for`` NULL -- waiting for its
  run_at; promotion (``Store._promote``) makes it runnable and counts its arrival;
- *waiting for a dependency*: ``state = 'queued'``, ``waiting_for`` = the dependency a
  worker deferred it for; ``delayed`` until the wait it was told is over, then
  claimable again -- but left out of the oldest runnable job all along (more
  workers would not start it sooner);
- *running*: leased to ``lease_owner`` until ``lease_expires``; ``lease_outcome``
  is what its owner asked for should it exit first (``Backend.abandon``);
- *done*, *dead*, *cancelled*: finished at ``finished_at``.

The depth counts are kept per (queue, bucket, tenant), the bucket being the state,
or "delayed" / "waiting" for a queued job that is not runnable.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from ...errors import PayloadError, QueueError
from ..types import Job, JobState, NewJob

# The columns a Job is read from, in ``job_from_row``'s order.
JOB_COLUMNS = ("id, queue, task, payload, priority, state, run_at, attempts, max_attempts, "
               "timeout, idempotency_key, tenant, lease_owner, lease_expires, enqueued_at, "
               "started_at, finished_at, result, error")
# The columns of a new job, in ``new_row``'s keys.
NEW_JOB_COLUMNS = ("queue", "task", "payload", "priority", "state", "delayed", "run_at",
                   "max_attempts", "timeout", "idempotency_key", "tenant", "enqueued_at")


def encode_json(value: Any, what: str) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"{what} is not JSON-serialisable: {exc}") from None


def decode_json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        # A row written by something else: surface it rather than crash the reader.
        return {"undecodable": text}


def new_row(job: NewJob, now: float, clock_error: float = 0.0) -> dict[str, Any]:
    """The row of a job to enqueue (``NEW_JOB_COLUMNS``), checked and encoded; QueueError or
    PayloadError naming what is wrong.  A delay counts from the latest the store's time can be
    (``now`` may be ``clock_error`` behind it): the job is never due before its delay passed."""
    if not job.task:
        raise QueueError("a job needs a task name")
    if job.max_attempts < 1:
        raise QueueError(f"max_attempts must be at least 1, got {job.max_attempts}")
    if job.run_at is not None:
        run_at = float(job.run_at)
    else:
        run_at = now + (clock_error + job.delay if job.delay > 0 else 0.0)
    return {"queue": job.queue, "task": job.task,
            "payload": encode_json(job.payload, f"the payload of {job.task}"),
            "priority": job.priority, "state": JobState.QUEUED.value, "delayed": run_at > now,
            "run_at": run_at, "max_attempts": job.max_attempts,
            "timeout": float(job.timeout) if job.timeout is not None else None,
            "idempotency_key": job.idempotency_key, "tenant": job.tenant or "",
            "enqueued_at": float(now)}


def job_from_row(row: Sequence[Any]) -> Job:
    """A Job from a row of ``JOB_COLUMNS``."""
    (id_, queue, task, payload, priority, state, run_at, attempts, max_attempts, timeout,
     key, tenant, owner, expires, enqueued, started, finished, result, error) = row
    return Job(id=id_, queue=queue, task=task, payload=decode_json(payload), priority=priority,
               state=JobState(state), run_at=run_at, attempts=attempts, max_attempts=max_attempts,
               timeout=timeout, idempotency_key=key, tenant=tenant or None, lease_owner=owner,
               lease_expires=expires, enqueued_at=enqueued, started_at=started,
               finished_at=finished, result=decode_json(result), error=error)


def in_claim_order(jobs: list[Job]) -> list[Job]:
    """``jobs`` sorted as a claim walks them: priority, then run_at, then id."""
    jobs.sort(key=lambda j: (-j.priority, j.run_at, j.id))
    return jobs
