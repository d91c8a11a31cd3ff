"""Hostile tasks against real worker processes: a drain never runs a job twice at once.

The tasks (tests/apps/hostile_app.py) block in C past the drain budget, fork a
child that ignores SIGTERM, daemonise a grandchild, loop forever swallowing
every exception, or raise from a ``finally``.  Every execution holds a per-job
``flock`` for as long as anything runs it, so a second execution that starts
while the first still runs leaves an ``overlap`` mark: the tests count
executions and overlaps from the tasks' own marks, not from the store.

Outside systemd nobody recovers a dead worker's jobs but the store itself: a
lease that expired and whose owner is no longer a live process is recovered by
the next claim.  The workers here use 1 s leases so that happens quickly.
"""

from __future__ import annotations

import collections
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from flexiqd import Queue
from flexiqd.fleet.base import WorkerSpec
from flexiqd.fleet.process import ProcessFleet
from flexiqd.queue.types import JobState, NewJob

from .conftest import APPS, REPO, wait_for

DRAIN = 0.5
# What a fleet gives a worker to stop: the drain budget plus a grace (fleet/base.py's rule).
STOP_TIMEOUT = DRAIN + 10.0
HOSTILE = {  # task -> args: every first execution outlives the drain budget by far
    "sleep_in_c": [8.0],
    "recv_in_c": [8.0],
    "child_ignoring_term": [8.0],
    "daemonized_grandchild": [8.0],
    "loop_forever": [],
    "raise_in_finally": [8.0],
}


class Marks:
    """What the hostile tasks wrote: starts, ends and overlaps per job."""

    def __init__(self, directory: pathlib.Path) -> None:
        self.directory = directory

    def lines(self) -> list[list[str]]:
        return [line.split() for log in self.directory.glob("*.log") for line in log.read_text().splitlines()]

    def count(self, what: str) -> collections.Counter:
        return collections.Counter(int(fields[1]) for fields in self.lines() if fields[0] == what)


class HostileWorkers:
    """``flexiq worker`` processes (or a process fleet's) running the hostile app."""

    def __init__(self, url: str, tmp: pathlib.Path) -> None:
        self.url = url
        self.marks = Marks(tmp / "marks")
        self.marks.directory.mkdir()
        self.logs = tmp / "logs"
        self.logs.mkdir()
        self.procs: list[subprocess.Popen] = []
        self.fleet = ProcessFleet(log_dir=str(self.logs))

    @property
    def environment(self) -> dict[str, str]:
        return {"FLEXIQ_TEST_MARKS": str(self.marks.directory),
                "PYTHONPATH": os.pathsep.join([str(APPS), str(REPO)])}

    def start(self, *extra: str, concurrency: int = len(HOSTILE), drain: float = DRAIN,
              env: dict[str, str] | None = None, preexec_mask: set[int] | None = None) -> subprocess.Popen:
        environment = dict(os.environ, **self.environment, **(env or {}))
        environment.pop("NOTIFY_SOCKET", None)
        log = open(self.logs / f"worker-{len(self.procs)}.log", "wb")
        command = [sys.executable, "-m", "flexiqd.cli.flexiq", "--url", self.url, "worker",
                   "--app", "hostile_app:queue", "--concurrency", str(concurrency), "--lease", "1s",
                   "--drain-timeout", f"{drain:g}", *extra]
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, preexec_mask) if preexec_mask else None
        try:
            proc = subprocess.Popen(command, env=environment, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=str(REPO))
        finally:
            if old_mask is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        log.close()
        self.procs.append(proc)
        return proc

    def spawn_in_fleet(self, index: int, concurrency: int = len(HOSTILE)) -> int:
        spec = WorkerSpec(pool="hostile", app="hostile_app:queue", queues=("default",),
                          concurrency=concurrency, drain_timeout=DRAIN, lease_seconds=1.0,
                          store_url=self.url, environment=self.environment)
        return self.fleet.spawn(spec, index)

    def log_text(self, index: int) -> str:
        return (self.logs / f"worker-{index}.log").read_text()

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.fleet.kill_all()


@pytest.fixture
def store(tmp_path: pathlib.Path) -> str:
    return f"sqlite:///{tmp_path / 'queue.db'}"


@pytest.fixture
def queue(store: str):
    q = Queue(store)
    yield q
    q.close()


@pytest.fixture
def hostile(store: str, tmp_path: pathlib.Path):
    workers = HostileWorkers(store, tmp_path)
    yield workers
    workers.stop_all()


def enqueue_hostile(queue: Queue, **options) -> dict[int, str]:
    ids = queue.enqueue_many([NewJob(task=task, payload={"args": args, "kwargs": {}}, **options)
                              for task, args in HOSTILE.items()])
    return dict(zip(ids, HOSTILE))


def stop_within(proc: subprocess.Popen, timeout: float) -> tuple[int, float]:
    """SIGTERM ``proc``; its exit code and how long it took, failing if it outlives ``timeout``."""
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the worker did not exit within its stop timeout ({timeout:g}s)") from None
    return code, time.monotonic() - began


@pytest.mark.parametrize("launch", ["flexiq worker", "process fleet"])
def test_a_drain_past_its_budget_never_runs_a_hostile_job_twice_at_once(queue, hostile, launch):
    jobs = enqueue_hostile(queue)
    first = hostile.start() if launch == "flexiq worker" else hostile.spawn_in_fleet(1)
    wait_for(lambda: len(hostile.marks.count("start")) == len(jobs), 30, "every hostile job to start")
    # A second worker is polling already: anything the first lets go of, it claims at once.
    second = hostile.start()
    if launch == "process fleet":
        # Drain-stop (SIGUSR1, SIGTERM) and wait; one that outlives its stop timeout is killed
        # and listed as failed, as is one that exits with an error.
        hostile.fleet.shutdown("hostile", timeout=STOP_TIMEOUT)
        assert hostile.fleet.list() == []
    else:
        assert stop_within(first, STOP_TIMEOUT)[0] == 0

    wait_for(lambda: all(queue.get(i).state is JobState.DONE for i in jobs), 60,
             "every hostile job to be recovered and completed")
    assert stop_within(second, STOP_TIMEOUT)[0] == 0
    assert hostile.marks.count("overlap") == {}, "a job ran twice at the same time"
    assert hostile.marks.count("start") == {i: 2 for i in jobs}  # once cut short, once whole
    for job_id in jobs:
        job = queue.get(job_id)
        assert job.attempts == 1, f"{jobs[job_id]}: a drain used an attempt"


def test_a_task_past_its_timeout_holds_its_job_until_its_thread_returns_then_fails(queue, hostile):
    # The first execution blocks in C for 3 s against a 0.3 s timeout: the attempt fails, and
    # its retry starts only once that thread has returned -- never beside it.
    job_id = queue.enqueue_many([NewJob(task="sleep_in_c", payload={"args": [3.0], "kwargs": {}},
                                        timeout=0.3, max_attempts=2)])[0]
    first = hostile.start(concurrency=2)
    second = hostile.start(concurrency=2)
    wait_for(lambda: queue.get(job_id).state is JobState.DONE, 60, "the job to fail once, then finish")
    for proc in (first, second):
        assert stop_within(proc, STOP_TIMEOUT)[0] == 0
    assert hostile.marks.count("overlap") == {}
    assert hostile.marks.count("start")[job_id] == 2
    outcomes = [row["outcome"] for row in queue.backend.executions(job_id=job_id)]
    assert outcomes == ["fail", "ack"]
    assert "timed out after 0.3s" in queue.backend.executions(job_id=job_id)[0]["error"]


def test_a_worker_whose_every_slot_is_stuck_exits_at_once_and_its_job_fails_once_it_is_gone(queue, hostile):
    job_id = queue.enqueue_many([NewJob(task="loop_forever", payload={"args": [], "kwargs": {}},
                                        timeout=0.3, max_attempts=2)])[0]
    stuck = hostile.start(concurrency=1)
    # Timeout, then the interrupt's grace: the worker gives up on itself.
    assert stuck.wait(timeout=STOP_TIMEOUT) == 70, "the stuck worker did not exit (EX_SOFTWARE)"
    assert "exiting so a fresh worker takes over" in hostile.log_text(0)
    survivor = hostile.start(concurrency=1)
    wait_for(lambda: queue.get(job_id).state is JobState.DONE, 60, "the job to be retried")
    assert stop_within(survivor, STOP_TIMEOUT)[0] == 0
    assert hostile.marks.count("overlap") == {}
    job = queue.get(job_id)
    assert job.attempts == 2  # the timed-out attempt counted
    assert [row["outcome"] for row in queue.backend.executions(job_id=job_id)] == ["fail", "ack"]
