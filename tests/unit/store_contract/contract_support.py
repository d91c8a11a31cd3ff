"""What every topic of the store's contract shares: the time, the lease, and short ways to
enqueue, claim and look at jobs."""

from __future__ import annotations

from flexiqd.queue import ClaimRequest, NewJob, Outcome

T0 = 1_700_000_000.0
LEASE = 30.0


def enqueue(backend, n=1, *, now=T0, **fields):
    return backend.enqueue([NewJob(task="t", payload=i, **fields) for i in range(n)], now=now)


def claim(backend, owner="w1", limit=100, *, now=T0, queues=("default",), lease=LEASE):
    return backend.claim(ClaimRequest(owner=owner, queues=tuple(queues), limit=limit,
                                      lease_seconds=lease), now=now)


def ids_of(jobs):
    return [job.id for job in jobs]


def all_jobs(backend):
    return backend.list_jobs(limit=1_000_000)


def outcomes(backend, job_id):
    return [row["outcome"] for row in backend.executions(job_id=job_id)]


def dead_jobs(backend, n, queue="default", now=T0):
    """``n`` jobs that failed their one attempt: dead letters."""
    ids = enqueue(backend, n, queue=queue, max_attempts=1, now=now)
    claim(backend, "w1", queues=(queue,), now=now)
    backend.settle("w1", [Outcome.fail(job_id, "boom") for job_id in ids], now=now)
    return ids
