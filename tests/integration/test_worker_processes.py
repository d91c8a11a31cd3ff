"""Real worker processes against the real SQLite store: exactly-once, crash, drain.

"Exactly once" is counted from executions (every start and end of a task is
written to a log by the task itself), not from the store's own bookkeeping.
"""

from __future__ import annotations

import signal

import pytest

from flexiqd.queue.types import JobState

from .conftest import read_marks, wait_for


@pytest.mark.slow
def test_four_workers_drain_twenty_thousand_jobs_each_exactly_once(app, workers):
    total = 20_000
    ids = app.tasks["count"].map([()] * (total // 2)) + app.tasks["count_async"].map([()] * (total // 2))
    procs = [workers.start(concurrency=8) for _ in range(4)]
    wait_for(lambda: app.stats().runnable == 0 and app.stats().running == 0, 300, "the backlog to drain")
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    assert [proc.wait(timeout=60) for proc in procs] == [0, 0, 0, 0]

    starts, ends = read_marks(workers.marks)
    assert set(starts) == set(ids), "some job never ran"
    assert [job for job, n in starts.items() if n != 1] == [], "some job ran more than once"
    assert [job for job, n in ends.items() if n != 1] == []
    done = app.backend.list_jobs(state=JobState.DONE, limit=total + 1)
    assert len(done) == total
    workers_used = {row["worker"] for row in app.backend.executions()}
    assert len(workers_used) == 4, "the work was not shared by the four workers"


def test_sigkill_mid_job_runs_it_again_after_its_lease(app, workers):
    job_id = app.tasks["count"].enqueue(1.5)
    victim = workers.start(concurrency=1, lease="1s")
    wait_for(lambda: read_marks(workers.marks)[0][job_id] == 1, 30, "the job to start")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert app.get(job_id).state is JobState.RUNNING  # leased to a dead worker

    survivor = workers.start(concurrency=1, lease="1s")
    wait_for(lambda: app.get(job_id).state is JobState.DONE, 30, "the job to run again and finish")
    survivor.send_signal(signal.SIGTERM)
    assert survivor.wait(timeout=30) == 0

    starts, ends = read_marks(workers.marks)
    assert starts[job_id] == 2 and ends[job_id] == 1  # killed once, then completed once
    job = app.get(job_id)
    assert job.attempts == 2  # the crash used an attempt
    outcomes = [row["outcome"] for row in app.backend.executions(job_id=job_id)]
    assert outcomes == ["lost", "ack"]


def test_sigterm_mid_job_lets_running_jobs_finish_without_duplicates(app, workers):
    ids = app.tasks["count"].map([(0.8,)] * 12)
    first = workers.start(concurrency=4, drain="20s")
    wait_for(lambda: sum(read_marks(workers.marks)[0].values()) >= 4, 30, "four jobs to start")
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=30) == 0
    starts_after_drain, ends_after_drain = read_marks(workers.marks)
    assert starts_after_drain == ends_after_drain, "the drain cut a running job short"
    assert "draining" in workers.log_text(0)

    second = workers.start(concurrency=4)
    wait_for(lambda: all(app.get(i).state is JobState.DONE for i in ids), 60, "every job to finish")
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=30) == 0
    starts, ends = read_marks(workers.marks)
    assert sorted(starts) == sorted(ids)
    assert set(starts.values()) == {1} and set(ends.values()) == {1}


def test_drain_budget_spent_releases_the_job_without_using_an_attempt(app, workers):
    job_id = app.tasks["count"].enqueue(30)
    first = workers.start(concurrency=1, drain="0.5s")
    wait_for(lambda: read_marks(workers.marks)[0][job_id] == 1, 30, "the long job to start")
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=30) == 0
    job = app.get(job_id)
    assert job.state is JobState.QUEUED and job.attempts == 0  # released, attempt not consumed
    assert [row["outcome"] for row in app.backend.executions(job_id=job_id)] == ["release"]
    starts, ends = read_marks(workers.marks)
    assert starts[job_id] == 1 and ends[job_id] == 0  # interrupted, never completed twice


def _start_worker(workers, *args: str, env: dict | None = None, block: set | None = None):
    """A ``flexiq worker`` on the counting app, started with ``block`` signals blocked, as the
    process fleet starts its workers."""
    import os
    import subprocess
    import sys

    from .conftest import APPS, REPO

    environment = dict(os.environ, FLEXIQ_TEST_MARKS=str(workers.marks),
                       PYTHONPATH=os.pathsep.join([str(APPS), str(REPO)]), **(env or {}))
    environment.pop("NOTIFY_SOCKET", None)
    log = open(workers.logs / f"worker-{len(workers.procs)}.log", "wb")
    old = signal.pthread_sigmask(signal.SIG_BLOCK, block) if block else None
    try:
        proc = subprocess.Popen([sys.executable, "-m", "flexiqd.cli.flexiq", "--url", workers.url,
                                 "worker", *args], env=environment, stdout=log,
                                stderr=subprocess.STDOUT, cwd=str(REPO))
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        log.close()
    workers.procs.append(proc)
    return proc, len(workers.procs) - 1


def _config_file(tmp_path, drain: str) -> str:
    path = tmp_path / "flexiqd.yaml"
    path.write_text(f"pools:\n  default:\n    app: counting_app:queue\n    concurrency: 2\n"
                    f"    lease: 30s\n    drain_timeout: {drain}\n")
    return str(path)


def test_a_pause_sent_while_the_worker_starts_pauses_it_instead_of_killing_it(app, workers):
    job_id = app.tasks["count"].enqueue()
    proc, index = _start_worker(workers, "--app", "counting_app:queue",
                                block={signal.SIGUSR1, signal.SIGUSR2})
    proc.send_signal(signal.SIGUSR1)  # long before its handlers exist: pending, then delivered
    wait_for(lambda: "ready" in workers.log_text(index) or proc.poll() is not None, 30, "the worker to start")
    assert proc.poll() is None, f"the worker died of the pause: {proc.returncode}"
    _paused_until_resumed(app, workers, proc, index, job_id)


def _paused_until_resumed(app, workers, proc, index, job_id):
    """The worker started paused: the job waits until SIGUSR2, then runs; SIGTERM ends it cleanly."""
    assert "ready (paused)" in workers.log_text(index)
    assert app.get(job_id).state is JobState.QUEUED
    proc.send_signal(signal.SIGUSR2)
    wait_for(lambda: app.get(job_id).state is JobState.DONE, 30, "the resumed worker to run the job")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_a_worker_of_a_paused_pool_starts_paused(app, workers, tmp_path):
    job_id = app.tasks["count"].enqueue()
    paused = tmp_path / "paused.json"
    paused.write_text('{"paused": ["default"]}\n')
    proc, index = _start_worker(workers, "--instance", "default-1", "--config", _config_file(tmp_path, "30s"),
                                env={"FLEXIQD_PAUSED_FILE": str(paused)})
    wait_for(lambda: "ready" in workers.log_text(index), 30, "the worker to start")
    _paused_until_resumed(app, workers, proc, index, job_id)


def test_a_drain_budget_changed_by_a_reload_reaches_a_running_worker(app, workers, tmp_path):
    job_id = app.tasks["count"].enqueue(60)
    config = _config_file(tmp_path, "60s")
    proc, index = _start_worker(workers, "--instance", "default-1", "--config", config)
    wait_for(lambda: read_marks(workers.marks)[0][job_id] == 1, 30, "the long job to start")
    _config_file(tmp_path, "0.5s")  # what the daemon's reload writes
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0, "the worker drained on its old 60 s budget"
    job = app.get(job_id)
    assert job.state is JobState.QUEUED and job.attempts == 0
    assert "budget 0.5s" in workers.log_text(index)


def test_sigkilled_workers_rerun_at_most_the_jobs_they_had_started_and_not_settled(app, workers):
    # The crash-duplicate bound (runtime.py): a SIGKILL re-runs only jobs the worker was running
    # or had finished without committing yet, at most concurrency + UNSETTLED_MAX of them.
    import collections
    import random

    from flexiqd.worker.runtime import UNSETTLED_MAX

    concurrency, kills = 4, 10
    ids = app.tasks["count"].map([(0.01,)] * 3000)
    live = [workers.start(concurrency=concurrency, lease="1s") for _ in range(3)]
    killed = set()
    rng = random.Random(7)
    for _ in range(kills):
        before = sum(read_marks(workers.marks)[0].values())
        wait_for(lambda: sum(read_marks(workers.marks)[0].values()) >= before + 20, 30, "work to go on")
        victim = live.pop(rng.randrange(len(live)))
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        killed.add(victim.pid)
        live.append(workers.start(concurrency=concurrency, lease="1s"))
    wait_for(lambda: all(app.get(i).state is JobState.DONE for i in ids), 120, "every job to finish")
    for proc in live:
        proc.send_signal(signal.SIGTERM)
    assert [proc.wait(timeout=30) for proc in live] == [0] * len(live)

    starts_by_job: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
    for log in workers.marks.glob("*.log"):
        for line in log.read_text().splitlines():
            what, job_id, attempt, pid = line.split()
            if what == "start":
                starts_by_job[int(job_id)].append((int(attempt), int(pid)))
    assert set(starts_by_job) == set(ids), "a job never ran"
    reruns = collections.Counter()  # pid -> its executions that had to be run again
    for starts in starts_by_job.values():
        for _attempt, pid in sorted(starts)[:-1]:  # a crash uses an attempt: the last one counted
            reruns[pid] += 1
    assert set(reruns) <= killed, "a worker that was not killed ran a job again"
    assert max(reruns.values(), default=0) <= concurrency + UNSETTLED_MAX
    print(f"\n{kills} kills: {sum(reruns.values())} re-runs, at most {max(reruns.values(), default=0)} "
          f"per kill (bound {concurrency + UNSETTLED_MAX})")
