"""flexiqd with the process fleet (no systemd): scale up on a burst, reload, drain on stop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from flexiqd.queue.types import JobState

from .conftest import APPS, REPO, read_marks, wait_for

CONFIG = """
store: {store}
tick: 200ms
fleet: process
pools:
  default:
    app: counting_app:queue
    concurrency: 2
    min_workers: 1
    max_workers: 6
    drain_timeout: 20s
    targets: {{age: 2s, lead_time: 1s}}
    behavior: {{down_window: 2s, up_limit: {{workers: 6, percent: 100, period: 1s}},
               down_limit: {{workers: 6, percent: 100, period: 1s}}}}
{extra}"""


def start_daemon(tmp_path, store, marks, extra=""):
    config = tmp_path / "flexiqd.yaml"
    config.write_text(CONFIG.format(store=store, extra=extra))
    env = dict(os.environ, FLEXIQ_TEST_MARKS=str(marks), PYTHONPATH=os.pathsep.join([str(APPS), str(REPO)]))
    env.pop("NOTIFY_SOCKET", None)
    log = open(tmp_path / "daemon.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "flexiqd.cli.daemon", "--config", str(config)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path))
    return proc, config, tmp_path / "daemon.log"


def worker_pids(daemon_pid: int) -> list[int]:
    import psutil

    # Named by what a worker runs: the daemon's app check imports each pool's app in a
    # child of its own, and any child between fork and exec still shows the daemon's line.
    return [child.pid for child in psutil.Process(daemon_pid).children()
            if child.is_running() and "--instance" in _cmdline(child)]


def _cmdline(process) -> list[str]:
    import psutil

    try:
        return process.cmdline()
    except psutil.Error:  # gone meanwhile
        return []


def test_burst_scales_up_then_stop_drains_every_worker_without_duplicates(tmp_path, store, app, workers):
    daemon, _, log = start_daemon(tmp_path, store, workers.marks)
    try:
        wait_for(lambda: len(worker_pids(daemon.pid)) == 1, 30, "the minimum worker")
        ids = app.tasks["count"].map([(0.3,)] * 120)
        wait_for(lambda: len(worker_pids(daemon.pid)) >= 3, 30, "a scale-up to at least 3 workers")
        wait_for(lambda: app.stats().runnable == 0, 60, "the burst to be claimed")
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
    text = log.read_text()
    assert re.search(r"default 1 -> [2-6]: ", text), "no scale-up was logged with its rationale"
    starts, ends = read_marks(workers.marks)
    finished = [i for i in ids if app.get(i).state is JobState.DONE]
    assert set(starts.values()) <= {1}, "a job ran twice"
    assert sorted(ends) == sorted(finished), "a started job was neither finished nor released"
    leftover = [app.get(i) for i in ids if i not in finished]
    assert all(job.state is JobState.QUEUED and job.attempts == 0 for job in leftover)


def test_reload_rejects_a_broken_file_and_applies_a_good_one(tmp_path, store, app, workers):
    daemon, config, log = start_daemon(tmp_path, store, workers.marks)
    try:
        wait_for(lambda: len(worker_pids(daemon.pid)) == 1, 30, "the minimum worker")
        good = config.read_text()
        config.write_text(good + "    max_wrkers: 3\n")
        daemon.send_signal(signal.SIGHUP)
        wait_for(lambda: "Reload rejected" in log.read_text(), 10, "the reload to be rejected")
        assert "did you mean 'max_workers'" in log.read_text()
        assert daemon.poll() is None and len(worker_pids(daemon.pid)) == 1

        config.write_text(good + "  second:\n    app: counting_app:queue\n    queues: [second]\n"
                                 "    min_workers: 2\n")
        daemon.send_signal(signal.SIGHUP)
        wait_for(lambda: len(worker_pids(daemon.pid)) == 3, 30, "the new pool's two workers")
        assert "Reloaded" in log.read_text()
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()


def test_a_worker_killed_mid_job_is_replaced_and_its_job_runs_again_at_once(tmp_path, store, app, workers):
    daemon, _, log = start_daemon(tmp_path, store, workers.marks)
    try:
        wait_for(lambda: len(worker_pids(daemon.pid)) == 1, 30, "the minimum worker")
        job_id = app.tasks["count"].enqueue(1.0)
        wait_for(lambda: read_marks(workers.marks)[0][job_id] == 1, 30, "the job to start")
        victim = worker_pids(daemon.pid)[0]
        os.kill(victim, signal.SIGKILL)
        # The lease is 30 s: finishing well before that proves it was released on the death.
        wait_for(lambda: app.get(job_id).state is JobState.DONE, 15, "the job to run again")
        # How it ended, as the fleet saw it: the process fleet knows the signal.
        assert re.search(r"is gone \(killed by SIGKILL\): released its 1 jobs", log.read_text())
        assert victim not in worker_pids(daemon.pid) and len(worker_pids(daemon.pid)) >= 1
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
    starts, ends = read_marks(workers.marks)
    assert starts[job_id] == 2 and ends[job_id] == 1


def test_a_pause_sent_while_a_worker_starts_waits_for_it_instead_of_killing_it(tmp_path, store, workers):
    from flexiqd.fleet.base import WorkerSpec, WorkerState
    from flexiqd.fleet.process import ProcessFleet

    fleet = ProcessFleet(log_dir=str(tmp_path))
    spec = WorkerSpec(pool="p", app="counting_app:queue", queues=("default",), concurrency=1,
                      drain_timeout=5, lease_seconds=30, store_url=store,
                      environment={"PYTHONPATH": os.pathsep.join([str(APPS), str(REPO)]),
                                   "FLEXIQ_TEST_MARKS": str(workers.marks)})
    fleet.start(spec, [1])
    fleet.set_paused(fleet.list(), True)  # at once: the worker is still importing
    log = tmp_path / "p-1.log"
    try:
        wait_for(lambda: "paused: claiming no new jobs" in log.read_text(), 30, "the worker to be paused")
        assert [w.state for w in fleet.list()] == [WorkerState.ACTIVE]
    finally:
        fleet.leave()
    assert fleet.list() == []  # drained and exited cleanly: not failed


def test_a_process_fleet_worker_gets_its_store_password_out_of_its_command_line(tmp_path, pg_server, workers):
    from pg_server import DATABASE, PASSWORD, PASSWORD_ROLE

    from flexiqd.fleet.base import WorkerSpec
    from flexiqd.fleet.process import ProcessFleet
    from flexiqd.queue import NewJob, open_backend

    schema = f"pw{os.getpid()}"
    pg_server.admin(f"DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema} AUTHORIZATION "
                    f"{PASSWORD_ROLE}", database=DATABASE)
    url = pg_server.url(user=f"{PASSWORD_ROLE}:{PASSWORD}", schema=schema)
    backend = open_backend(url)
    [job_id] = backend.enqueue([NewJob(task="count")], now=time.time())
    fleet = ProcessFleet(log_dir=str(tmp_path))
    spec = WorkerSpec(pool="p", app="counting_app:queue", queues=("default",), concurrency=1,
                      drain_timeout=5, lease_seconds=30, store_url=url,
                      environment={"PYTHONPATH": os.pathsep.join([str(APPS), str(REPO)]),
                                   "FLEXIQ_TEST_MARKS": str(workers.marks)})
    fleet.start(spec, [1])
    try:
        [worker] = fleet.list()
        with open(f"/proc/{worker.pid}/cmdline", "rb") as handle:
            assert PASSWORD.encode() not in handle.read()  # what `ps` shows every user
        wait_for(lambda: backend.get(job_id).state is JobState.DONE, 30, "the job done by the worker")
    finally:
        fleet.leave()
        backend.close()


def test_a_pool_whose_app_does_not_import_is_named_at_start_and_cleared_by_a_reload(tmp_path, store, workers):
    code = tmp_path / "code"
    code.mkdir()
    extra = (f"  reports:\n    app: reports_app:queue\n    queues: [reports]\n    min_workers: 0\n"
             f"    scale_to_zero: true\n    environment: {{PYTHONPATH: '{code}:{REPO}'}}\n")
    daemon, config, log = start_daemon(tmp_path, store, workers.marks, extra=extra)
    try:
        wait_for(lambda: "its workers cannot run" in log.read_text(), 30, "the app check at start")
        assert "Pool reports: its workers cannot run: app reports_app:queue: no module named 'reports_app'" \
            in log.read_text()
        assert "Pool default: its workers cannot run" not in log.read_text()
        (code / "reports_app.py").write_text("from flexiqd import Queue\nqueue = Queue()\n")
        daemon.send_signal(signal.SIGHUP)
        wait_for(lambda: "Pool reports: its app imports again" in log.read_text(), 30, "the check after the reload")
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=60)
        finally:
            if daemon.poll() is None:
                daemon.kill()
    assert "Traceback" not in log.read_text()


def test_the_daemon_declares_a_scaled_to_zero_pools_tasks_before_any_worker_runs(tmp_path, store, workers):
    code = tmp_path / "code"
    code.mkdir()
    (code / "mail_app.py").write_text(
        "from flexiqd import Queue\nqueue = Queue()\n"
        "@queue.task('mail.send', queue='mail', priority=3, max_attempts=9, timeout=45)\n"
        "def send(to):\n    return to\n")
    extra = (f"  mail:\n    app: mail_app:queue\n    queues: [mail]\n    min_workers: 0\n"
             f"    scale_to_zero: true\n    environment: {{PYTHONPATH: '{code}:{REPO}'}}\n")
    daemon, _, log = start_daemon(tmp_path, store, workers.marks, extra=extra)
    from flexiqd.queue import open_backend

    backend = open_backend(store)
    try:
        declared = wait_for(lambda: backend.task_declarations(["mail.send"]).get("mail.send"), 30,
                            "the daemon's app check to declare mail.send")
        assert declared.options() == {"queue": "mail", "priority": 3, "max_attempts": 9, "timeout": 45.0}
        assert declared.declared_by == "flexiqd (pool mail)"
        assert not any("mail-" in " ".join(_cmdline(child)) for child in _children(daemon.pid))
    finally:
        backend.close()
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=60)
        finally:
            if daemon.poll() is None:
                daemon.kill()
    assert "Traceback" not in log.read_text()


def _children(pid: int):
    import psutil

    return psutil.Process(pid).children()
