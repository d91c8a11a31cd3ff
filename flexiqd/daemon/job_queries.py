"""Looking up jobs for an operator (the D-Bus API's ``Jobs`` and ``Job``): the query, the answers.

Pure: a query is checked here (``ControlError`` names the bad field), the store is
asked by the caller, and the answers are JSON-able documents.  A job's payload,
result and error are the producers' data, so only root and the steering group
(``flexiq-admin``) may make these calls (flexiqd/dbus/service.py checks).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence

from ..errors import ControlError
from ..queue.types import Job, JobState

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
_TEXT_FIELDS = ("queue", "task", "tenant")


@dataclasses.dataclass(frozen=True)
class JobQuery:
    """Which jobs, newest first: each filter None when not asked; ``before`` pages."""

    queue: str | None = None
    task: str | None = None
    state: JobState | None = None
    tenant: str | None = None
    before: int | None = None
    limit: int = DEFAULT_LIMIT


def parse_query(text: str) -> JobQuery:
    """A ``Jobs`` query from its JSON text (``{}``: the newest jobs of every queue)."""
    try:
        data = json.loads(text or "{}")
    except ValueError as exc:
        raise ControlError(f"the query is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ControlError("the query must be a JSON object such as {\"queue\": \"mail\", \"state\": \"dead\"}")
    known = {field.name for field in dataclasses.fields(JobQuery)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ControlError(f"the query has no field {unknown[0]!r} (known: {', '.join(sorted(known))})")
    fields: dict[str, Any] = {}
    for name in _TEXT_FIELDS:
        value = data.get(name)
        if value is not None and (not isinstance(value, str) or (not value and name != "tenant")):
            raise ControlError(f"{name} must be a non-empty string or null, got {value!r}")
        fields[name] = value
    state = data.get("state")
    if state is not None:
        try:
            fields["state"] = JobState(state)
        except ValueError:
            raise ControlError(f"state must be one of {', '.join(s.value for s in JobState)}, got {state!r}") from None
    before = data.get("before")
    if before is not None and (not isinstance(before, int) or isinstance(before, bool) or before < 1):
        raise ControlError(f"before must be a job id (a positive whole number) or null, got {before!r}")
    fields["before"] = before
    limit = data.get("limit", DEFAULT_LIMIT)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise ControlError(f"limit must be a whole number from 1 to {MAX_LIMIT}, got {limit!r}")
    fields["limit"] = limit
    return JobQuery(**fields)


def job_summary(job: Job) -> dict[str, Any]:
    """A job in a list: what it is and where it stands, not its arguments or result."""
    return {"id": job.id, "queue": job.queue, "task": job.task, "state": job.state.value, "tenant": job.tenant,
            "priority": job.priority, "attempts": job.attempts, "max_attempts": job.max_attempts,
            "enqueued_at": job.enqueued_at, "run_at": job.run_at, "started_at": job.started_at,
            "finished_at": job.finished_at, "error": job.error}


def page_document(jobs: Sequence[Job], query: JobQuery) -> dict[str, Any]:
    """``Jobs``' answer; ``next`` is the ``before`` of the next page (None: this is the last)."""
    full = len(jobs) == query.limit
    return {"jobs": [job_summary(job) for job in jobs], "next": jobs[-1].id if full and jobs else None}


def job_document(job: Job, attempts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``Job``'s answer: the job whole, and each of its recorded attempts."""
    document = job_summary(job)
    document.update(payload=job.payload, result=job.result, lease_owner=job.lease_owner, timeout=job.timeout,
                    idempotency_key=job.idempotency_key)
    return {"job": document,
            "attempts": [{key: row.get(key) for key in ("attempt", "worker", "started_at", "finished_at",
                                                        "outcome", "error")} for row in attempts]}
