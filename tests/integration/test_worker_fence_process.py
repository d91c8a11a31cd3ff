"""A real worker process on PostgreSQL whose database stops answering: it ends itself -- its
task's child process killed, exit code 75 -- while the lease of its job still runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from flexiqd import Queue
from flexiqd.worker.runtime import EXIT_FENCED

from .conftest import APPS, REPO, wait_for

HEARTBEAT = 1.0


def test_a_worker_cut_off_by_a_hung_database_kills_its_tasks_and_exits(pg_server, tmp_path):
    url = pg_server.fresh_url()
    schema = url.rsplit("search_path%3D", 1)[1]
    config = tmp_path / "flexiqd.yaml"
    config.write_text(f"store: '{url}'\nheartbeat: {HEARTBEAT:g}s\n")
    marks = tmp_path / "marks"
    marks.mkdir()
    queue = Queue(url)
    job_id = queue.enqueue("fork_and_wait", [600.0])
    queue.close()
    env = dict(os.environ, FLEXIQ_TEST_MARKS=str(marks), FLEXIQD_CONFIG=str(config),
               PYTHONPATH=os.pathsep.join([str(APPS), str(REPO)]))
    env.pop("NOTIFY_SOCKET", None)
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [sys.executable, "-m", "flexiqd.cli.flexiq", "--url", url, "worker", "--app", "fence_app:queue",
         "--instance", "default-1", "--concurrency", "1"],
        env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=str(REPO))
    stopped: list[int] = []
    try:
        child = int(wait_for(lambda: (marks / "child.pid").exists() and (marks / "child.pid").read_text(),
                             30, "the task's child process"))
        # The database hangs for this worker: its server processes stop answering.
        for (pid,) in pg_server.admin(
                "SELECT pid FROM pg_stat_activity WHERE datname = 'flexiq' AND pid <> pg_backend_pid()"):
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        hung_at = time.time()
        code = worker.wait(timeout=30)
        exited_at = time.time()
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert code == EXIT_FENCED, log.read_text()
    assert "kills its tasks and exits" in log.read_text()
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    # It ended before its lease (2 x heartbeat from the last renewal) let another host take the job.
    [(lease_expires,)] = pg_server.admin(f"SELECT lease_expires FROM {schema}.flexiq_jobs WHERE id = {job_id}",
                                         database="flexiq")
    assert exited_at < lease_expires, (exited_at - hung_at, lease_expires - hung_at)
