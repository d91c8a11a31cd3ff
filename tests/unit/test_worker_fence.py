"""The fence of a worker on a store shared by hosts: it ends the worker while the leases of
its jobs still run, and never while the store takes its renewals."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from flexiqd import Queue
from flexiqd.errors import StoreUnavailable
from flexiqd.queue.sqlite.database import SQLiteBackend
from flexiqd.queue.types import JobState
from flexiqd.worker.fence import LeaseFence
from flexiqd.worker.runtime import Worker, WorkerConfig


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_job_is_overdue_once_its_last_confirmation_is_older_than_the_bound():
    clock = Clock()
    fence = LeaseFence(2.0, lambda ids: None, clock=clock)
    fence.claimed([1, 2], 100.0)
    fence.confirm([2], 101.5)
    fence.confirm([2], 101.0)  # an older answer arriving late never moves a confirmation back
    assert fence.overdue(102.0) == []
    assert fence.overdue(102.1) == [1]
    assert fence.overdue(103.6) == [1, 2]
    fence.drop([1])
    assert fence.overdue(103.6) == [2]


def test_a_renewal_answered_after_its_job_finished_does_not_bring_the_job_back():
    # The race that would fence a healthy worker: a renewal sent while the job ran returns
    # after the job finished and was dropped.
    fence = LeaseFence(2.0, lambda ids: None)
    fence.claimed([5], 100.0)
    fence.drop([5])
    fence.confirm([5], 101.0)
    assert fence.overdue(200.0) == []


def test_the_watcher_reports_the_overdue_jobs_once():
    clock = Clock()
    breaches: list[list[int]] = []
    reported = threading.Event()
    fence = LeaseFence(0.05, lambda ids: (breaches.append(ids), reported.set()), clock=clock)
    fence.claimed([7], clock.now)
    fence.start()
    clock.now += 1.0
    assert reported.wait(5.0)
    fence.stop()
    assert breaches == [[7]]


def test_a_fence_needs_a_positive_bound():
    with pytest.raises(ValueError, match="positive"):
        LeaseFence(0.0, lambda ids: None)


class SharedStore(SQLiteBackend):
    """A SQLite store that says it is shared by hosts, and whose connection can be cut."""

    shared_by_hosts = True
    cut = False

    def renew(self, *args, **kwargs):
        if self.cut:
            raise StoreUnavailable("renew leases on the queue database failed: connection refused")
        return super().renew(*args, **kwargs)


HEARTBEAT = 1.0


def run_worker(queue: Queue, release: threading.Event, backend: SharedStore, job_id: int, *,
               cut_when_running: bool):
    """Run one worker until its job is done or its fence breaks; return (breach, lease left at it)."""
    breach: dict = {}
    fenced = threading.Event()

    def on_fence(ids):
        breach["ids"] = ids
        breach["lease_left"] = backend.get(ids[0]).lease_expires - time.time()
        fenced.set()

    worker = Worker(queue, backend, WorkerConfig(concurrency=1, idle_poll_max=0.05, heartbeat=HEARTBEAT),
                    on_fence=on_fence)

    async def main() -> None:
        runner = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 30
        while not fenced.is_set() and queue.get(job_id).state is not JobState.DONE:
            assert time.monotonic() < deadline, "neither done nor fenced in time"
            if cut_when_running and queue.get(job_id).state is JobState.RUNNING:
                backend.cut = True
            await asyncio.sleep(0.02)
        worker.request_stop()
        if fenced.is_set():
            release.set()  # let the stuck task return, as the process exit would end it
        await runner

    asyncio.run(main())
    return worker, breach


@pytest.fixture
def release():
    return threading.Event()


@pytest.fixture
def queue(tmp_path, release):
    q = Queue(f"sqlite:///{tmp_path / 'q.db'}")

    @q.task("slow")
    def slow(seconds):
        release.wait(seconds)

    yield q
    q.close()


def test_leases_follow_the_heartbeat_and_a_healthy_worker_is_never_fenced(queue, release, tmp_path):
    backend = SharedStore(str(tmp_path / "q.db"))
    try:
        # The job runs well past the fence bound: only renewals keep the fence quiet.
        job_id = queue.tasks["slow"].enqueue(3.5 * HEARTBEAT)
        worker, breach = run_worker(queue, release, backend, job_id, cut_when_running=False)
    finally:
        backend.close()
    assert breach == {}
    assert queue.get(job_id).state is JobState.DONE
    assert (worker.timing.lease, worker.timing.fence_after) == (2 * HEARTBEAT, HEARTBEAT)


def test_a_worker_cut_off_from_the_store_fences_itself_while_its_lease_still_runs(queue, release, tmp_path):
    backend = SharedStore(str(tmp_path / "q.db"))
    try:
        job_id = queue.tasks["slow"].enqueue(30.0)
        _, breach = run_worker(queue, release, backend, job_id, cut_when_running=True)
    finally:
        backend.close()
    assert breach["ids"] == [job_id]
    # Another host may take the job only once this is spent: at least the skew allowance left.
    assert breach["lease_left"] > HEARTBEAT / 2
