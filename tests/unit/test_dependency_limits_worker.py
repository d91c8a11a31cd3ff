"""The worker's side of dependency limits, in-process on a real SQLite store: a refused job is
deferred and its slot goes to other work; a store that refuses admission gets the job back."""

from __future__ import annotations

import threading
import time

from flexiqd.errors import QueueError
from flexiqd.queue.limits import DependencyLimit
from flexiqd.queue.types import JobState
from flexiqd.worker.runtime import WorkerConfig

from test_worker import queue, run_until, state  # noqa: F401 - the fixture is used by name


def test_a_refused_job_waits_while_its_slot_runs_other_work(queue):  # noqa: F811
    inside, release = threading.Event(), threading.Event()

    @queue.task("sync", uses=["partner_api"])
    def sync():
        inside.set()
        release.wait(10)

    @queue.task("other")
    def other():
        return "ran"

    first, second = sync.enqueue(), sync.enqueue()
    free = [other.enqueue() for _ in range(3)]
    config = WorkerConfig(concurrency=2, idle_poll_max=0.05,
                          dependency_limits={"partner_api": DependencyLimit("partner_api", concurrency=1)})

    def everything_else_done():
        return inside.is_set() and all(state(queue, i) is JobState.DONE for i in free)

    def one_inside_one_waiting():
        jobs = [queue.get(first), queue.get(second)]
        return sorted((job.state.value, job.attempts) for job in jobs) == [("queued", 0), ("running", 1)]

    def finish(worker):
        # The other slot ran the free jobs; the second sync job waited (now and then claimed
        # and deferred again for a moment) and never used an attempt.  Only now may the
        # first call return.
        deadline = time.monotonic() + 10
        while not one_inside_one_waiting():
            assert time.monotonic() < deadline, "never one job inside and one waiting"
            time.sleep(0.005)
        release.set()

    worker, _, code = run_until(queue, everything_else_done, config=config, before_stop=finish)
    assert code == 0 and worker.counters.deferred >= 1
    assert state(queue, free[0]) is JobState.DONE


def test_jobs_the_store_cannot_admit_are_handed_back_not_run(queue, monkeypatch):  # noqa: F811
    ran = []

    @queue.task("sync", uses=["partner_api"])
    def sync():
        ran.append(1)

    job = sync.enqueue()
    config = WorkerConfig(concurrency=1, idle_poll_max=0.05,
                          dependency_limits={"partner_api": DependencyLimit("partner_api", rate=5.0)})
    from flexiqd.queue.sqlite.database import SQLiteBackend

    exchange = SQLiteBackend.exchange

    def refuse(self, owner, outcomes, request, *, admit=(), now):
        if admit:
            raise QueueError(f"{self.url}: this store does not enforce dependency limits")
        return exchange(self, owner, outcomes, request, now=now)

    monkeypatch.setattr(SQLiteBackend, "exchange", refuse)
    started = time.monotonic()
    worker, _, code = run_until(queue, lambda: time.monotonic() - started > 0.5, config=config)
    assert code == 0 and ran == []
    job_now = queue.get(job)
    assert (job_now.state, job_now.attempts) == (JobState.QUEUED, 0)
