"""The PostgreSQL store's own side of dependency limits: the v1 -> v2 migration, and admissions
from many connections at once never exceeding a limit.  Runs on the session's own server."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

from flexiqd.queue import ClaimRequest, NewJob, Outcome, open_backend
from flexiqd.queue.limits import DependencyLimit
from pg_server import in_ci

from test_queue_postgres import run_together

try:
    import psycopg

    from flexiqd.queue.postgres.schema import SCHEMA_LEVEL, SCHEMA_VERSION
except ImportError:  # no psycopg: skipped on a laptop, a failure in CI
    if in_ci():
        raise
    pytest.skip("psycopg 3 is not installed", allow_module_level=True)

T0 = 1_700_000_000.0
# The schema of version 1, as the first PostgreSQL store created it (kept verbatim).
V1_SCHEMA = pathlib.Path(__file__).parent / "data" / "postgres_schema_v1.py"


def _v1_module():
    spec = importlib.util.spec_from_file_location("postgres_schema_v1", V1_SCHEMA)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _v1_store(url: str, now: float) -> None:
    """A version-1 store holding a job in every state, made with version 1's DDL."""
    v1 = _v1_module()
    assert v1.SCHEMA_VERSION == 1
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in v1.SCHEMA:
            conn.execute(statement)
        conn.execute(f"CREATE TABLE {v1.VERSION_TABLE} (version integer NOT NULL)")
        conn.execute(f"INSERT INTO {v1.VERSION_TABLE} (version) VALUES (1)")
        rows = [  # state, delayed, run_at, lease_owner, lease_expires, started_at, finished_at
            ("queued", False, now - 10, None, None, None, None),
            ("queued", True, now + 3600, None, None, None, None),
            ("running", False, now - 5, "elsewhere:w:1", now + 3600, now - 5, None),
            ("dead", False, now - 20, None, None, now - 20, now - 19),
            ("done", False, now - 30, None, None, now - 30, now - 29),
        ]
        for state, delayed, run_at, owner, expires, started, finished in rows:
            conn.execute(
                "INSERT INTO flexiq_jobs (queue, task, payload, state, delayed, run_at, attempts, "
                "max_attempts, tenant, lease_owner, lease_expires, enqueued_at, started_at, finished_at) "
                "VALUES ('default', 't', 'null', %s, %s, %s, %s, 3, 'acme', %s, %s, %s, %s, %s)",
                (state, delayed, run_at, 0 if state == "queued" else 1, owner, expires, now - 60,
                 started, finished))


def _schema_of(url: str) -> str:
    return url.rsplit("search_path%3D", 1)[1]


def _shape(pg_server, schema: str) -> dict:
    """Columns, indexes, triggers, functions and storage options of the store's schema."""
    def rows(sql):
        found = pg_server.admin(sql.replace("{schema}", schema), database="flexiq")
        return [tuple(v.replace(f"{schema}.", "") if isinstance(v, str) else v for v in row) for row in found]

    return {
        "columns": rows("SELECT table_name, column_name, data_type, column_default, is_nullable "
                        "FROM information_schema.columns WHERE table_schema = '{schema}' "
                        "ORDER BY table_name, ordinal_position"),
        "indexes": rows("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = '{schema}' "
                        "ORDER BY indexname"),
        "triggers": rows("SELECT trigger_name, event_manipulation, action_statement FROM "
                         "information_schema.triggers WHERE trigger_schema = '{schema}' ORDER BY 1, 2"),
        "functions": rows("SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n "
                          "ON n.oid = p.pronamespace WHERE n.nspname = '{schema}' ORDER BY 1"),
        "options": rows("SELECT c.relname, c.reloptions FROM pg_class c JOIN pg_namespace n "
                        "ON n.oid = c.relnamespace WHERE n.nspname = '{schema}' AND c.relkind = 'r' ORDER BY 1"),
    }


def _jobs(pg_server, schema: str) -> list:
    return pg_server.admin(
        f"SELECT id, state, delayed, run_at, attempts, tenant, lease_owner, started_at, finished_at "
        f"FROM {schema}.flexiq_jobs ORDER BY id", database="flexiq")


def test_a_version_1_store_is_migrated_to_the_shape_of_a_new_one(pg_server):
    import time

    now = time.time()
    url = pg_server.fresh_url()
    _v1_store(url, now)
    schema = _schema_of(url)
    before = _jobs(pg_server, schema)
    store = open_backend(url)
    assert pg_server.admin(f"SELECT version FROM {schema}.flexiq_schema", database="flexiq") == [
        (SCHEMA_LEVEL,)]
    assert pg_server.admin(f"SELECT max(step) FROM {schema}.flexiq_schema_steps", database="flexiq") == [
        (SCHEMA_VERSION,)]
    assert _jobs(pg_server, schema) == before
    fresh = pg_server.fresh_url()
    open_backend(fresh).close()
    assert _shape(pg_server, schema) == _shape(pg_server, _schema_of(fresh))

    stats = store.stats("default", now=now, window=60)
    assert (stats.runnable, stats.delayed, stats.running, stats.dead, stats.waiting_for_dependency) == (
        1, 1, 1, 1, 0)
    # The migrated store limits and defers like a new one; its count triggers know "waiting".
    limit = DependencyLimit("db", concurrency=1)
    store.enqueue([NewJob(task="t", tenant="acme"), NewJob(task="t", tenant="acme")], now=now)
    jobs = store.claim(ClaimRequest("w2", ("default",), 3), now=now)
    assert len(jobs) == 3
    refusals = [store.admit("w2", job.id, [limit], now=now) for job in jobs]
    assert sum(r is None for r in refusals) == 1
    store.settle("w2", [Outcome.defer(job.id, r) for job, r in zip(jobs, refusals) if r is not None], now=now)
    stats = store.stats("default", now=now)
    assert (stats.waiting_for_dependency, stats.tenants["acme"].waiting_for_dependency) == (2, 2)
    assert stats.runnable == 0
    store.close()


# -- many connections at once ----------------------------------------------------------------

def test_admissions_from_many_connections_at_once_never_exceed_a_concurrency_limit(pg_server):
    url = pg_server.fresh_url()
    stores = [open_backend(url) for _ in range(6)]
    stores[0].enqueue([NewJob(task="t") for _ in range(60)], now=T0)
    held = [stores[i].claim(ClaimRequest(f"w{i}", ("default",), 10), now=T0) for i in range(6)]
    limit = DependencyLimit("db", concurrency=4)

    def admit_all(i):
        return [job.id for job in held[i] if stores[i].admit(f"w{i}", job.id, [limit], now=T0) is None]

    admitted = [job_id for ids in run_together(6, admit_all) for job_id in ids]
    assert len(admitted) == 4
    assert stores[0].dependency_stats("db", now=T0).in_use == 4

    # Slots freed by one worker are taken by the others, still never more than the limit.
    def churn(i):
        inside = set(job_id for job_id in admitted if job_id in {job.id for job in held[i]})
        for step in range(1, 30):
            now = T0 + step
            if inside:
                stores[i].settle(f"w{i}", [Outcome.ack(inside.pop())], now=now)
            for job in held[i]:
                if job.id not in inside and stores[i].admit(f"w{i}", job.id, [limit], now=now) is None:
                    inside.add(job.id)
                    break
            assert stores[i].dependency_stats("db", now=now).in_use <= 4
        return len(inside)

    run_together(6, churn)
    assert stores[0].dependency_stats("db", now=T0 + 30).in_use <= 4
    for store in stores:
        store.close()


def test_admissions_from_many_connections_at_once_never_exceed_a_rate(pg_server):
    url = pg_server.fresh_url()
    stores = [open_backend(url) for _ in range(6)]
    stores[0].enqueue([NewJob(task="t") for _ in range(60)], now=T0)
    held = [stores[i].claim(ClaimRequest(f"w{i}", ("default",), 10), now=T0) for i in range(6)]
    limit = DependencyLimit("sms", rate=1.0, burst=5)

    def admit_all(i):
        return sum(stores[i].admit(f"w{i}", job.id, [limit], now=T0) is None for job in held[i])

    assert sum(run_together(6, admit_all)) == 5  # the burst, and not one start more
    for store in stores:
        store.close()
