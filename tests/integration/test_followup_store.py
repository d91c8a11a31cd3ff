"""A job a task enqueues (its follow-up) goes to the store the worker claims from, whatever
store the application's own ``Queue(url)`` names: on SQLite and on PostgreSQL, with a real
worker process that takes its pool (and store) from a config file, as under the daemon."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from flexiqd.queue import JobState, NewJob, open_backend

from .conftest import APPS, REPO, read_marks, wait_for


@pytest.fixture(params=["sqlite", "postgresql"])
def pool_store(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'pool.db'}"
    return request.getfixturevalue("pg_server").fresh_url()


def test_a_tasks_follow_up_job_lands_in_the_store_the_worker_claims_from(pool_store, tmp_path):
    decoy = tmp_path / "app-own.db"  # the store the application module names
    marks = tmp_path / "marks"
    marks.mkdir()
    config = tmp_path / "flexiqd.yaml"
    config.write_text(json.dumps({"store": pool_store, "pools": {"orders": {
        "app": "followup_app:queue", "queues": ["default"], "concurrency": 2}}}))
    backend = open_backend(pool_store)
    try:
        placed = backend.enqueue([NewJob(task="order.placed", payload={"args": [n], "kwargs": {}})
                                  for n in range(5)], now=time.time())
        env = dict(os.environ, FLEXIQ_TEST_MARKS=str(marks), FOLLOWUP_APP_URL=f"sqlite:///{decoy}",
                   PYTHONPATH=os.pathsep.join([str(APPS), str(REPO)]))
        env.pop("NOTIFY_SOCKET", None)
        env.pop("FLEXIQ_URL", None)
        log = tmp_path / "worker.log"
        with open(log, "wb") as out:
            worker = subprocess.Popen([sys.executable, "-m", "flexiqd.cli.flexiq", "worker",
                                       "--instance", "orders-1", "--config", str(config)],
                                      env=env, stdout=out, stderr=subprocess.STDOUT, cwd=str(REPO))
        try:
            def all_done():
                jobs = backend.list_jobs(limit=100)
                return len(jobs) == 10 and all(job.state is JobState.DONE for job in jobs) and jobs
            jobs = wait_for(all_done, 60, "the 5 jobs and their 5 follow-ups done in the pool's store")
        finally:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=60) == 0, log.read_text()
        receipts = sorted(job.result for job in jobs if job.task == "order.receipt")
        assert receipts == [f"receipt {n}" for n in range(5)]
        starts, ends = read_marks(marks)
        assert sorted(starts) == sorted(job.id for job in jobs) and set(starts.values()) == {1}
        assert starts == ends
        assert not decoy.exists(), "a follow-up went to the application's own store"
        assert "its tasks enqueue into the pool's store" in log.read_text()
        assert placed == sorted(job.id for job in jobs if job.task == "order.placed")
    finally:
        backend.close()

