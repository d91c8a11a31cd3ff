"""flexiq's autoscaler interfaces: the Autoscaler API, serve_autoscaler and `flexiq autoscale`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from flexiqd.autoscale import (FLEXIQ_NAMES, AutoscaleConfig, AutoscaleController, Autoscaler,
                               compute_desired_workers)
from flexiqd.cli.flexiq import build_parser
from flexiqd.errors import ConfigError

from .conftest import APPS, REPO, read_marks, wait_for


@pytest.fixture
def worker_env(workers, monkeypatch):
    monkeypatch.setenv("FLEXIQ_TEST_MARKS", str(workers.marks))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(APPS), str(REPO)]))
    return workers


# flexiq 2.1.0's AutoscaleConfig fields (flexiq/autoscale/config.py), each with a value
# other than its default, and the flexiqd field it sets.
FLEXIQ_CONFIG = [("app_path", "app:queue", "app"), ("min_workers", 2, "min_workers"),
                 ("max_workers", 7, "max_workers"),
                 ("target_queue_depth_per_worker", 9, "target_queue_depth_per_worker"),
                 ("target_utilisation", 0.6, "target_utilisation"),
                 ("scale_up_window_sec", 4, "scale_up_window"),
                 ("scale_down_window_sec", 60, "scale_down_window"), ("tolerance", 0.2, "tolerance"),
                 ("poll_interval_sec", 2, "poll_interval"), ("drain_timeout_sec", 12, "drain_timeout"),
                 ("threads_per_worker", 3, "concurrency")]


def test_flexiqs_autoscale_config_names_are_accepted_and_read_back():
    config = AutoscaleConfig(**{theirs: value for theirs, value, _ in FLEXIQ_CONFIG})
    for theirs, value, ours in FLEXIQ_CONFIG:
        assert (getattr(config, ours), getattr(config, theirs)) == (value, value), theirs
    assert set(FLEXIQ_NAMES) == {theirs for theirs, _, ours in FLEXIQ_CONFIG if theirs != ours}
    assert AutoscaleConfig("app:queue").app_path == "app:queue"  # flexiq's first positional field


def test_a_field_given_under_both_names_is_refused():
    with pytest.raises(ConfigError, match="give concurrency= or flexiq's threads_per_worker=, not both"):
        AutoscaleConfig(app="a:q", concurrency=2, threads_per_worker=3)


def test_flexiqs_command_line_names_are_accepted():
    # flexiq 2.1.0's `flexiq autoscale` options (flexiq/cli.py), each with a value.
    argv = ["autoscale", "--app", "a:q", "--min-workers", "2", "--max-workers", "7", "--target-queue-depth", "9",
            "--target-utilisation", "0.6", "--scale-up-window", "4", "--scale-down-window", "60",
            "--tolerance", "0.2", "--poll-interval", "2", "--drain-timeout", "12", "--threads-per-worker", "3"]
    args = build_parser().parse_args(argv)
    assert (args.app, args.min_workers, args.max_workers, args.target_queue_depth, args.target_utilisation,
            args.scale_up_window, args.scale_down_window, args.tolerance, args.poll_interval,
            args.drain_timeout, args.concurrency) == ("a:q", 2, 7, 9, 0.6, 4, 60, 0.2, 2, 12, 3)


def test_flexiqs_keyword_compute_desired_workers():
    config = AutoscaleConfig(app_path="a:q", threads_per_worker=2, target_queue_depth_per_worker=10)
    decision = compute_desired_workers(pending=0, running=5, current_workers=2, config=config)
    assert (decision.desired_workers, decision.rationale) == (4, "scale-up: depth=0 util=4 overload=True")
    assert issubclass(AutoscaleController, Autoscaler) and callable(AutoscaleController.serve_forever)


def test_tick_reports_flexiqs_decision_and_the_process_manager_runs_workers(app, worker_env):
    # flexiq's own option names, as its users pass them.
    autoscaler = Autoscaler(app, app_path="counting_app:queue", min_workers=1, max_workers=4,
                            target_queue_depth_per_worker=10, threads_per_worker=2, poll_interval_sec=0.2,
                            scale_down_window_sec=0.5, drain_timeout_sec=10)
    manager = autoscaler.process_manager
    try:
        first = autoscaler.tick()
        assert (first.current_workers, first.desired_workers) == (0, 1)
        assert manager.count_live() == 1 and len(manager.live_pids()) == 1

        ids = app.tasks["count"].map([(0.2,)] * 30)
        decision = autoscaler.tick()
        assert decision.pending == 30 and decision.desired_workers == 3
        assert decision.rationale == "scale-up: depth=3 util=0 overload=False"
        assert autoscaler.config.concurrency == 2
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


def test_a_burst_wakes_the_autoscaler_long_before_its_next_poll(app, worker_env):
    # A minute between polls: a scale-up within seconds of the burst was woken by it.
    autoscaler = Autoscaler(app, app="counting_app:queue", min_workers=1, max_workers=4, concurrency=2,
                            poll_interval=60, drain_timeout=10)
    manager = autoscaler.process_manager
    try:
        autoscaler.start()
        wait_for(lambda: manager.count_live() == 1, 20, "the first worker")
        app.tasks["count"].map([(0.2,)] * 30)
        wait_for(lambda: manager.count_live() >= 2, 20, "a scale-up on the burst's arrival")
    finally:
        autoscaler.stop()
    assert manager.count_live() == 0


def test_bad_options_are_refused_up_front(app):
    with pytest.raises(ConfigError, match="max_workers"):
        Autoscaler(app, app="counting_app:queue", min_workers=5, max_workers=2)
    with pytest.raises(ConfigError, match="needs app="):
        Autoscaler(app)


STABLE_LINE = "autoscale: pending=0 running=0 workers=2 -> 2 (stable: depth=0 util=0 util_ratio=0.00)"


def test_flexiq_autoscale_runs_until_sigterm_and_drains(store, worker_env, tmp_path):
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    log = open(tmp_path / "autoscale.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "flexiqd.cli.flexiq", "--url", store, "autoscale", "--app",
         "counting_app:queue", "--min-workers", "2", "--max-workers", "4", "--poll-interval", "0.2",
         "--threads-per-worker", "2"],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path))
    try:
        wait_for(lambda: len(psutil.Process(proc.pid).children()) == 2, 30, "two workers")
        wait_for(lambda: STABLE_LINE in (tmp_path / "autoscale.log").read_text(), 30, "a stable decision")
        children = [c.pid for c in psutil.Process(proc.pid).children()]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in children)
    finally:
        if proc.poll() is None:
            proc.kill()
    # flexiq 2.1.0's decision lines, byte for byte.
    text = (tmp_path / "autoscale.log").read_text()
    assert "autoscale: pending=0 running=0 workers=0 -> 2 (scale-up: depth=0 util=0 overload=False)" in text
    assert STABLE_LINE in text


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
