"""The worker's claim loop in-process, on a real SQLite store in a temp dir."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from flexiqd import Queue
from flexiqd.queue.types import JobState
from flexiqd.worker.execution import current_job
from flexiqd.worker.runtime import Worker, WorkerConfig


class RecordingNotifier:
    def __init__(self) -> None:
        self.messages: list[str] = []

    def ready(self, status=None): self.messages.append("READY=1")
    def status(self, text): self.messages.append(f"STATUS={text}")
    def stopping(self, status=None): self.messages.append("STOPPING=1")
    def watchdog(self): self.messages.append("WATCHDOG=1")
    def extend_timeout(self, seconds): self.messages.append(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}")


@pytest.fixture
def queue(tmp_path):
    q = Queue(f"sqlite:///{tmp_path / 'q.db'}")
    yield q
    q.close()


def run_until(queue: Queue, predicate, *, config: WorkerConfig | None = None, timeout: float = 20.0,
              before_stop=None) -> tuple[Worker, RecordingNotifier, int]:
    """Run a worker on a fresh connection until ``predicate()``; then stop it and return."""
    from flexiqd.queue.url import open_backend

    notifier = RecordingNotifier()
    backend = open_backend(queue.url)
    worker = Worker(queue, backend, config or WorkerConfig(concurrency=4, idle_poll_max=0.05),
                    notifier=notifier)

    async def main() -> int:
        runner = asyncio.create_task(worker.run())
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "condition not reached in time"
            assert not runner.done(), f"worker exited early with {runner.result()}"
            await asyncio.sleep(0.02)
        if before_stop:
            before_stop(worker)
        worker.request_stop()
        return await runner

    try:
        code = asyncio.run(main())
    finally:
        backend.close()
    return worker, notifier, code


def state(queue: Queue, job_id: int) -> JobState:
    return queue.get(job_id).state


def test_runs_sync_and_async_tasks_and_stores_results(queue):
    @queue.task("add")
    def add(a, b):
        return a + b

    @queue.task("mul")
    async def mul(a, b):
        await asyncio.sleep(0)
        return a * b

    one, two = add.enqueue(2, 3), mul.enqueue(4, 5)
    _, notifier, code = run_until(queue, lambda: state(queue, two) is JobState.DONE
                                  and state(queue, one) is JobState.DONE)
    assert code == 0
    assert queue.get(one).result == 5 and queue.get(two).result == 20
    assert notifier.messages[0] == "READY=1" and "STOPPING=1" in notifier.messages


def test_never_runs_more_than_concurrency_jobs_at_once(queue):
    running, peak, lock = [0], [0], threading.Lock()

    @queue.task("slow")
    def slow():
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1

    ids = slow.map([()] * 20)
    run_until(queue, lambda: all(state(queue, i) is JobState.DONE for i in ids),
              config=WorkerConfig(concurrency=3, idle_poll_max=0.05))
    assert peak[0] == 3


def test_a_raising_task_is_retried_then_dead_lettered_with_its_error(queue):
    @queue.task("boom", max_attempts=2)
    def boom():
        raise ValueError("bad input 42")

    job_id = boom.enqueue()
    # Retries wait a jittered backoff of up to 1 s after the first failure.
    run_until(queue, lambda: state(queue, job_id) is JobState.DEAD)
    job = queue.get(job_id)
    assert job.attempts == 2 and "ValueError: bad input 42" in job.error
    assert [r["outcome"] for r in queue.backend.executions(job_id=job_id)] == ["fail", "fail"]


def test_unknown_task_and_malformed_payload_are_dead_at_once_with_the_reason(queue):
    unknown = queue.enqueue("no.such.task")
    from flexiqd.queue.types import NewJob

    malformed = queue.enqueue_many([NewJob(task="known", payload=[1, 2])])[0]

    @queue.task("known")
    def known(*args):
        return args

    run_until(queue, lambda: state(queue, unknown) is JobState.DEAD and state(queue, malformed) is JobState.DEAD)
    assert "unknown task 'no.such.task'" in queue.get(unknown).error
    assert queue.get(unknown).attempts == 1
    assert "payload" in queue.get(malformed).error


def test_a_result_that_is_not_json_is_dead_not_retried(queue):
    @queue.task("weird")
    def weird():
        return object()

    job_id = weird.enqueue()
    run_until(queue, lambda: state(queue, job_id) is JobState.DEAD)
    assert "not JSON" in queue.get(job_id).error and queue.get(job_id).attempts == 1


def test_timeouts_fail_the_job_and_free_the_slot_for_others(queue):
    @queue.task("hang_async", timeout=0.2, max_attempts=1)
    async def hang_async():
        await asyncio.sleep(60)

    @queue.task("hang_sync", timeout=0.2, max_attempts=1)
    def hang_sync():
        for _ in range(6000):  # pure Python: interruptible
            time.sleep(0.01)

    @queue.task("quick")
    def quick():
        return "ok"

    hung = [hang_async.enqueue(), hang_sync.enqueue()]
    after = quick.enqueue()
    run_until(queue, lambda: state(queue, after) is JobState.DONE
              and all(state(queue, i) is JobState.DEAD for i in hung),
              config=WorkerConfig(concurrency=2, idle_poll_max=0.05))
    for job_id in hung:
        assert "timed out after 0.2s" in queue.get(job_id).error


def test_current_job_is_visible_inside_tasks(queue):
    seen = {}

    @queue.task("who")
    def who():
        job = current_job()
        seen["id"], seen["attempts"] = job.id, job.attempts

    job_id = who.enqueue()
    run_until(queue, lambda: state(queue, job_id) is JobState.DONE)
    assert seen == {"id": job_id, "attempts": 1}


def test_drain_finishes_jobs_within_budget_and_extends_systemds_timeout(queue):
    started = threading.Event()

    @queue.task("work")
    def work():
        started.set()
        time.sleep(0.5)
        return "finished"

    job_id = work.enqueue()
    _, notifier, code = run_until(queue, started.is_set,
                                  config=WorkerConfig(concurrency=1, drain_timeout=10, idle_poll_max=0.05))
    assert code == 0
    assert state(queue, job_id) is JobState.DONE
    assert any(m.startswith("EXTEND_TIMEOUT_USEC=") for m in notifier.messages)


def test_drain_past_its_budget_releases_unfinished_jobs_without_using_an_attempt(queue):
    started = threading.Event()

    @queue.task("long")
    async def long():
        started.set()
        await asyncio.sleep(60)

    job_id = long.enqueue()
    _, _, code = run_until(queue, started.is_set,
                           config=WorkerConfig(concurrency=1, drain_timeout=0.2, idle_poll_max=0.05))
    assert code == 0
    job = queue.get(job_id)
    assert job.state is JobState.QUEUED and job.attempts == 0 and job.lease_owner is None
    assert [r["outcome"] for r in queue.backend.executions(job_id=job_id)] == ["release"]


def test_pause_stops_claiming_and_resume_starts_again(queue):
    from flexiqd.queue.url import open_backend

    @queue.task("quick")
    def quick():
        return "ok"

    job_id = quick.enqueue()
    backend = open_backend(queue.url)
    worker = Worker(queue, backend, WorkerConfig(concurrency=2, idle_poll_max=0.05), notifier=RecordingNotifier())
    worker.pause()

    async def main():
        runner = asyncio.create_task(worker.run())
        await asyncio.sleep(0.5)
        while_paused = state(queue, job_id)
        worker.resume()
        deadline = time.monotonic() + 10
        while state(queue, job_id) is not JobState.DONE and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        worker.request_stop()
        await runner
        return while_paused

    try:
        assert asyncio.run(main()) is JobState.QUEUED
    finally:
        backend.close()
    assert state(queue, job_id) is JobState.DONE


def test_prefetch_is_about_fifty_milliseconds_of_work_and_none_for_long_jobs(queue):
    from flexiqd.queue.url import open_backend

    backend = open_backend(queue.url)
    try:
        worker = Worker(queue, backend, WorkerConfig(concurrency=4), notifier=RecordingNotifier())
        assert worker._prefetch_allowance() == 0          # nothing known yet: no prefetch
        worker._mean_run = 1.0
        assert worker._prefetch_allowance() == 0          # long jobs: claim only what can run
        worker._mean_run = 0.01
        assert worker._prefetch_allowance() == 20         # 4 slots x 50 ms / 10 ms
        worker._mean_run = 0.0001
        assert worker._prefetch_allowance() == 32         # capped
        worker.pause()
        assert worker._prefetch_allowance() == 0
    finally:
        backend.close()


def test_a_drain_releases_prefetched_jobs_at_once_without_using_attempts(queue):
    from flexiqd.queue.url import open_backend

    gate = threading.Event()

    @queue.task("gated")
    def gated():
        gate.wait(10)

    ids = gated.map([()] * 40)
    backend = open_backend(queue.url)
    worker = Worker(queue, backend, WorkerConfig(concurrency=2, drain_timeout=10, idle_poll_max=0.05),
                    notifier=RecordingNotifier())
    worker._mean_run = 0.001  # as if earlier jobs were quick: it prefetches

    async def main():
        runner = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 10
        while queue.stats().running < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        prefetched = queue.stats().running
        worker.request_stop()
        await asyncio.sleep(0.3)
        gate.set()
        await runner
        return prefetched

    try:
        prefetched = asyncio.run(main())
    finally:
        backend.close()
    assert prefetched == 34  # 2 running + 32 held
    jobs = [queue.get(i) for i in ids]
    assert sum(j.state is JobState.DONE for j in jobs) == 2
    assert all(j.state is JobState.QUEUED and j.attempts == 0 for j in jobs if j.state is not JobState.DONE)
    outcomes = [r["outcome"] for r in queue.backend.executions()]
    assert outcomes.count("release") == 32 and outcomes.count("ack") == 2


def test_the_worker_pings_the_watchdog_when_systemd_asks(queue, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "100000")  # WatchdogSec=100ms: ping every 50 ms
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    started = time.monotonic()
    _, notifier, code = run_until(queue, lambda: time.monotonic() - started > 0.4)
    assert code == 0 and notifier.messages.count("WATCHDOG=1") >= 4


@pytest.mark.slow
def test_a_timeout_interrupt_only_ever_hits_the_job_it_was_meant_for(queue):
    # Jobs that time out just as they return, interleaved with jobs without a timeout on the
    # same threads: an interrupt that comes late must vanish, not land in the next job (a
    # failure), in the pool's own code (a lost thread: the backlog never drains) or in the
    # run's bookkeeping (a slot lost for good).  Frequent thread switches widen the windows.
    import sys

    def spin():
        deadline = time.perf_counter() + 0.001
        while time.perf_counter() < deadline:
            pass

    racer = queue.task("racer", timeout=0.001, max_attempts=1)(spin)
    innocent = queue.task("innocent", max_attempts=1)(lambda: spin())
    ids = queue.enqueue_many([job for _ in range(2000) for job in (racer.new_job(), innocent.new_job())])
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    try:
        worker, _, code = run_until(
            queue, lambda: queue.stats().runnable == 0 and queue.stats().running == 0,
            config=WorkerConfig(concurrency=4, idle_poll_max=0.05), timeout=60)
    finally:
        sys.setswitchinterval(old)
    assert code == 0
    hit = [queue.get(i).error for i in ids[1::2] if queue.get(i).state is not JobState.DONE]
    assert hit == [], f"{len(hit)} jobs without a timeout were interrupted: {hit[:1]}"
    assert worker.running_jobs() == [], "a finished job still holds a slot"


def test_a_timed_out_task_keeps_its_slot_and_lease_until_its_thread_returns(queue):
    unblock = threading.Event()
    runs, running, overlaps = [0], [0], [0]
    lock = threading.Lock()

    @queue.task("stubborn", timeout=0.1, max_attempts=2)
    def stubborn():
        with lock:
            runs[0] += 1
            running[0] += 1
            overlaps[0] += running[0] > 1
            first = runs[0] == 1
        try:
            if first:
                unblock.wait(30)  # blocks in C: the interrupt cannot land until it returns
        finally:
            with lock:
                running[0] -= 1

    job_id = stubborn.enqueue()
    seen = {}

    def timed_out_and_renewed(worker):
        job = queue.get(job_id)
        if worker.counters.timed_out == 0 or job.lease_expires is None:
            return False
        seen.setdefault("lease", job.lease_expires)  # the lease when the timeout hit...
        return job.lease_expires > seen["lease"]       # ...renewed since

    def check_then_unblock(worker):
        job = queue.get(job_id)
        seen["while_blocked"] = (job.state, job.lease_owner, worker._free_slots())
        unblock.set()

    from flexiqd.queue.url import open_backend

    backend = open_backend(queue.url)
    config = WorkerConfig(concurrency=1, lease_seconds=0.3, idle_poll_max=0.05)
    worker = Worker(queue, backend, config, notifier=RecordingNotifier())

    async def main():
        runner = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 20
        while not timed_out_and_renewed(worker):
            assert time.monotonic() < deadline and not runner.done()
            await asyncio.sleep(0.02)
        check_then_unblock(worker)
        while queue.get(job_id).state is not JobState.DONE:
            assert time.monotonic() < deadline + 10 and not runner.done()
            await asyncio.sleep(0.02)
        worker.request_stop()
        return await runner

    try:
        assert asyncio.run(main()) == 0
    finally:
        backend.close()
    assert seen["while_blocked"] == (JobState.RUNNING, config.name, 0)
    assert overlaps[0] == 0 and runs[0] == 2
    assert [r["outcome"] for r in queue.backend.executions(job_id=job_id)] == ["fail", "ack"]


# -- what becomes of a run --------------------------------------------------------------------

def _job(job_id=1, timeout=None):
    from flexiqd.queue.types import Job

    return Job(id=job_id, queue="default", task="t", payload=None, priority=0, state=JobState.RUNNING,
               run_at=0.0, attempts=1, max_attempts=3, timeout=timeout, idempotency_key=None,
               tenant=None, lease_owner="h:w:1", lease_expires=1.0, enqueued_at=0.0,
               started_at=0.0, finished_at=None)


@pytest.mark.parametrize("returned, error, timed_out, given_up, kind", [
    (True, None, False, False, "ack"),          # returned
    (False, ValueError("x"), False, False, "fail"),  # raised on its own
    (True, None, True, False, "fail"),          # past its timeout: fails even though it returned
    (False, None, True, True, "fail"),          # timed out, then given up at a drain's end
    (False, RuntimeError("in finally"), False, True, "release"),  # ended by the drain's interrupt
    (True, None, False, True, "ack"),           # returned before the interrupt landed
])
def test_how_a_run_ended_decides_its_outcome(returned, error, timed_out, given_up, kind):
    from flexiqd.worker.execution import decide_outcome

    outcome = decide_outcome(_job(timeout=2.0), returned=returned, value="v" if returned else None,
                             error=error, timed_out=timed_out, given_up=given_up)
    assert outcome.kind.value == kind
    if timed_out:
        assert outcome.error == "task t timed out after 2s"


def test_task_interrupts_are_not_swallowed_by_except_exception():
    from flexiqd.worker.execution import TaskInterrupted, TaskTimeout

    assert not issubclass(TaskInterrupted, Exception) and issubclass(TaskTimeout, TaskInterrupted)


# -- settings from the config file ------------------------------------------------------------

POOL_FILE = """
store: sqlite:////tmp/elsewhere.db
pools:
  images:
    app: imaging.tasks:queue
    queues: [images, thumbs]
    concurrency: 7
    lease: 20s
    drain_timeout: 45s
    batch_size: 3
"""


def test_a_worker_takes_its_pools_settings_from_the_config_file_and_flags_override_them(tmp_path):
    from flexiqd.worker.settings_reader import worker_setup

    path = tmp_path / "flexiqd.yaml"
    path.write_text(POOL_FILE)
    setup = worker_setup(app=None, url=None, instance="images-3", config=str(path),
                         overrides={"concurrency": 2, "drain_timeout": None})
    assert setup.app == "imaging.tasks:queue" and setup.store_url == "sqlite:////tmp/elsewhere.db"
    assert setup.pool == "images" and setup.config_path == str(path)
    config = setup.config
    assert (config.queues, config.concurrency, config.lease_seconds, config.drain_timeout,
            config.batch_size) == (("images", "thumbs"), 2, 20.0, 45.0, 3)
    assert config.name.split(":")[1:2] == ["images-3"]  # host:instance:pid, the lease owner name


def test_a_drain_reads_the_budget_a_reload_wrote_unless_a_flag_fixed_it(tmp_path, monkeypatch):
    from flexiqd.worker.settings_reader import drain_timeout_now, worker_setup

    path = tmp_path / "flexiqd.yaml"
    path.write_text(POOL_FILE)
    monkeypatch.setenv("FLEXIQD_CONFIG", str(path))
    from_file = worker_setup(app=None, url=None, instance="images-1", config=None, overrides={})
    fixed = worker_setup(app=None, url=None, instance="images-1", config=None,
                         overrides={"drain_timeout": 5.0})
    path.write_text(POOL_FILE.replace("drain_timeout: 45s", "drain_timeout: 2m"))
    assert drain_timeout_now(from_file) == 120.0
    assert drain_timeout_now(fixed) == 5.0
    path.write_text("pools: [broken\n")  # a file it cannot read: keep the budget it has
    assert drain_timeout_now(from_file) == 45.0


def test_a_worker_with_neither_app_nor_a_known_pool_gets_one_clear_line(tmp_path):
    from flexiqd.worker.settings_reader import worker_setup
    from flexiqd.errors import FlexiqdError

    path = tmp_path / "flexiqd.yaml"
    path.write_text(POOL_FILE)
    for instance, message in [(None, "give --app module:attribute, or --instance"),
                              ("images", "is not <pool>-<n>"),
                              ("videos-1", "has no pool 'videos' (pools: images)")]:
        with pytest.raises(FlexiqdError, match=message.replace("(", r"\(").replace(")", r"\)")):
            worker_setup(app=None, url=None, instance=instance, config=str(path), overrides={})


# -- signals before the loop runs -------------------------------------------------------------

def test_signals_caught_while_starting_are_replayed_in_order_once_the_worker_exists():
    import os
    import signal

    from flexiqd.worker.signals import HANDLED, WorkerSignals

    previous = {signum: signal.getsignal(signum) for signum in HANDLED}
    seen = []

    class Recorder:
        def request_stop(self): seen.append("stop")
        def pause(self): seen.append("pause")
        def resume(self): seen.append("resume")

    loop = asyncio.new_event_loop()
    try:
        signals = WorkerSignals.install()
        for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGUSR1, signal.SIGTERM):
            os.kill(os.getpid(), signum)  # handled at once, in this (the main) thread
        assert seen == []  # only recorded until there is a worker
        signals.attach(loop, Recorder())
        assert seen == ["pause", "resume", "pause", "stop"]
        os.kill(os.getpid(), signal.SIGUSR2)
        loop.run_until_complete(asyncio.sleep(0.01))  # now the loop dispatches
        assert seen[-1] == "resume"
        signals.detach(loop)
    finally:
        loop.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# -- credentials --------------------------------------------------------------------------------

def test_a_credential_is_read_from_the_directory_systemd_gives(tmp_path, monkeypatch):
    from flexiqd import credential
    from flexiqd.credentials import CredentialError

    (tmp_path / "db-password").write_text("s3cret\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert credential("db-password") == "s3cret\n"
    with pytest.raises(CredentialError, match=f"credential 'api-key' is not in {tmp_path} "
                                              r"\(given: db-password"):
        credential("api-key")
    with pytest.raises(CredentialError, match="not a credential name"):
        credential("../etc/passwd")
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    with pytest.raises(CredentialError, match=r"credential 'db-password': \$CREDENTIALS_DIRECTORY is not set"):
        credential("db-password")
