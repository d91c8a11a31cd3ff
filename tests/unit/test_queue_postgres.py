"""What the PostgreSQL store does beyond the contract suite: connections, concurrency, schema,
passwords, and waking idle workers.  Runs on the session's own server (tests/pg_server.py)."""

from __future__ import annotations

import logging
import os
import threading

import pytest

from flexiqd.errors import QueueError, StoreUnavailable, StoreUnreachable
from flexiqd.queue import ClaimRequest, JobState, NewJob, Outcome, open_backend
from flexiqd.queue.postgres.schema import SCHEMA_LEVEL, SCHEMA_VERSION
from pg_server import PASSWORD, PASSWORD_ROLE, in_ci

try:
    from flexiqd.queue.postgres.database import channel_of
except ImportError:  # no psycopg: skipped on a laptop, a failure in CI
    if in_ci():
        raise
    pytest.skip("psycopg 3 is not installed", allow_module_level=True)

T0 = 1_700_000_000.0


def claim(store, owner="w1", limit=100, *, now=T0, queues=("default",)):
    return store.claim(ClaimRequest(owner=owner, queues=queues, limit=limit, lease_seconds=30), now=now)


def cut_connection(pg_server, store) -> None:
    """End the store's server connection from outside, as a restart or a network cut would."""
    pid = store.database.connection.info.backend_pid
    assert pg_server.admin(f"SELECT pg_terminate_backend({pid})", database="flexiq") == [(True,)]


# -- a dropped connection --------------------------------------------------------------------

def test_a_dropped_connection_is_reopened_and_the_call_done_once(pg_server, postgres_backend):
    store = postgres_backend
    first = store.enqueue([NewJob(task="t", payload=1)], now=T0)
    cut_connection(pg_server, store)
    second = store.enqueue([NewJob(task="t", payload=2)], now=T0)
    assert [job.payload for job in reversed(store.list_jobs())] == [1, 2]
    assert first != second
    cut_connection(pg_server, store)
    [job, other] = claim(store, limit=5)
    cut_connection(pg_server, store)
    assert store.settle("w1", [Outcome.ack(job.id, "ok")], now=T0 + 1) == [job.id]
    cut_connection(pg_server, store)
    stats = store.stats("default", now=T0 + 1)
    assert (stats.runnable, stats.running, stats.completion_rate * stats.window) == (0, 1, 1)
    assert store.get(other.id).attempts == 1  # claimed once, not twice
    assert [row["outcome"] for row in store.executions()] == ["ack"]


def test_a_store_that_cannot_reconnect_says_so_in_one_line(pg_server, postgres_backend, caplog):
    store = postgres_backend
    store.enqueue([NewJob(task="t")], now=T0)
    options = store.database.options
    store.database.options = type(options)(conninfo=options.conninfo.replace("flexiq?", "nodb?"))
    cut_connection(pg_server, store)
    with pytest.raises(StoreUnavailable) as caught:
        store.stats("default", now=T0)
    assert "cannot connect to the queue database" in str(caught.value)
    assert "nodb" in str(caught.value) and "\n" not in str(caught.value)
    assert not isinstance(caught.value, StoreUnreachable)  # no waiting mends a missing database
    # The error is the one thing said: a one-shot command prints it alone, no log line before it.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_connection_made_again_is_said_once_in_the_log(pg_server, postgres_backend, caplog):
    store = postgres_backend
    cut_connection(pg_server, store)
    with caplog.at_level(logging.WARNING):
        store.stats("default", now=T0)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and "was lost; connected again" in said[0], said
    assert store.database.url in said[0]


def test_a_server_that_is_down_is_unreachable_for_now_not_broken(pg_server, postgres_backend):
    store = postgres_backend
    options = store.database.options
    # A port nothing listens on: what a client sees while the server restarts.
    store.database.options = type(options)(conninfo=f"host=127.0.0.1 port=1 dbname=flexiq user=x")
    cut_connection(pg_server, store)
    with pytest.raises(StoreUnreachable, match="cannot connect to the queue database .*refused"):
        store.stats("default", now=T0)


# -- concurrency -----------------------------------------------------------------------------

def run_together(n, action):
    """Run ``action(i)`` in ``n`` threads released at once; return their results in order."""
    barrier = threading.Barrier(n)
    results: list = [None] * n
    errors: list = []

    def run(i):
        try:
            barrier.wait()
            results[i] = action(i)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return results


def test_workers_claiming_at_once_never_get_the_same_job(pg_server):
    url = pg_server.fresh_url()
    stores = [open_backend(url) for _ in range(4)]
    ids = stores[0].enqueue([NewJob(task="t", payload=i) for i in range(200)], now=T0)

    def drain(i):
        got = []
        while batch := claim(stores[i], f"w{i}", limit=3):
            got += [job.id for job in batch]
        return got

    claimed = run_together(4, drain)
    everything = [job_id for got in claimed for job_id in got]
    assert sorted(everything) == ids  # each once: none twice, none left
    assert stores[0].stats("default", now=T0).running == 200
    for store in stores:
        store.close()


def test_recovery_and_purges_from_several_processes_at_once_handle_each_job_once(pg_server):
    url = pg_server.fresh_url()
    stores = [open_backend(url) for _ in range(3)]
    stores[0].enqueue([NewJob(task="t") for _ in range(60)], now=T0)
    claim(stores[0], "gone-host:w:1", limit=60)
    recovered = run_together(3, lambda i: stores[i].recover_expired(now=T0 + 100))
    assert sum(recovered) == 60
    assert [row["outcome"] for row in stores[0].executions()] == ["lost"] * 60
    stats = stores[0].stats("default", now=T0 + 100)
    assert (stats.runnable, stats.running) == (60, 0)
    held = claim(stores[0], "w1", limit=60, now=T0 + 100)
    stores[0].settle("w1", [Outcome.ack(job.id) for job in held], now=T0 + 101)
    purged = run_together(3, lambda i: stores[i].purge(states=[JobState.DONE], finished_before=T0 + 200))
    assert sum(purged) == 60 and stores[0].list_jobs() == [] and stores[0].executions() == []
    assert stores[0].queues() == []
    for store in stores:
        store.close()


def test_the_periodic_sweeps_run_once_per_fleet_under_an_advisory_lock(pg_server):
    import psycopg

    url = pg_server.fresh_url()
    store = open_backend(url)
    store.enqueue([NewJob(task="t") for _ in range(3)], now=T0)
    claim(store, "gone-host:w:1", limit=3)
    schema = url.rsplit("search_path%3D", 1)[1]
    with psycopg.connect(pg_server.socket_url("flexiq", schema=schema), autocommit=True) as other:
        with other.transaction():
            other.execute("SELECT pg_advisory_xact_lock(hashtext('flexiq maintenance of ' || current_schema()))")
            # Another daemon is at it: this one leaves the work to it.
            assert store.recover_expired(now=T0 + 100) == 0
            assert store.stats("default", now=T0 + 100).running == 3
    assert store.recover_expired(now=T0 + 100) == 3
    held = claim(store, "w1", limit=3, now=T0 + 100)
    store.settle("w1", [Outcome.ack(job.id) for job in held], now=T0 + 101)
    with psycopg.connect(pg_server.socket_url("flexiq", schema=schema), autocommit=True) as other:
        with other.transaction():
            other.execute("SELECT pg_advisory_xact_lock(hashtext('flexiq maintenance of ' || current_schema()))")
            # The retention sweep too; an operator's purge runs all the same.
            assert store.purge(states=[JobState.DONE], finished_before=T0 + 200, sweep=True) == 0
            assert store.purge(states=[JobState.DONE], finished_before=T0 + 200) == 3
    store.close()


def test_processes_opening_a_new_store_at_once_create_it_once(pg_server):
    url = pg_server.fresh_url()
    stores = run_together(4, lambda i: open_backend(url))
    stores[0].enqueue([NewJob(task="t")], now=T0)
    assert stores[3].stats("default", now=T0).runnable == 1
    schema = url.rsplit("search_path%3D", 1)[1]
    assert pg_server.admin(f"SELECT version FROM {schema}.flexiq_schema", database="flexiq") == [
        (SCHEMA_LEVEL,)]
    assert pg_server.admin(f"SELECT max(step) FROM {schema}.flexiq_schema_steps", database="flexiq") == [
        (SCHEMA_VERSION,)]
    for store in stores:
        store.close()


def test_a_store_newer_than_this_version_is_refused_clearly(pg_server):
    url = pg_server.fresh_url()
    open_backend(url).close()
    schema = url.rsplit("search_path%3D", 1)[1]
    pg_server.admin(f"UPDATE {schema}.flexiq_schema SET version = {SCHEMA_VERSION + 1}", database="flexiq")
    with pytest.raises(StoreUnavailable, match=f"schema version {SCHEMA_VERSION + 1}, newer than"):
        open_backend(url)


def test_the_claim_walks_the_claim_index(postgres_backend):
    store = postgres_backend
    store.enqueue([NewJob(task="t", priority=i % 5) for i in range(2000)], now=T0)
    with store.database.connection.cursor() as cursor:
        cursor.execute("ANALYZE flexiq_jobs")
        plan = "\n".join(row[0] for row in cursor.execute(
            "EXPLAIN SELECT id FROM flexiq_jobs WHERE state = 'queued' AND NOT delayed "
            f"AND queue = 'default' AND run_at <= {T0 + 1} ORDER BY priority DESC, run_at, id LIMIT 10 "
            "FOR UPDATE SKIP LOCKED"))
    assert "flexiq_jobs_claim" in plan and "Sort" not in plan


def test_counts_rows_of_emptied_tenants_are_deleted(postgres_backend):
    store = postgres_backend
    store.enqueue([NewJob(task="t", tenant=f"t{i}") for i in range(5)], now=T0)
    for job in claim(store, limit=5):
        store.settle("w1", [Outcome.ack(job.id)], now=T0)
    store.database.write("fold", lambda tx: tx.fold())  # the changes moved into the totals
    assert store.database.connection.execute("SELECT count(*) FROM flexiq_counts").fetchone()[0] == 5  # done, per tenant
    store.purge(states=[JobState.DONE], finished_before=T0 + 1)
    assert store.queues() == []
    store.database.write("fold", lambda tx: tx.fold())
    assert store.database.connection.execute("SELECT count(*) FROM flexiq_counts").fetchone()[0] == 0
    assert store.database.connection.execute("SELECT count(*) FROM flexiq_count_changes").fetchone()[0] == 0


def test_the_figures_are_the_same_before_and_after_the_changes_are_folded(postgres_backend):
    store = postgres_backend
    store.enqueue([NewJob(task="t", tenant=f"t{i % 3}") for i in range(30)], now=T0)
    store.enqueue([NewJob(task="t", delay=5) for i in range(4)], now=T0)
    held = claim(store, limit=12, now=T0 + 1)
    store.settle("w1", [Outcome.ack(job.id) for job in held[:5]] + [Outcome.fail(held[5].id, "x")],
                 now=T0 + 2)

    def read():
        return store.stats("default", now=T0 + 3, window=60.0, horizon=10.0)

    unfolded = read()
    assert store.database.connection.execute("SELECT count(*) FROM flexiq_count_changes").fetchone()[0] > 0
    store.database.write("fold", lambda tx: tx.fold())
    assert store.database.connection.execute("SELECT count(*) FROM flexiq_count_changes").fetchone()[0] == 0
    assert read() == unfolded
    # The failed job's retry (under 1 s of backoff) is due again by T0 + 3: runnable.
    assert (unfolded.runnable, unfolded.running, unfolded.delayed) == (19, 6, 4)


# -- passwords and connection errors ---------------------------------------------------------

def password_url(pg_server, **params):
    return pg_server.url(user=PASSWORD_ROLE, **params)


def test_a_password_file_is_read_for_the_connection(pg_server, tmp_path):
    secret = tmp_path / "db.password"
    secret.write_text(PASSWORD + "\n")
    store = open_backend(password_url(pg_server, password_file=str(secret)))
    assert len(store.enqueue([NewJob(task="t")], now=T0)) == 1
    assert "password" in store.url and PASSWORD not in store.url
    store.close()


def test_a_systemd_credential_holds_the_password(pg_server, tmp_path, monkeypatch):
    (tmp_path / "flexiq-db").write_text(PASSWORD)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    store = open_backend(password_url(pg_server, password_credential="flexiq-db"))
    store.close()
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path / "none"))
    with pytest.raises(StoreUnavailable, match="credential 'flexiq-db' is not in"):
        open_backend(password_url(pg_server, password_credential="flexiq-db"))


def test_libpqs_own_password_file_is_honoured(pg_server, tmp_path, monkeypatch):
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"127.0.0.1:{pg_server.port}:*:{PASSWORD_ROLE}:{PASSWORD}\n")
    pgpass.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(pgpass))
    open_backend(password_url(pg_server)).close()


@pytest.mark.parametrize("case, expected", [
    ("wrong-password", "password authentication failed"),
    ("missing-database", 'database "nosuchdb" does not exist'),
    ("unreachable", "Connection refused"),
    ("unreadable-password-file", "cannot read password_file"),
])
def test_connection_failures_are_one_clear_line(pg_server, tmp_path, case, expected):
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password")
    url = {
        "wrong-password": password_url(pg_server, password_file=str(wrong)),
        "missing-database": pg_server.url("nosuchdb"),
        "unreachable": f"postgresql://flexiq@127.0.0.1:{pg_server.port + 1 if pg_server.port < 65535 else 1}/flexiq",
        "unreadable-password-file": password_url(pg_server, password_file=str(tmp_path / "absent")),
    }[case]
    with pytest.raises(StoreUnavailable) as caught:
        open_backend(url)
    message = str(caught.value)
    assert expected in message and "\n" not in message
    assert PASSWORD not in message and "not-the-password" not in message


def test_a_password_in_the_url_is_never_shown(pg_server):
    with pytest.raises(StoreUnavailable) as caught:
        open_backend(f"postgresql://{PASSWORD_ROLE}:hunter2@127.0.0.1:{pg_server.port}/nosuchdb")
    assert "hunter2" not in str(caught.value) and ":***@" in str(caught.value)
    with pytest.raises(StoreUnavailable) as caught:
        open_backend(f"postgresql://{PASSWORD_ROLE}@127.0.0.1:{pg_server.port}/nosuchdb?password=hunter2")
    assert "hunter2" not in str(caught.value) and "password=***" in str(caught.value)


# -- waking idle workers ---------------------------------------------------------------------

def test_channel_names_fit_postgres_identifiers():
    assert channel_of("mail") == "flexiq.mail"
    long = channel_of("q" * 200)
    assert len(long) <= 63 and long != channel_of("q" * 201)


def test_an_enqueue_wakes_a_subscriber_of_its_queue_only(pg_server):
    url = pg_server.fresh_url()
    listener, producer = open_backend(url), open_backend(url)
    woken = {"mail": threading.Event(), "other": threading.Event()}
    closers = [listener.subscribe(["mail"], woken["mail"].set),
               listener.subscribe(["other"], woken["other"].set)]
    try:
        # Each subscriber is woken once when its LISTEN is in place.
        assert woken["mail"].wait(10) and woken["other"].wait(10)
        woken["mail"].clear()
        woken["other"].clear()
        producer.enqueue([NewJob(task="t", queue="mail")], now=T0)
        assert woken["mail"].wait(10)
        assert not woken["other"].is_set()
        woken["mail"].clear()
        producer.enqueue([NewJob(task="t", queue="mail", delay=60)], now=T0)  # not due: no wake
        assert not woken["mail"].wait(0.3)
        producer.stats("mail", now=T0 + 61)  # promotes it: now it is due
        assert woken["mail"].wait(10)
    finally:
        for close in closers:
            close()
    threads = [t for t in threading.enumerate() if t.name == "flexiq-listen"]
    assert threads == []
    listener.close()
    producer.close()


def test_listen_off_starts_no_listener(pg_server):
    store = open_backend(pg_server.fresh_url(listen="off"))
    close = store.subscribe(["default"], lambda: None)
    assert [t for t in threading.enumerate() if t.name == "flexiq-listen"] == []
    close()
    store.close()


def test_a_listener_whose_connection_drops_listens_again_and_wakes_once(pg_server):
    url = pg_server.fresh_url()
    store = open_backend(url)
    woken = threading.Event()
    close = store.subscribe(["default"], woken.set)
    try:
        assert woken.wait(10)  # listening
        woken.clear()
        def listeners():
            return pg_server.admin("SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN%'",
                                   database="flexiq")

        for _ in range(100):
            if listeners():
                break
            threading.Event().wait(0.05)
        [(pid,)] = listeners()
        pg_server.admin(f"SELECT pg_terminate_backend({pid})")
        assert woken.wait(15)  # reconnected: it looks once for what it may have missed
    finally:
        close()
    store.close()


def test_a_closed_store_refuses_calls(postgres_backend):
    postgres_backend.close()
    postgres_backend.close()
    with pytest.raises(QueueError, match="closed"):
        postgres_backend.get(1)


def test_the_pid_in_owner_names_is_this_process(postgres_backend):
    # The recovery rule "a live local owner keeps its leases" holds on PostgreSQL too.
    store = postgres_backend
    store.enqueue([NewJob(task="t")], now=T0)
    me = f"{os.uname().nodename}:w:{os.getpid()}"
    claim(store, me)
    assert store.recover_expired(now=T0 + 1000) == 0


def test_libpq_parameters_reach_libpq_as_written_and_flexiqds_own_do_not(tmp_path):
    from flexiqd.queue.url import postgres_connect_options

    secret = tmp_path / "pw"
    secret.write_text("first line\nsecond line\n")
    options = postgres_connect_options(
        f"postgresql://u@h/d?options=-c%20search_path%3Dq&listen=off&password_file={secret}&sslmode=disable")
    assert options.conninfo == "postgresql://u@h/d?options=-c%20search_path%3Dq&sslmode=disable"
    assert (options.password, options.listen, options.prepare) == ("first line", False, True)
    assert postgres_connect_options("postgres://u@h/d?prepare=off").prepare is False


def test_prepare_off_prepares_nothing_on_the_server(pg_server):
    store = open_backend(pg_server.fresh_url(prepare="off"))
    for _ in range(10):
        store.stats("default", now=T0)
    assert store.database.connection.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] == 0
    store.close()
    store = open_backend(pg_server.fresh_url())
    for _ in range(10):
        store.stats("default", now=T0)
    assert store.database.connection.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] > 0
    store.close()


def test_without_psycopg_a_postgresql_store_is_refused_in_one_line(monkeypatch):
    import sys

    import flexiqd.queue.postgres

    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if python3-psycopg were not installed
    monkeypatch.delitem(sys.modules, "flexiqd.queue.postgres.database", raising=False)
    monkeypatch.delattr(flexiqd.queue.postgres, "database", raising=False)
    with pytest.raises(StoreUnavailable, match="needs psycopg 3 .*install python3-psycopg"):
        open_backend("postgresql://flexiq@db/flexiq")


def test_busy_producers_and_workers_never_deadlock_and_the_counts_stay_exact(pg_server):
    """Enqueues, claims and settles of one queue and tenant at once: the counts and rates they
    all change must not make them wait on each other in a cycle (each wait would be a deadlock
    found after a second, and a transaction run again)."""
    url = pg_server.fresh_url()
    stores = [open_backend(url) for _ in range(4)]
    deadlocks = "SELECT deadlocks FROM pg_stat_database WHERE datname = 'flexiq'"
    before = pg_server.admin(deadlocks)[0][0]

    def work(i):
        store, owner, held = stores[i], f"w{i}", []
        for round_ in range(60):
            now = T0 + round_
            if i % 2 == 0:
                store.enqueue([NewJob(task="t", tenant="acme") for _ in range(3)], now=now)
            _, held = store.settle_and_claim(owner, [Outcome.ack(job.id) for job in held],
                                             ClaimRequest(owner, ("default",), 3), now=now)
        store.settle(owner, [Outcome.ack(job.id) for job in held], now=T0 + 60)

    run_together(4, work)
    assert pg_server.admin(deadlocks)[0][0] == before
    stats = stores[0].stats("default", now=T0 + 60, window=120)
    rows = dict(stores[0].database.connection.execute("SELECT state, count(*) FROM flexiq_jobs GROUP BY state").fetchall())
    assert (stats.runnable, stats.running) == (rows.get("queued", 0), rows.get("running", 0)) == (
        2 * 60 * 3 - rows["done"], 0)
    assert stats.completion_rate * stats.window == rows["done"]
    assert stats.arrival_rate * stats.window == 2 * 60 * 3
    for store in stores:
        store.close()


def test_connection_parameters_in_the_url_win_over_flexiqds_defaults(pg_server):
    store = open_backend(pg_server.fresh_url(application_name="billing-workers"))
    assert store.database.connection.execute("SHOW application_name").fetchone()[0] == "billing-workers"
    store.close()
    store = open_backend(pg_server.fresh_url())
    assert store.database.connection.execute("SHOW application_name").fetchone()[0] == "flexiqd"
    store.close()


def test_reads_that_must_agree_run_in_one_read_only_snapshot_and_writes_do_not(postgres_backend):
    def isolation(conn):
        return [conn.execute(f"SHOW {name}").fetchone()[0]
                for name in ("transaction_isolation", "transaction_read_only")]

    database = postgres_backend.database
    assert database.read("read", lambda tx: isolation(tx.conn)) == ["repeatable read", "on"]
    assert database.write("write", lambda tx: isolation(tx.conn)) == ["read committed", "off"]


def lose_the_next_commit_reply(pg_server, store, monkeypatch):
    """Make the next transaction commit, then cut its connection before the caller hears so:
    to the store, the COMMIT may or may not have happened."""
    import psycopg

    real_once = store.database._once
    armed = [True]

    def once_then_cut(conn, body, snapshot, committing):
        result = real_once(conn, body, snapshot, committing)
        if armed:
            armed.clear()
            cut_connection(pg_server, store)
            conn.execute("SELECT 1")  # raises: the connection is gone
            raise AssertionError("the cut connection still answered")
        return result

    monkeypatch.setattr(store.database, "_once", once_then_cut)
    return armed


def test_a_claim_whose_commit_reply_was_lost_returns_the_jobs_it_did_claim(pg_server, postgres_backend,
                                                                          monkeypatch):
    store = postgres_backend
    ids = store.enqueue([NewJob(task="t", payload=i) for i in range(5)], now=T0)
    armed = lose_the_next_commit_reply(pg_server, store, monkeypatch)
    settled, claimed = store.settle_and_claim("w1", [], ClaimRequest("w1", ("default",), 3), now=T0 + 1)
    assert not armed  # the commit did happen, and its reply was lost
    assert [job.id for job in claimed] == ids[:3]
    assert [store.get(job_id).attempts for job_id in ids] == [1, 1, 1, 0, 0]  # claimed once each
    assert store.stats("default", now=T0 + 1).running == 3


def test_a_settle_whose_commit_reply_was_lost_is_applied_once(pg_server, postgres_backend, monkeypatch):
    store = postgres_backend
    store.enqueue([NewJob(task="t") for _ in range(2)], now=T0)
    held = claim(store)
    lose_the_next_commit_reply(pg_server, store, monkeypatch)
    store.settle_and_claim("w1", [Outcome.ack(job.id) for job in held], None, now=T0 + 1)
    assert [row["outcome"] for row in store.executions()] == ["ack", "ack"]
    stats = store.stats("default", now=T0 + 1)
    assert (stats.running, stats.completion_rate * stats.window) == (0, 2)


def test_an_enqueue_whose_commit_reply_was_lost_says_so_and_is_not_repeated(pg_server, postgres_backend,
                                                                           monkeypatch):
    store = postgres_backend
    lose_the_next_commit_reply(pg_server, store, monkeypatch)
    with pytest.raises(StoreUnavailable, match="may or may not have happened"):
        store.enqueue([NewJob(task="t")], now=T0)
    assert len(store.list_jobs()) == 1  # it had happened: stored once, not twice


def test_ended_attempts_wait_at_a_gap_an_open_transaction_may_fill(pg_server):
    import psycopg

    url = pg_server.fresh_url()
    store = open_backend(url)
    ids = store.enqueue([NewJob(task="t") for _ in range(3)], now=T0)
    claim(store, limit=3)
    cursor, _ = store.ended_attempts(None)
    # Another worker's transaction records an attempt, and has not committed yet.
    slow = psycopg.connect(url)
    slow.execute("INSERT INTO flexiq_executions (job_id, attempt, worker, finished_at, outcome) "
                 "VALUES (%s, 1, 'w1', %s, 'ack')", (ids[0], T0))
    store.settle("w1", [Outcome.ack(ids[1])], now=T0 + 1)  # a later id, committed first
    assert store.ended_attempts(cursor) == (cursor, [])  # not past the gap: it may still fill
    slow.commit()
    cursor, ended = store.ended_attempts(cursor)
    assert [attempt.outcome for attempt in ended] == ["ack", "ack"]
    # A gap left by a transaction that rolled back is passed once it is old.
    slow.execute("INSERT INTO flexiq_executions (job_id, attempt, worker, finished_at, outcome) "
                 "VALUES (%s, 1, 'w1', %s, 'ack')", (ids[0], T0))
    slow.rollback()
    store.settle("w1", [Outcome.ack(ids[2])], now=T0 + 2)
    assert store.ended_attempts(cursor) == (cursor, [])
    store.database.connection.execute("UPDATE flexiq_executions SET recorded_at = recorded_at - interval '1 minute'")
    cursor, ended = store.ended_attempts(cursor)
    assert len(ended) == 1 and store.ended_attempts(cursor) == (cursor, [])
    slow.close()
    store.close()


def test_arrivals_since_count_what_is_not_folded_yet(postgres_backend):
    store = postgres_backend
    store.enqueue([NewJob(task="t")] * 3, now=T0)
    store.stats("default", now=T0)  # folded
    store.enqueue([NewJob(task="t")] * 2, now=T0)
    store.enqueue([NewJob(task="t")], now=T0 + 1)
    assert store.arrivals_since("default", int(T0)) == {int(T0): 5, int(T0) + 1: 1}
    assert store.arrivals_since("default", int(T0) + 1) == {int(T0) + 1: 1}
