"""The SQLite store's own side of dependency limits: the v4 -> v5 migration and its indexes."""

from __future__ import annotations

import contextlib
import re
import sqlite3
import time

from flexiqd.queue import ClaimRequest, NewJob, Outcome
from flexiqd.queue.limits import DependencyLimit
from flexiqd.queue.sqlite.database import SQLiteBackend
from flexiqd.queue.sqlite.schema import MIGRATIONS, SCHEMA_LEVEL, SCHEMA_VERSION

from test_queue_sqlite import _jobs_as_stored, _old_store, _schema_shape, schema_state

T0 = 1_700_000_000.0


def _v4_store(path, now):
    """A version-4 store with a job in every state: version 2's DDL, then migrations 3 and 4."""
    _old_store(path, 2, now)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        for version in (3, 4):
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
        conn.execute("PRAGMA user_version = 4")


def test_a_version_4_store_is_migrated_to_the_shape_of_a_new_one(tmp_path):
    path = str(tmp_path / "queue.db")
    now = time.time()
    _v4_store(path, now)
    before = _jobs_as_stored(path)
    store = SQLiteBackend(path, synchronous="normal")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert schema_state(conn) == (SCHEMA_LEVEL, SCHEMA_VERSION)
    assert _jobs_as_stored(path) == before
    SQLiteBackend(str(tmp_path / "fresh.db")).close()
    assert _schema_shape(path) == _schema_shape(str(tmp_path / "fresh.db"))

    stats = store.stats("default", now=now, window=60)
    assert (stats.runnable, stats.delayed, stats.running, stats.dead, stats.waiting_for_dependency) == (1, 1, 1, 1, 0)
    # The migrated store limits and defers like a new one; its counts triggers know "waiting".
    due = before[0][0]
    limit = DependencyLimit("db", concurrency=1)
    a, b = store.enqueue([NewJob(task="t"), NewJob(task="t")], now=now)
    jobs = store.claim(ClaimRequest("w2", ("default",), 3), now=now)
    assert {job.id for job in jobs} == {due, a, b}
    refusals = [store.admit("w2", job.id, [limit], now=now) for job in jobs]
    assert sum(r is None for r in refusals) == 1
    deferred = [Outcome.defer(job.id, r) for job, r in zip(jobs, refusals) if r is not None]
    store.settle("w2", deferred, now=now)
    assert store.stats("default", now=now).waiting_for_dependency == 2
    store.close()


def _plans(store, calls):
    issued = []
    store.database.connection.set_trace_callback(issued.append)
    for call in calls:
        call()
    store.database.connection.set_trace_callback(None)
    plans = {}
    for sql in issued:
        if sql.split()[0] in ("SELECT", "UPDATE", "DELETE", "INSERT") and "?" not in sql:
            plans[sql] = [row[-1] for row in store.database.connection.execute("EXPLAIN QUERY PLAN " + sql)]
    return plans


def test_admit_and_dependency_stats_never_walk_the_jobs(tmp_path):
    store = SQLiteBackend(str(tmp_path / "queue.db"), synchronous="normal")
    store.enqueue([NewJob(task="t", delay=i % 3) for i in range(3000)], now=T0)
    jobs = store.claim(ClaimRequest("w", ("default",), 40), now=T0)
    limit = DependencyLimit("db", concurrency=5, rate=100.0)
    refusals = {job.id: store.admit("w", job.id, [limit], now=T0) for job in jobs}
    store.settle("w", [Outcome.defer(i, r) if r else Outcome.ack(i) for i, r in refusals.items()], now=T0 + 1)
    later = store.claim(ClaimRequest("w", ("default",), 10), now=T0 + 1)
    plans = _plans(store, [
        lambda: [store.admit("w", job.id, [limit], now=T0 + 1) for job in later],
        lambda: store.dependency_stats("db", now=T0 + 1),
        lambda: store.stats("default", now=T0 + 30),
        lambda: store.settle("w", [Outcome.ack(job.id) for job in later], now=T0 + 2),
    ])
    assert plans
    for sql, plan in plans.items():
        for line in plan:
            scanned = re.match(r"SCAN (\w+)", line)
            assert not scanned or scanned[1] != "jobs", (sql, plan)
    store.close()


def test_a_version_7_store_keeps_its_deferred_jobs_waiting_in_the_encoding_both_stores_share(tmp_path):
    # Before v8 a job waiting for a dependency was delayed = 2; now it is delayed with
    # waiting_for set, as on PostgreSQL: still waiting, never work coming due, claimable
    # once its wait is over, and no new arrival then.
    path = str(tmp_path / "queue.db")
    now = time.time()
    _v4_store(path, now)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        for version in (5, 6, 7):
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
        conn.execute("PRAGMA user_version = 7")
        waiting = conn.execute(
            "INSERT INTO jobs (queue, task, payload, state, delayed, run_at, max_attempts, enqueued_at, "
            "waiting_for) VALUES ('limited', 't', 'null', 'queued', 2, ?, 3, ?, 'db')",
            (now + 5, now - 60)).lastrowid
    store = SQLiteBackend(path, synchronous="normal")
    try:
        assert store.get(waiting).state.value == "queued"
        stats = store.stats("limited", now=now, window=60, horizon=30)
        assert (stats.waiting_for_dependency, stats.delayed, stats.coming_due, stats.runnable) == (1, 0, 0, 0)
        assert store.claim(ClaimRequest("w", ("limited",), 5), now=now) == []
        [job] = store.claim(ClaimRequest("w", ("limited",), 5), now=now + 6)
        assert job.id == waiting
        assert store.stats("limited", now=now + 6, window=60).arrival_rate == 0
    finally:
        store.close()
