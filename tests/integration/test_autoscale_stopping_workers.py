"""`flexiq autoscale` (process fleet): a burst right after a scale-in never runs more worker
processes than max_workers, whichever policy sizes the pool.

Issue 22, item 6: a burst 0.1 s after a scale-in 8 -> 1 started 7 new workers while the 7
just stopped were still exiting (an idle worker takes about 0.3-0.4 s to exit): 14 worker
processes for 0.4 s.  Here the workers run the counting app's 1.5 s jobs; each run fills
the pool to its 8 workers, lets it scale in once the jobs are done, enqueues the next burst
0.1 s after the scale-in's decision, and samples the autoscaler's live child processes
(psutil, every ~20 ms) until the burst is done.  Before the fix the peak was 11-14 of 8;
now it is 8, the new workers start as the stopping ones exit, and every job runs once.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from flexiqd import Queue
from flexiqd.queue.types import NewJob

from .conftest import APPS, REPO, read_marks, wait_for

MAX_WORKERS = 8
JOBS, JOB_SECONDS = 16, 1.5
RUNS = 2
# The scale-in's decision, as flexiq logs it: "autoscale: pending=0 running=0 workers=8 -> 1 (...)".
SCALE_IN = re.compile(r"workers=([2-9]|\d\d+) -> 1 \(")


class Sampler:
    """Counts the autoscaler's live child processes (its workers) every ~20 ms, on a thread."""

    def __init__(self, pid: int) -> None:
        self.parent = psutil.Process(pid)
        self.peak = 0
        self.over: list[tuple[float, int]] = []   # (time, count) of every sample above the max
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-sampler", daemon=True)

    def count(self) -> int:
        try:
            children = self.parent.children()
        except psutil.Error:
            return 0
        live = 0
        for child in children:
            try:
                live += child.status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                pass
        return live

    def _run(self) -> None:
        while not self._stop.is_set():
            count = self.count()
            self.samples += 1
            self.peak = max(self.peak, count)
            if count > MAX_WORKERS:
                self.over.append((time.monotonic(), count))
            self._stop.wait(0.02)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()


def burst(queue: Queue) -> None:
    queue.enqueue_many([NewJob(task="count", payload={"args": [JOB_SECONDS], "kwargs": {}})] * JOBS)


@pytest.mark.parametrize("policy", ["flexiq", "flexiqd"])
def test_a_burst_after_a_scale_in_never_runs_more_workers_than_max_workers(store, workers, tmp_path, policy):
    env = dict(os.environ, FLEXIQ_TEST_MARKS=str(workers.marks), PYTHONPATH=os.pathsep.join([str(APPS), str(REPO)]))
    env.pop("NOTIFY_SOCKET", None)
    log_path = tmp_path / "autoscale.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "flexiqd.cli.flexiq", "--url", store, "autoscale", "--app", "counting_app:queue",
         "--policy", policy, "--min-workers", "1", "--max-workers", str(MAX_WORKERS), "--concurrency", "1",
         "--target-queue-depth", "1", "--target-age", "1", "--scale-down-window", "0",
         "--poll-interval", "0.5", "--drain-timeout", "10"],
        env=env, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, cwd=str(tmp_path))
    queue = Queue(store)
    log_text = lambda: log_path.read_text(errors="replace")  # noqa: E731
    try:
        with Sampler(proc.pid) as sampler:
            wait_for(lambda: sampler.count() >= 1, 30, "the first worker")
            for run in range(RUNS):
                burst(queue)
                wait_for(lambda: sampler.count() == MAX_WORKERS, 30, f"run {run}: the pool at {MAX_WORKERS}")
                seen = len(log_text())
                wait_for(lambda: SCALE_IN.search(log_text(), seen), 60, f"run {run}: the scale-in to 1",
                         interval=0.005)
                burst(queue)  # at once: the stopped workers take a fraction of a second to exit
                # The rest start as the stopping ones exit: the pool is full again soon.
                wait_for(lambda: sampler.count() == MAX_WORKERS, 15, f"run {run}: the pool back at {MAX_WORKERS}")
                wait_for(lambda: (lambda s: s.runnable == 0 and s.running == 0)(queue.stats()), 60,
                         f"run {run}: the burst done")
        text = log_text()
        assert sampler.samples > 100
        assert sampler.peak <= MAX_WORKERS, (
            f"{policy}: up to {sampler.peak} worker processes for max_workers={MAX_WORKERS}: {sampler.over[:5]}")
        # The case under test happened: a decision (or a start) waited for stopping workers, and said so.
        assert "workers still stopping" in text, text[-4000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    starts, ends = read_marks(workers.marks)
    assert len(starts) == 2 * RUNS * JOBS and set(starts.values()) == {1} and starts == ends
