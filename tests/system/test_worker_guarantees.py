"""Hostile tasks under the real systemd: a drained or crashed worker unit never makes a job run
twice at the same time, and nothing is lost.

The pool runs tests/apps/hostile_app.py: each job's first execution outlives
the 1 s drain budget (blocked in C, a socket read, a child ignoring SIGTERM, a
daemonised grandchild, an endless loop, a raising ``finally``).  Every
execution holds a per-job ``flock`` while anything runs it (forked processes
inherit it), so one started while another still runs writes an ``overlap``
mark; counts come from the tasks' own marks.
"""

from __future__ import annotations

import collections
import json
import time

import pytest

from .flexiqd_install import DAEMON, MARKS, REPO, flexiq, install, workers
from .sandbox import Sandbox

HOSTILE = {"sleep_in_c": "20", "recv_in_c": "20", "child_ignoring_term": "20",
           "daemonized_grandchild": "20", "loop_forever": None, "raise_in_finally": "20"}
DRAIN = 1.0
STOP_TIMEOUT = DRAIN + 10.0  # the unit's TimeoutStopSec: drain budget + the fleet's grace

CONFIG = f"""
store: sqlite:////var/lib/flexiq/queue.db
tick: 500ms
pools:
  hostile:
    app: hostile_app:queue
    concurrency: {len(HOSTILE)}
    min_workers: 1
    max_workers: 1
    drain_timeout: {DRAIN:g}s
    environment:
      PYTHONPATH: {REPO / "tests" / "apps"}
      FLEXIQ_TEST_MARKS: {MARKS}
"""


def hostile_marks(sbx: Sandbox) -> dict[str, collections.Counter]:
    text = sbx.run(f"cat {MARKS}/*.log 2>/dev/null || true").stdout
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in text.splitlines():
        what, job_id = line.split()[:2]
        counts[what][int(job_id)] += 1
    return counts


def jobs(sbx: Sandbox) -> dict[int, dict]:
    listed = json.loads(flexiq(sbx, "jobs", "list", "--limit", "100", "--json").stdout)
    return {job["id"]: job for job in listed}


@pytest.fixture
def hostile_pool(sandbox: Sandbox) -> Sandbox:
    install(sandbox, CONFIG)
    sandbox.wait_for(lambda: len(workers(sandbox)) == 1, 30, what="the pool's worker unit")
    for task, seconds in HOSTILE.items():
        flexiq(sandbox, "enqueue", task, *([seconds] if seconds else []))
    sandbox.wait_for(lambda: len(hostile_marks(sandbox)["start"]) == len(HOSTILE), 30,
                     what="every hostile job to start")
    yield sandbox
    sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*'; true", timeout=120)


def test_a_drained_worker_unit_exits_in_time_and_its_jobs_run_again_once_never_beside_it(hostile_pool):
    sbx = hostile_pool
    (unit,) = workers(sbx)
    pid = sbx.unit_property(unit, "MainPID")
    began = time.monotonic()
    sbx.systemctl("stop", unit, timeout=STOP_TIMEOUT + 30)  # what a scale-in asks of systemd
    stopped_after = time.monotonic() - began
    assert stopped_after < STOP_TIMEOUT, f"the unit took {stopped_after:.1f}s to stop"
    # It exited by itself (nothing killed on a timeout), and first killed what its tasks forked.
    assert sbx.unit_property(unit, "Result") == "success"
    journal = sbx.run(f"journalctl --no-pager -o cat _PID={pid}").stdout
    assert "gives up 5 jobs still running" in journal
    assert "killed 2 processes" in journal  # the forked child and the daemonised grandchild

    # The daemon replaces the worker (min_workers: 1) and the given-up jobs run again there.
    sbx.wait_for(lambda: all(job["state"] == "done" for job in jobs(sbx).values()), 60, interval=0.5,
                 what="every hostile job to be recovered and completed")
    marks = hostile_marks(sbx)
    assert marks["overlap"] == {}, "a job ran twice at the same time"
    assert set(marks["start"].values()) == {2}  # cut short once, then run whole
    assert {job["attempts"] for job in jobs(sbx).values()} == {1}  # a drain uses no attempt


def test_a_crashed_worker_units_jobs_run_again_only_once_its_processes_are_gone(hostile_pool):
    sbx = hostile_pool
    (unit,) = workers(sbx)
    sbx.run(["kill", "-KILL", sbx.unit_property(unit, "MainPID")])  # KillMode=mixed ends the rest
    sbx.wait_for(lambda: all(job["state"] == "done" for job in jobs(sbx).values()), 60, interval=0.5,
                 what="every hostile job to be recovered and completed")
    marks = hostile_marks(sbx)
    assert marks["overlap"] == {}, "a job ran beside a process of the crashed worker"
    assert set(marks["start"].values()) == {2}
