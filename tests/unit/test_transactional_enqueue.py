"""Enqueue in the application's own transaction: the job exists exactly when the
application's writes commit (``connection=``, and the SQL function ``flexiq_enqueue``).

PostgreSQL: the application's psycopg connection, or SQL; a rollback leaves no job, no
count and no arrival; a commit leaves the job, claimable at once, and wakes the workers
listening on its queue -- at the commit, not before.  SQLite: the application's sqlite3
connection to the store's file.
"""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from flexiqd.errors import QueueError
from flexiqd.queue import ClaimRequest, Queue, open_backend
from flexiqd.queue.declarations import TaskDeclaration
from flexiqd.queue.url import postgres_connect_options

psycopg = pytest.importorskip("psycopg")

MAIL = TaskDeclaration(task="mail.send", queue="mail", priority=5, max_attempts=7, timeout=30.0)


class Rollback(Exception):
    """Raised inside a transaction to roll it back."""


def app_queue(url: str) -> Queue:
    app = Queue(url)

    @app.task("orders.confirm", queue="orders", priority=3, max_attempts=4)
    def confirm(order_id):
        return order_id

    return app


def claim_now(store, queue: str):
    return store.claim(ClaimRequest(owner="w1", queues=(queue,), limit=10, lease_seconds=30), now=time.time())


def listening(store, queue: str) -> threading.Event:
    """An Event set each time ``store`` is woken for ``queue``; cleared once its LISTEN is in place."""
    woken = threading.Event()
    stop = store.subscribe([queue], woken.set)
    assert woken.wait(10), "the listener never started"
    woken.clear()
    listening.stops.append(stop)
    return woken


listening.stops = []


@pytest.fixture
def pg(pg_server):
    """(url, store, the application's own psycopg connection to the store's schema)."""
    url = pg_server.fresh_url()
    store = open_backend(url)
    conn = psycopg.connect(postgres_connect_options(url).conninfo)
    conn.execute("CREATE TABLE orders (id integer PRIMARY KEY)")
    conn.commit()
    yield url, store, conn
    while listening.stops:
        listening.stops.pop()()
    conn.close()
    store.close()


def test_a_rolled_back_transaction_leaves_no_job_no_count_and_no_arrival(pg):
    url, store, conn = pg
    app = app_queue(url)
    with pytest.raises(Rollback):
        with conn.transaction():
            conn.execute("INSERT INTO orders VALUES (1)")
            job_id = app.tasks["orders.confirm"].enqueue(1, connection=conn)
            assert isinstance(job_id, int)
            raise Rollback
    assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 0
    assert store.list_jobs(limit=10) == []
    stats = store.stats("orders", now=time.time())
    assert (stats.runnable, stats.arrival_rate) == (0, 0)
    assert claim_now(store, "orders") == []
    app.close()


def test_a_committed_transaction_leaves_the_job_claimable_at_once_and_wakes_workers_at_commit(pg):
    url, store, conn = pg
    app = app_queue(url)
    woken = listening(store, "orders")
    with conn.transaction():
        conn.execute("INSERT INTO orders VALUES (2)")
        job_id = app.tasks["orders.confirm"].enqueue(2, connection=conn)
        # Not before the commit: neither visible nor announced.
        assert store.list_jobs(limit=10) == []
        assert not woken.wait(0.3)
    assert woken.wait(10)
    job = store.get(job_id)
    assert (job.queue, job.priority, job.max_attempts, job.payload) == ("orders", 3, 4, {"args": [2], "kwargs": {}})
    stats = store.stats("orders", now=time.time())
    assert stats.runnable == 1 and stats.arrival_rate * stats.window == 1
    assert [j.id for j in claim_now(store, "orders")] == [job_id]
    app.close()


def test_a_connection_not_in_autocommit_joins_the_transaction_its_first_statement_opens(pg):
    url, store, conn = pg
    app = app_queue(url)
    app.tasks["orders.confirm"].enqueue(3, connection=conn)  # opens the transaction
    conn.execute("INSERT INTO orders VALUES (3)")
    conn.rollback()
    assert store.list_jobs(limit=10) == []
    job_id = app.enqueue("orders.confirm", [4], connection=conn)
    conn.commit()
    assert store.get(job_id).queue == "orders"
    app.close()


def test_the_applications_row_factory_does_not_matter(pg):
    url, store, conn = pg
    from psycopg.rows import dict_row

    conn.row_factory = dict_row
    with conn.transaction():
        job_id = app_queue(url).enqueue("orders.confirm", [9], connection=conn)
    assert store.get(job_id).payload["args"] == [9]


def test_an_autocommit_connection_commits_the_jobs_at_once_all_or_none(pg):
    url, store, conn = pg
    conn.autocommit = True
    app = app_queue(url)
    ids = app.tasks["orders.confirm"].map([10, 11, 12], connection=conn)
    assert ids == sorted(ids) and [store.get(i).payload["args"] for i in ids] == [[10], [11], [12]]
    app.close()


def test_by_name_in_a_transaction_takes_the_declaration(pg):
    url, store, conn = pg
    store.declare_tasks([MAIL], by="w", now=time.time())
    producer = Queue(url)
    with conn.transaction():
        job_id = producer.enqueue("mail.send", ["a@example.org"], connection=conn)
        other = producer.enqueue("mail.send", ["b"], priority=1, timeout=None, connection=conn)
    job = store.get(job_id)
    assert (job.queue, job.priority, job.max_attempts, job.timeout) == ("mail", 5, 7, 30.0)
    job = store.get(other)
    assert (job.queue, job.priority, job.max_attempts, job.timeout) == ("mail", 1, 7, None)
    producer.close()


def test_connection_errors_name_what_is_wrong(pg, tmp_path):
    url, store, conn = pg
    with pytest.raises(QueueError, match="this queue's store is sqlite"):
        app_queue(f"sqlite:///{tmp_path}/q.db").tasks["orders.confirm"].enqueue(1, connection=conn)
    with pytest.raises(QueueError, match="psycopg 3 connection .* or sqlite3 connection .*got builtins.str"):
        app_queue(url).tasks["orders.confirm"].enqueue(1, connection="dbname=flexiq")
    # A connection to a database without the store.
    with psycopg.connect(postgres_connect_options(url).conninfo, dbname="postgres") as elsewhere:
        with pytest.raises(QueueError, match=r"has no .*\.flexiq_enqueue\(\): connect to the queue's database"):
            app_queue(url).tasks["orders.confirm"].enqueue(1, connection=elsewhere)


def test_the_applications_search_path_need_not_name_the_stores_schema(pg):
    url, store, _ = pg
    with psycopg.connect(postgres_connect_options(url).conninfo, options="-csearch_path=public") as app_conn:
        job_id = app_queue(url).tasks["orders.confirm"].enqueue(5, connection=app_conn)
    assert store.get(job_id).payload["args"] == [5]


# -- the SQL function ------------------------------------------------------------------------

def sql_enqueue(conn, call: str, *params):
    with conn.transaction():
        return conn.execute(f"SELECT {call}", params).fetchone()[0]


def test_sql_flexiq_enqueue_takes_the_declaration_and_explicit_options_override(pg):
    _, store, conn = pg
    store.declare_tasks([MAIL], by="w", now=time.time())
    declared = store.get(sql_enqueue(conn, "flexiq_enqueue('mail.send', '[\"a@example.org\"]')"))
    assert (declared.queue, declared.priority, declared.max_attempts, declared.timeout) == ("mail", 5, 7, 30.0)
    assert declared.payload == {"args": ["a@example.org"], "kwargs": {}}
    given = store.get(sql_enqueue(conn, "flexiq_enqueue('mail.send', kwargs => '{\"to\": \"x\"}', queue => 'urgent', "
                                        "priority => 9, max_attempts => 1, timeout => 'infinity', tenant => 'acme')"))
    assert (given.queue, given.priority, given.max_attempts, given.timeout, given.tenant) == \
        ("urgent", 9, 1, None, "acme")
    assert given.payload == {"args": [], "kwargs": {"to": "x"}}
    plain = store.get(sql_enqueue(conn, "flexiq_enqueue('nobody.declared')"))
    assert (plain.queue, plain.priority, plain.max_attempts, plain.timeout) == ("default", 0, 3, None)
    now = time.time()
    assert store.stats("mail", now=now).runnable == 1 and store.stats("urgent", now=now).runnable == 1
    assert store.stats("urgent", now=now).tenants["acme"].runnable == 1


def test_sql_flexiq_enqueue_rolls_back_with_the_transaction_and_wakes_at_commit(pg):
    _, store, conn = pg
    woken = listening(store, "default")
    with pytest.raises(Rollback):
        with conn.transaction():
            conn.execute("SELECT flexiq_enqueue('t')")
            raise Rollback
    assert not woken.wait(0.3)
    assert store.list_jobs(limit=10) == [] and store.stats("default", now=time.time()).arrival_rate == 0
    job_id = sql_enqueue(conn, "flexiq_enqueue('t')")
    assert woken.wait(10)
    assert [j.id for j in claim_now(store, "default")] == [job_id]


def test_sql_flexiq_enqueue_delayed_jobs_come_due_later_and_a_long_queue_name_wakes_its_channel(pg):
    _, store, conn = pg
    delayed = sql_enqueue(conn, "flexiq_enqueue('t', delay => 3600)")
    at = sql_enqueue(conn, "flexiq_enqueue('t', run_at => now() + interval '2 hours')")
    now = time.time()
    stats = store.stats("default", now=now)
    assert (stats.runnable, stats.delayed, stats.arrival_rate) == (0, 2, 0)
    assert store.get(delayed).run_at == pytest.approx(now + 3600, abs=60)
    assert store.get(at).run_at == pytest.approx(now + 7200, abs=60)
    assert claim_now(store, "default") == []
    long_queue = "q" * 80  # its channel is a digest (postgres_listen.channel_of), the same in SQL
    woken = listening(store, long_queue)
    job_id = sql_enqueue(conn, "flexiq_enqueue('t', queue => %s)", long_queue)
    assert woken.wait(10)
    assert [j.id for j in claim_now(store, long_queue)] == [job_id]


def test_sql_flexiq_enqueue_idempotency_key_returns_the_live_job(pg):
    _, store, conn = pg
    first = sql_enqueue(conn, "flexiq_enqueue('t', idempotency_key => 'order-7')")
    assert sql_enqueue(conn, "flexiq_enqueue('t', idempotency_key => 'order-7')") == first
    assert len(store.list_jobs(limit=10)) == 1
    assert store.stats("default", now=time.time()).arrival_rate * 60 == 1


@pytest.mark.parametrize("call, message", [
    ("flexiq_enqueue('')", "a job needs a task name"),
    ("flexiq_enqueue('t', '{\"a\": 1}')", "args must be a JSON array, got a JSON object"),
    ("flexiq_enqueue('t', kwargs => '[1]')", "kwargs must be a JSON object, got a JSON array"),
    ("flexiq_enqueue('t', max_attempts => 0)", "max_attempts must be at least 1, got 0"),
    ("flexiq_enqueue('t', timeout => -1)", "timeout must be more than 0 seconds, got -1"),
    ("flexiq_enqueue('t', queue => '')", "queue must be a name"),
])
def test_sql_flexiq_enqueue_refuses_bad_input_by_name(pg, call, message):
    _, store, conn = pg
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        sql_enqueue(conn, call)
    assert store.list_jobs(limit=10) == []


# -- SQLite ----------------------------------------------------------------------------------

@pytest.fixture
def lite(tmp_path):
    url = f"sqlite:///{tmp_path}/queue.db"
    store = open_backend(url)
    conn = sqlite3.connect(tmp_path / "queue.db")  # the application's, in sqlite3's default mode
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    conn.commit()
    yield url, store, conn
    conn.close()
    store.close()


def test_sqlite_a_rollback_leaves_no_job_and_a_commit_the_job_counted(lite):
    url, store, conn = lite
    app = app_queue(url)
    conn.execute("INSERT INTO orders VALUES (1)")
    app.tasks["orders.confirm"].enqueue(1, connection=conn)
    conn.rollback()
    assert store.list_jobs(limit=10) == []
    assert store.stats("orders", now=time.time()).runnable == 0
    app.tasks["orders.confirm"].enqueue(2, connection=conn)  # opens the transaction, as an INSERT would
    conn.execute("INSERT INTO orders VALUES (2)")
    assert store.list_jobs(limit=10) == []
    conn.commit()
    stats = store.stats("orders", now=time.time())
    assert stats.runnable == 1 and stats.arrival_rate * stats.window == 1
    assert [j.payload["args"] for j in claim_now(store, "orders")] == [[2]]
    app.close()


def test_sqlite_an_autocommit_connection_commits_at_once(lite, tmp_path):
    url, store, conn = lite
    auto = sqlite3.connect(tmp_path / "queue.db", isolation_level=None)
    app = app_queue(url)
    ids = app.tasks["orders.confirm"].map([1, 2], connection=auto)
    assert not auto.in_transaction
    assert [j.id for j in claim_now(store, "orders")] == ids
    auto.close()
    app.close()


def test_sqlite_the_applications_row_factory_does_not_matter(lite):
    url, store, conn = lite
    conn.row_factory = lambda cursor, row: {"row": row}
    app_queue(url).tasks["orders.confirm"].enqueue(8, connection=conn)
    conn.commit()
    assert conn.row_factory is not None
    assert [j.payload["args"] for j in store.list_jobs(limit=10)] == [[8]]


def test_sqlite_a_connection_to_another_file_is_refused(lite, tmp_path):
    url, _, _ = lite
    other = sqlite3.connect(tmp_path / "other.db")
    with pytest.raises(QueueError, match="another file than the queue's store"):
        app_queue(url).tasks["orders.confirm"].enqueue(1, connection=other)
    other.close()


def test_sql_flexiq_enqueue_runs_with_the_callers_privileges_and_needs_only_these(pg, pg_server):
    url, store, conn = pg
    schema = url.rsplit("search_path%3D", 1)[1]
    role = f"producer_{schema}"[:60]
    pg_server.admin(f"CREATE ROLE {role}", database="flexiq")
    try:
        pg_server.admin(f"GRANT USAGE ON SCHEMA {schema} TO {role}; "
                        f"GRANT INSERT, SELECT (id, idempotency_key, state) ON {schema}.flexiq_jobs TO {role}; "
                        f"GRANT INSERT ON {schema}.flexiq_count_changes, {schema}.flexiq_rate_changes TO {role}; "
                        f"GRANT SELECT ON {schema}.flexiq_task_declarations TO {role}", database="flexiq")
        with conn.transaction():
            conn.execute(f"SET LOCAL ROLE {role}")
            job_id = conn.execute("SELECT flexiq_enqueue('t', idempotency_key => 'k')").fetchone()[0]
            assert conn.execute("SELECT flexiq_enqueue('t', idempotency_key => 'k')").fetchone()[0] == job_id
        assert store.stats("default", now=time.time()).runnable == 1
        pg_server.admin(f"REVOKE INSERT ON {schema}.flexiq_rate_changes FROM {role}", database="flexiq")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            with conn.transaction():
                conn.execute(f"SET LOCAL ROLE {role}")
                conn.execute("SELECT flexiq_enqueue('t')")
    finally:
        conn.rollback()
        pg_server.admin(f"DROP OWNED BY {role}; DROP ROLE {role}", database="flexiq")
