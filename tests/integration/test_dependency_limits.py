"""Dependency limits held by real worker processes sharing one SQLite store.

What ran when is read from the tasks' own marks (start and end times of every
execution, written by the task), never from the store's bookkeeping.
"""

from __future__ import annotations

import collections
import signal
import time

from flexiqd.queue.types import JobState

from .conftest import wait_for
from .test_worker_processes import _start_worker


def _config(tmp_path, dependencies: str) -> str:
    """A config whose one pool runs limited_app with 2 slots per worker: fewer than the limit,
    so reaching it takes jobs of several workers at once."""
    path = tmp_path / "flexiqd.yaml"
    path.write_text(f"dependencies:\n{dependencies}\n"
                    "pools:\n  default:\n    app: limited_app:queue\n    concurrency: 2\n")
    return str(path)


def _marks(directory):
    """Every mark of every worker's log, (time, start|end, job, pid), in time order."""
    events = []
    for log in directory.glob("*.log"):
        for line in log.read_text().splitlines():
            what, job_id, at, pid = line.split()
            events.append((float(at), what, int(job_id), int(pid)))
    return sorted(events)


def _most_at_once(events) -> int:
    """The most executions running at one instant (an end before a start at the same time)."""
    running = most = 0
    for _at, what, _job, _pid in sorted(events, key=lambda e: (e[0], e[1] != "end")):
        running += 1 if what == "start" else -1
        most = max(most, running)
    return most


def _app(store):
    from flexiqd import Queue

    queue = Queue(store)
    queue.task("partner_sync", uses=["partner_api"])(lambda seconds: None)
    queue.task("send_sms", uses=["sms"])(lambda: None)
    queue.task("free")(lambda seconds: None)
    return queue


def _finish(app, ids, procs):
    wait_for(lambda: all(app.get(i).state is JobState.DONE for i in ids), 120, "every job to finish")
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    assert [proc.wait(timeout=30) for proc in procs] == [0] * len(procs)


def test_three_workers_never_run_more_than_the_concurrency_limit_inside_a_dependency(store, workers, tmp_path):
    app = _app(store)
    config = _config(tmp_path, "  partner_api:\n    capacity: 10\n    limit: {concurrency: 3}")
    ids = app.tasks["partner_sync"].map([(0.1,)] * 60)
    free = app.tasks["free"].map([(0.1,)] * 12)  # unlimited work alongside
    procs = [_start_worker(workers, "--instance", f"default-{n}", "--config", config)[0] for n in (1, 2, 3)]
    _finish(app, ids + free, procs)

    events = _marks(workers.marks)
    limited = [e for e in events if e[2] in set(ids)]
    starts = collections.Counter(job for _at, what, job, _pid in limited if what == "start")
    ends = collections.Counter(job for _at, what, job, _pid in limited if what == "end")
    assert set(starts) == set(ids) and set(starts.values()) == {1}, "a job ran twice or never"
    assert set(ends) == set(ids) and set(ends.values()) == {1}
    assert _most_at_once(limited) == 3  # never more; reached only by jobs of two workers at once
    assert _most_at_once(events) > 3  # the unlimited task was not held to it
    assert len({pid for _at, _what, _job, pid in limited}) >= 2, "the work was not shared"
    assert all(app.get(i).attempts == 1 for i in ids)  # deferrals used no attempt
    dependency = app.backend.dependency_stats("partner_api", now=time.time(), window=300)
    assert dependency.in_use == 0 and dependency.holds_ended == 60
    assert dependency.deferred_rate > 0  # the workers did meet a full dependency
    assert app.stats().waiting_for_dependency == 0
    app.close()


def test_workers_never_start_more_than_burst_plus_rate_times_t(store, workers, tmp_path):
    app = _app(store)
    rate, burst, total = 20, 20, 60
    config = _config(tmp_path, "  sms:\n    capacity: 20\n    limit: {rate: 20}")
    ids = app.tasks["send_sms"].map([()] * total)
    procs = [_start_worker(workers, "--instance", f"default-{n}", "--config", config)[0] for n in (1, 2)]
    _finish(app, ids, procs)

    starts = sorted(at for at, what, _job, _pid in _marks(workers.marks) if what == "start")
    assert len(starts) == total
    # A start is marked a moment after its admission (the task's thread has to begin): allow
    # one start of slack for that, no more.
    for i, first in enumerate(starts):
        for j in range(i, len(starts)):
            assert j - i + 1 <= burst + rate * (starts[j] - first) + 1, (i, j, starts[j] - first)
    assert starts[-1] - starts[0] >= (total - burst) / rate * 0.9  # the rate, not the workers, set the pace
    app.close()
