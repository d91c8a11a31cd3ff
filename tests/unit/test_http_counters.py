"""The counters behind /metrics: the store's ended attempts and arrivals, turned into totals
that only grow.  The store methods run on every backend (see conftest.BACKENDS)."""

from __future__ import annotations

from flexiqd.http.counters import Counters, QueueTally, count_attempts, grown_arrivals
from flexiqd.queue import ClaimRequest, NewJob, Outcome
from flexiqd.queue.store.backend import EndedAttempt

T0 = 1_700_000_000.0


def claim(backend, owner="w1", now=T0, queue="default", limit=100):
    return backend.claim(ClaimRequest(owner=owner, queues=(queue,), limit=limit, lease_seconds=30), now=now)


def test_ended_attempts_without_a_cursor_give_only_the_current_cursor(backend):
    backend.enqueue([NewJob(task="t")], now=T0)
    [job] = claim(backend)
    backend.settle("w1", [Outcome.ack(job.id)], now=T0 + 1)
    cursor, attempts = backend.ended_attempts(None)
    assert attempts == []
    assert backend.ended_attempts(cursor) == (cursor, [])


def test_ended_attempts_report_every_ending_once_in_order(backend):
    start, _ = backend.ended_attempts(None)
    ids = backend.enqueue([NewJob(task="ok", queue="q"), NewJob(task="flaky", queue="q", max_attempts=2),
                           NewJob(task="bad", queue="q"), NewJob(task="slow", queue="q"),
                           NewJob(task="crash", queue="q", max_attempts=2),
                           NewJob(task="crash1", queue="q", max_attempts=1)], now=T0)
    claim(backend, queue="q")
    backend.settle("w1", [Outcome.ack(ids[0]), Outcome.fail(ids[1], "boom"), Outcome.dead(ids[2], "no"),
                          Outcome.release(ids[3])], now=T0 + 2.5)
    backend.recover_owner("w1", now=T0 + 3, reason="worker died")
    cursor, attempts = backend.ended_attempts(start)
    by_task = {a.task: a for a in attempts}
    assert len(attempts) == 6 and all(a.queue == "q" for a in attempts)
    assert by_task["ok"] == EndedAttempt("q", "ok", "ack", 2.5, False)
    assert (by_task["flaky"].outcome, by_task["flaky"].dead_lettered) == ("fail", False)
    assert (by_task["bad"].outcome, by_task["bad"].dead_lettered) == ("dead", True)
    assert by_task["slow"].outcome == "release"
    assert (by_task["crash"].outcome, by_task["crash"].dead_lettered) == ("lost", False)
    assert (by_task["crash1"].outcome, by_task["crash1"].dead_lettered) == ("lost", True)
    assert backend.ended_attempts(cursor) == (cursor, [])
    # The retry's last attempt fails: now it is dead-lettered.
    assert ids[1] in [job.id for job in claim(backend, owner="w2", now=T0 + 3600, queue="q")]
    backend.settle("w2", [Outcome.fail(ids[1], "boom again")], now=T0 + 3601)
    _, attempts = backend.ended_attempts(cursor)
    assert [(a.task, a.outcome, a.dead_lettered) for a in attempts] == [("flaky", "fail", True)]


def test_ended_attempts_are_read_in_pages(backend):
    start, _ = backend.ended_attempts(None)
    ids = backend.enqueue([NewJob(task="t")] * 5, now=T0)
    claim(backend)
    backend.settle("w1", [Outcome.ack(i) for i in ids], now=T0 + 1)
    cursor, first = backend.ended_attempts(start, limit=2)
    cursor, second = backend.ended_attempts(cursor, limit=2)
    cursor, third = backend.ended_attempts(cursor, limit=2)
    assert [len(first), len(second), len(third)] == [2, 2, 1]
    assert backend.ended_attempts(cursor, limit=2) == (cursor, [])


def test_arrivals_since_counts_per_second_and_a_delayed_job_in_the_second_it_came_due(backend):
    backend.enqueue([NewJob(task="t", queue="q")] * 2, now=T0)
    backend.enqueue([NewJob(task="t", queue="q", delay=10)], now=T0 + 1)
    backend.enqueue([NewJob(task="t", queue="other")], now=T0 + 1)
    assert backend.arrivals_since("q", int(T0)) == {int(T0): 2}
    backend.stats("q", now=T0 + 30)  # promotes the delayed job, 20 s late
    assert backend.arrivals_since("q", int(T0)) == {int(T0): 2, int(T0) + 11: 1}
    assert backend.arrivals_since("q", int(T0) + 5) == {int(T0) + 11: 1}


def test_counting_attempts():
    tallies: dict[str, QueueTally] = {}
    count_attempts(tallies, [EndedAttempt("q", "a", "ack", 1.5, False), EndedAttempt("q", "a", "ack", None, False),
                             EndedAttempt("q", "b", "fail", 2.0, False), EndedAttempt("q", "b", "fail", 2.0, True),
                             EndedAttempt("q", "c", "lost", None, False), EndedAttempt("q", "c", "lost", None, True),
                             EndedAttempt("q", "d", "release", 1.0, False), EndedAttempt("r", "d", "dead", 0.1, True)])
    q = tallies["q"]
    assert (q.completions, q.failures, q.dead_letters, q.releases, q.crash_reruns) == (2, 4, 2, 1, 1)
    assert q.durations["a"].count == 1 and q.durations["a"].total == 1.5 and "b" not in q.durations
    assert (tallies["r"].failures, tallies["r"].dead_letters) == (1, 1)


def test_grown_arrivals_count_growth_only_and_forget_old_seconds():
    added, seen = grown_arrivals({}, {10: 2, 11: 1}, oldest=0)
    assert (added, seen) == (3, {10: 2, 11: 1})
    added, seen = grown_arrivals(seen, {10: 2, 11: 4, 12: 1}, oldest=11)
    assert (added, seen) == (4, {11: 4, 12: 1})


def test_counters_start_at_zero_and_then_only_grow(backend):
    backend.enqueue([NewJob(task="t")] * 3, now=T0)
    [first, *_] = claim(backend, limit=1)
    backend.settle("w1", [Outcome.ack(first.id)], now=T0 + 1)
    counters = Counters()
    counters.read(backend, ["default"], now=T0 + 2)
    assert counters.tallies["default"] == QueueTally()  # what happened before the daemon started
    backend.enqueue([NewJob(task="t")] * 2, now=T0 + 2)
    backend.enqueue([NewJob(task="t", run_at=T0 + 1.5)], now=T0 + 1)  # delayed into a second already read
    jobs = claim(backend, now=T0 + 3)
    backend.settle("w1", [Outcome.ack(j.id) for j in jobs[:2]] + [Outcome.fail(jobs[2].id, "x")], now=T0 + 4)
    counters.read(backend, ["default"], now=T0 + 5)
    tally = counters.tallies["default"]
    assert (tally.arrivals, tally.completions, tally.failures) == (3, 2, 1)
    frozen = counters.frozen()
    counters.read(backend, ["default"], now=T0 + 6)
    assert counters.tallies["default"].arrivals == 3  # nothing new: nothing counted twice
    counters.tallies["default"].durations["t"].observe(1.0)
    assert frozen["default"].durations["t"].count == 2  # a published copy never changes


def test_the_sqlite_queries_are_key_ranges_not_scans(sqlite_backend):
    sqlite_backend.enqueue([NewJob(task="t")] * 3, now=T0)
    claim(sqlite_backend)
    issued: list[str] = []
    sqlite_backend.database.connection.set_trace_callback(issued.append)
    try:
        sqlite_backend.ended_attempts(0)
        sqlite_backend.arrivals_since("default", int(T0))
    finally:
        sqlite_backend.database.connection.set_trace_callback(None)
    queries = [sql for sql in issued if sql.lstrip().upper().startswith("SELECT")]
    assert len(queries) == 2
    for sql in queries:
        plan = [row[-1] for row in sqlite_backend.database.connection.execute("EXPLAIN QUERY PLAN " + sql)]
        assert plan and not any(step.startswith("SCAN") or "TEMP B-TREE" in step for step in plan), plan
