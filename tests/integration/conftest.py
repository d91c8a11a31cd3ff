"""Fixtures for tests that run real worker processes (no systemd needed)."""

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

REPO = pathlib.Path(__file__).resolve().parents[2]
APPS = REPO / "tests" / "apps"


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    """Poll ``predicate`` until it returns a truthy value; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def read_marks(directory: pathlib.Path) -> tuple[collections.Counter, collections.Counter]:
    """(starts per job id, ends per job id) over every worker's execution log."""
    starts: collections.Counter = collections.Counter()
    ends: collections.Counter = collections.Counter()
    for log in directory.glob("*.log"):
        for line in log.read_text().splitlines():
            what, job_id, _attempt, _pid = line.split()
            (starts if what == "start" else ends)[int(job_id)] += 1
    return starts, ends


class Workers:
    """Starts ``flexiq worker`` processes on the counting app; kills leftovers at teardown."""

    def __init__(self, url: str, marks: pathlib.Path, logs: pathlib.Path) -> None:
        self.url = url
        self.marks = marks
        self.logs = logs
        self.procs: list[subprocess.Popen] = []

    def start(self, *extra: str, concurrency: int = 4, lease: str = "30s",
              drain: str = "30s") -> subprocess.Popen:
        env = dict(os.environ, FLEXIQ_TEST_MARKS=str(self.marks),
                   PYTHONPATH=os.pathsep.join([str(APPS), str(REPO)]))
        env.pop("NOTIFY_SOCKET", None)
        log = open(self.logs / f"worker-{len(self.procs)}.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "flexiqd.cli.flexiq", "--url", self.url, "worker",
             "--app", "counting_app:queue", "--concurrency", str(concurrency), "--lease", lease,
             "--drain-timeout", drain, *extra],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO))
        self.procs.append(proc)
        return proc

    def log_text(self, index: int) -> str:
        return (self.logs / f"worker-{index}.log").read_text()

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()


@pytest.fixture
def store(tmp_path: pathlib.Path) -> str:
    return f"sqlite:///{tmp_path / 'queue.db'}"


@pytest.fixture
def app(store: str) -> Queue:
    sys.path.insert(0, str(APPS))
    try:
        import counting_app
    finally:
        sys.path.remove(str(APPS))
    queue = Queue(store)
    # Same task names as the workers' app, registered here only to enqueue.
    queue.task("count")(counting_app.count.fn)
    queue.task("count_async")(counting_app.count_async.fn)
    yield queue
    queue.close()


@pytest.fixture
def workers(store: str, tmp_path: pathlib.Path):
    marks = tmp_path / "marks"
    marks.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    fleet = Workers(store, marks, logs)
    yield fleet
    fleet.stop_all()
