"""flexiq's autoscaler interfaces: the Autoscaler API, serve_autoscaler and `flexiq autoscale`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from flexiqd import Queue
from flexiqd.autoscale import Autoscaler
from flexiqd.errors import ConfigError

from .conftest import APPS, REPO, read_marks, wait_for


@pytest.fixture
def worker_env(workers, monkeypatch):
    monkeypatch.setenv("FLEXIQ_TEST_MARKS", str(workers.marks))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(APPS), str(REPO)]))
    return workers


def test_tick_reports_flexiqs_decision_and_the_process_manager_runs_workers(app, worker_env):
    autoscaler = Autoscaler(app, app="counting_app:queue", min_workers=1, max_workers=4,
                            target_queue_depth_per_worker=10, concurrency=2, poll_interval=0.2,
                            scale_down_window=0.5, drain_timeout=10)
    manager = autoscaler.process_manager
    try:
        first = autoscaler.tick()
        assert (first.current_workers, first.desired_workers) == (0, 1)
        assert manager.count_live() == 1 and len(manager.live_pids()) == 1

        ids = app.tasks["count"].map([(0.2,)] * 30)
        decision = autoscaler.tick()
        assert decision.pending == 30 and decision.desired_workers == 3
        assert decision.rationale == "scale-up: depth=3 util=0 overload=False"
        assert manager.count_live() == 3

        pid = manager.spawn_worker()
        assert manager.count_live() == 4 and pid in manager.live_pids()
        manager.terminate_worker(pid)
        assert pid not in manager.live_pids() and manager.reap_dead() == [pid]

        wait_for(lambda: all(app.get(i).state.value == "done" for i in ids), 60, "the burst to finish")
    finally:
        autoscaler.stop()
    assert manager.count_live() == 0
    starts, ends = read_marks(worker_env.marks)
    assert set(starts.values()) == {1} and set(ends.values()) == {1} and len(starts) == 30


def test_bad_options_are_refused_up_front(app):
    with pytest.raises(ConfigError, match="max_workers"):
        Autoscaler(app, app="counting_app:queue", min_workers=5, max_workers=2)
    with pytest.raises(ConfigError, match="needs app="):
        Autoscaler(app)


def test_flexiq_autoscale_runs_until_sigterm_and_drains(store, worker_env, tmp_path):
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    log = open(tmp_path / "autoscale.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "flexiqd.cli.flexiq", "--url", store, "autoscale", "--app",
         "counting_app:queue", "--min-workers", "2", "--max-workers", "4", "--poll-interval", "0.2"],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path))
    try:
        wait_for(lambda: len(psutil.Process(proc.pid).children()) == 2, 30, "two workers")
        children = [c.pid for c in psutil.Process(proc.pid).children()]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in children)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "autoscale: pending=0" in (tmp_path / "autoscale.log").read_text()


def test_serve_autoscaler_returns_once_signalled_and_drained(store, worker_env, tmp_path):
    script = (
        "import sys\n"
        "from flexiqd import Queue\n"
        "from flexiqd.autoscale import serve_autoscaler\n"
        f"serve_autoscaler(Queue({store!r}), app='counting_app:queue', min_workers=1, poll_interval=0.2)\n"
        "print('returned', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=str(tmp_path))
    try:
        wait_for(lambda: len(psutil.Process(proc.pid).children()) == 1, 30, "the worker")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and b"returned" in out
