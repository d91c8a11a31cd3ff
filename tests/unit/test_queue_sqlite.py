"""The SQLite store's own behaviour: its files, locks, URLs, schema versions and query plans.

Every failure must surface as a ``QueueError`` (``StoreUnavailable`` when the
store cannot be used) whose one-line message names the database and the
problem; a ``sqlite3`` exception reaching the caller is a bug.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import sqlite3
import tempfile
import threading
import time

import pytest

from flexiqd.errors import QueueError, StoreUnavailable
from flexiqd.queue import ClaimRequest, JobState, NewJob, Outcome, default_url, open_backend
from flexiqd.queue.sqlite import sql as sqlite_sql
from flexiqd.queue.store import lifecycle as lifecycle
from flexiqd.queue.sqlite.database import SQLiteBackend
from flexiqd.queue.sqlite.schema import SCHEMA_LEVEL, SCHEMA_VERSION

T0 = 1_700_000_000.0
NOBODY = 65534


def url_of(path, **options):
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return f"sqlite:///{path}" + (f"?{query}" if query else "")


def make_database(path, jobs=1):
    store = SQLiteBackend(str(path), synchronous="normal")
    store.enqueue([NewJob(task="t", payload=i) for i in range(jobs)], now=T0)
    store.close()


@contextlib.contextmanager
def unprivileged():
    """Run the block as an ordinary user, as the packaged daemon does.

    Root ignores file modes (os.access says root may write a 0444 file, and it
    can), so as root the block runs with real and effective ids of ``nobody``;
    the saved id stays 0 so the test can become root again afterwards.
    """
    if os.geteuid() != 0:
        yield
        return
    try:
        os.setresgid(NOBODY, NOBODY, 0)
        os.setresuid(NOBODY, NOBODY, 0)
    except PermissionError:
        os.setresgid(0, 0, 0)
        pytest.skip("running as root without CAP_SETUID: cannot test file modes root ignores")
    try:
        yield
    finally:
        os.setresuid(0, 0, 0)
        os.setresgid(0, 0, 0)


@pytest.fixture
def open_dir():
    """A directory any user may enter (pytest's tmp_path is private to its owner)."""
    path = tempfile.mkdtemp(prefix="flexiq-perm-")
    os.chmod(path, 0o755)
    yield path
    os.chmod(path, 0o755)
    shutil.rmtree(path)


# -- opening -------------------------------------------------------------------------------

def test_a_missing_directory_is_named(tmp_path):
    path = tmp_path / "nope" / "queue.db"
    with pytest.raises(StoreUnavailable, match=r"directory .*nope does not exist") as info:
        open_backend(url_of(path))
    assert str(path) in str(info.value)
    assert not (tmp_path / "nope").exists()


def test_root_may_write_a_read_only_file_so_the_check_needs_another_user(open_dir):
    path = os.path.join(open_dir, "queue.db")
    make_database(path)
    os.chmod(path, 0o444)
    if os.geteuid() == 0:
        assert os.access(path, os.W_OK)  # why unprivileged() drops root below
    with unprivileged():
        assert not os.access(path, os.W_OK)
        with pytest.raises(StoreUnavailable, match="read-only") as info:
            open_backend(url_of(path))
    assert path in str(info.value)


def test_a_new_database_in_a_read_only_directory(open_dir):
    os.chmod(open_dir, 0o555)
    path = os.path.join(open_dir, "queue.db")
    with unprivileged():
        with pytest.raises(StoreUnavailable, match="not writable") as info:
            open_backend(url_of(path))
    assert path in str(info.value)
    assert not os.path.exists(path)


def test_a_writable_database_in_a_read_only_directory(open_dir):
    # WAL needs to create queue.db-wal and -shm beside the file.
    path = os.path.join(open_dir, "queue.db")
    make_database(path)
    os.chmod(path, 0o666)
    os.chmod(open_dir, 0o555)
    with unprivileged():
        with pytest.raises(StoreUnavailable) as info:
            open_backend(url_of(path)).enqueue([NewJob(task="t")], now=T0)
    assert path in str(info.value)
    assert "read-only" in str(info.value) or "cannot open" in str(info.value)


def _random_bytes(path):
    path.write_bytes(random.Random(7).randbytes(16384))


def _text(path):
    path.write_text("queue: default\nworkers: 4\n" * 100)


def _garbled_header(path):
    make_database(path, jobs=50)
    data = bytearray(path.read_bytes())
    data[16:100] = random.Random(3).randbytes(84)
    path.write_bytes(bytes(data))


def _garbled_schema(path):
    make_database(path, jobs=50)
    data = bytearray(path.read_bytes())
    data[100:4096] = random.Random(5).randbytes(3996)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("spoil", [_random_bytes, _text, _garbled_header, _garbled_schema],
                         ids=["random-bytes", "text", "garbled-header", "garbled-schema"])
def test_a_corrupt_database_is_named_as_such(tmp_path, spoil):
    path = tmp_path / "queue.db"
    spoil(path)
    with pytest.raises(StoreUnavailable, match="corrupt") as info:
        open_backend(url_of(path))
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_corrupt_pages_found_after_opening_never_leak_sqlite_errors(tmp_path):
    path = tmp_path / "queue.db"
    store = SQLiteBackend(str(path), synchronous="normal")
    ids = store.enqueue([NewJob(task="t", payload="x" * 60, tenant="a", delay=i % 2)
                         for i in range(3000)], now=T0)
    store.claim(ClaimRequest("w1", ("default",), 500), now=T0 + 5)
    store.close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        # The schema outgrew page 1 (its pages lie among the others): spare them and the table of
        # the schema's steps, read at opening, so it still opens.
        schema_pages = {row[0] - 1 for row in conn.execute(
            "SELECT pageno FROM dbstat WHERE name IN ('sqlite_schema', 'schema_steps')")}
    data = bytearray(path.read_bytes())
    rng = random.Random(1)
    page = 4096
    for number in range(3, len(data) // page, 3):
        if number not in schema_pages:
            data[number * page:(number + 1) * page] = rng.randbytes(page)
    path.write_bytes(bytes(data))

    store = SQLiteBackend(str(path))
    calls = {
        "enqueue": lambda: store.enqueue([NewJob(task="t")], now=T0 + 10),
        "claim": lambda: store.claim(ClaimRequest("w2", ("default",), 50), now=T0 + 100),
        "settle": lambda: store.settle("w1", [Outcome.ack(i) for i in ids[:100]], now=T0 + 10),
        "settle_and_claim": lambda: store.settle_and_claim(
            "w1", [Outcome.fail(ids[0], "x")], ClaimRequest("w1", ("default",), 5), now=T0 + 10),
        "renew": lambda: store.renew("w1", ids[:100], 10, now=T0 + 10),
        "recover_expired": lambda: store.recover_expired(now=T0 + 1000),
        "recover_owner": lambda: store.recover_owner("w1", now=T0 + 10, reason="x"),
        "lease_owners": store.lease_owners,
        "cancel": lambda: store.cancel(ids[2000], now=T0 + 10),
        "get": lambda: store.get(ids[1500]),
        "list_jobs": lambda: store.list_jobs(limit=5000),
        "retry_dead": lambda: store.retry_dead(now=T0 + 10),
        "purge": lambda: store.purge(states=[JobState.DONE], finished_before=T0 + 100),
        "stats": lambda: store.stats("default", now=T0 + 10),
        "queues": store.queues,
        "executions": store.executions,
    }
    unavailable = []
    for name, call in calls.items():
        try:
            call()
        except StoreUnavailable as exc:
            assert str(path) in str(exc) and "corrupt" in str(exc), (name, exc)
            unavailable.append(name)
        except Exception as exc:  # noqa: BLE001 -- anything else is the bug looked for
            pytest.fail(f"{name} raised {type(exc).__name__}: {exc}")
    assert {"claim", "stats", "list_jobs"} <= set(unavailable)
    store.close()


def test_a_directory_in_place_of_the_file(tmp_path):
    (tmp_path / "queue.db").mkdir()
    with pytest.raises(StoreUnavailable, match="cannot open") as info:
        open_backend(url_of(tmp_path / "queue.db"))
    assert str(tmp_path / "queue.db") in str(info.value)


def test_a_full_disk_mid_batch_stores_nothing_and_the_store_carries_on(sqlite_backend):
    sqlite_backend.enqueue([NewJob(task="t")], now=T0)
    conn = sqlite_backend.database.connection  # the file may not grow past a few pages
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages + 5}")
    with pytest.raises(QueueError, match="full") as info:
        sqlite_backend.enqueue([NewJob(task="t", payload="x" * 1000) for _ in range(200)], now=T0)
    assert sqlite_backend.path in str(info.value)
    assert len(sqlite_backend.list_jobs(limit=1000)) == 1
    stats = sqlite_backend.stats("default", now=T0)
    assert (stats.runnable, stats.arrival_rate * stats.window) == (1, 1)
    assert len(sqlite_backend.enqueue([NewJob(task="t")], now=T0)) == 1


def test_a_newer_schema_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "queue.db"
    make_database(path)
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreUnavailable, match="upgrade flexiqd") as info:
        open_backend(url_of(path))
    assert str(path) in str(info.value)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1


def test_reopening_keeps_the_jobs(tmp_path):
    path = tmp_path / "queue.db"
    make_database(path, jobs=3)
    store = open_backend(url_of(path))
    assert store.stats("default", now=T0).runnable == 3
    store.close()
    store.close()  # idempotent
    with pytest.raises(QueueError, match="closed"):
        store.enqueue([NewJob(task="t")], now=T0)
    with pytest.raises(QueueError, match="closed"):
        store.stats("default", now=T0)


# -- locks ---------------------------------------------------------------------------------

@pytest.fixture
def locked(tmp_path):
    """A database another connection holds a write transaction on."""
    path = tmp_path / "queue.db"
    make_database(path, jobs=2)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    yield path
    holder.execute("ROLLBACK")
    holder.close()


def test_a_database_locked_past_the_busy_timeout_is_unavailable(locked):
    store = open_backend(url_of(locked, busy_timeout=0.2))
    writes = {
        "enqueue": lambda: store.enqueue([NewJob(task="t")], now=T0),
        "claim": lambda: store.claim(ClaimRequest("w1", ("default",), 1), now=T0),
        "recover_expired": lambda: store.recover_expired(now=T0),
    }
    for name, write in writes.items():
        with pytest.raises(StoreUnavailable, match="locked") as info:
            write()
        assert str(locked) in str(info.value) and "0.2s" in str(info.value), name
    # Readers are not blocked by a writer (WAL): the autoscaler still sees its signals.
    assert store.stats("default", now=T0).runnable == 2
    store.close()


def test_the_lock_going_away_lets_the_store_carry_on(tmp_path):
    path = tmp_path / "queue.db"
    make_database(path, jobs=1)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    store = open_backend(url_of(path, busy_timeout=0.2))
    with pytest.raises(StoreUnavailable, match="locked"):
        store.enqueue([NewJob(task="t")], now=T0)
    holder.execute("ROLLBACK")
    holder.close()
    assert len(store.enqueue([NewJob(task="t")], now=T0)) == 1
    assert store.stats("default", now=T0).runnable == 2
    store.close()


def test_creating_a_database_someone_else_holds_locked(tmp_path):
    path = tmp_path / "queue.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode = WAL")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("CREATE TABLE other (x)")
    with pytest.raises(StoreUnavailable, match="locked") as info:
        open_backend(url_of(path, busy_timeout=0.2))
    assert str(path) in str(info.value)
    holder.execute("ROLLBACK")
    holder.close()


# -- URLs ----------------------------------------------------------------------------------

@pytest.mark.parametrize("url, message", [
    ("mysql://localhost/q", "unknown store scheme 'mysql'"),
    ("/var/lib/flexiq/queue.db", "unknown store scheme"),
    ("", "unknown store scheme"),
    ("sqlite://queue.db", "three slashes"),
    ("sqlite:///", "needs a path"),
    ("sqlite:///?synchronous=normal", "needs a path"),
    ("sqlite:///{dir}/q.db?journal=wal", "unknown option 'journal'"),
    ("sqlite:///{dir}/q.db?synchronus", "unknown option 'synchronus'"),
    ("sqlite:///{dir}/q.db?synchronous=fast", "synchronous='fast'"),
    ("sqlite:///{dir}/q.db?synchronous=", "synchronous=''"),
    ("sqlite:///{dir}/q.db?busy_timeout=soon", "busy_timeout must be seconds"),
    ("sqlite:///{dir}/q.db?busy_timeout=", "busy_timeout must be seconds"),
    ("sqlite:///{dir}/q.db?busy_timeout=nan", "busy_timeout must be seconds"),
    ("sqlite:///{dir}/q.db?busy_timeout=inf", "busy_timeout must be seconds"),
    ("sqlite:///{dir}/q.db?busy_timeout=-1", "busy_timeout must be seconds"),
    ("postgresql://localhost/flexiq?listen=maybe", "listen must be on or off"),
    ("postgres://localhost/flexiq?password_file=rel/pw", "password_file must be an absolute path"),
    ("redis://localhost/0", "unknown store scheme 'redis'"),
])
def test_bad_urls_are_refused_with_the_url_in_the_message(tmp_path, url, message):
    url = url.format(dir=tmp_path)
    with pytest.raises(StoreUnavailable) as info:
        open_backend(url)
    assert message in str(info.value)
    assert str(info.value).startswith(url) or url in str(info.value)
    assert not (tmp_path / "q.db").exists()


def test_url_options_reach_the_store(tmp_path):
    store = open_backend(url_of(tmp_path / "q.db", synchronous="NORMAL", busy_timeout=0.5))
    assert store.busy_timeout == 0.5
    assert store.url.endswith("?synchronous=NORMAL&busy_timeout=0.5")
    conn = store.database.connection
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.close()
    store = open_backend(url_of(tmp_path / "q.db"))
    conn = store.database.connection
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL: durable by default
    store.close()


def test_relative_and_default_urls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    open_backend("sqlite:///relative.db").close()
    assert (tmp_path / "relative.db").exists()
    monkeypatch.delenv("FLEXIQ_URL", raising=False)
    assert default_url() == "sqlite:////var/lib/flexiq/queue.db"
    monkeypatch.setenv("FLEXIQ_URL", "sqlite:////srv/q.db")
    assert default_url() == "sqlite:////srv/q.db"


# -- several connections -------------------------------------------------------------------

@pytest.mark.parametrize("before_statement", [1, 2, 3, 4, 5])
def test_stats_read_one_snapshot_while_another_process_writes(tmp_path, before_statement):
    path = tmp_path / "queue.db"
    reader = SQLiteBackend(str(path), synchronous="normal")
    writer = SQLiteBackend(str(path), synchronous="normal")
    reader.enqueue([NewJob(task="t") for _ in range(5)], now=T0)
    statements = []

    def between_statements(sql):
        # Another process commits 10 delayed jobs while stats() is half-way through its reads.
        statements.append(sql)
        if len(statements) == before_statement:
            writer.enqueue([NewJob(task="t", delay=100) for _ in range(10)], now=T0)

    reader.database.connection.set_trace_callback(between_statements)
    stats = reader.stats("default", now=T0)
    reader.database.connection.set_trace_callback(None)
    assert len(statements) >= before_statement
    assert (stats.runnable, stats.delayed) in {(5, 0), (5, 10)}
    stats = reader.stats("default", now=T0)
    assert (stats.runnable, stats.delayed) == (5, 10)
    reader.close()
    writer.close()


def test_workers_in_several_processes_and_threads_run_each_job_exactly_once(tmp_path):
    path = tmp_path / "queue.db"
    stores = [SQLiteBackend(str(path), synchronous="normal") for _ in range(2)]
    ids = stores[0].enqueue([NewJob(task="t", payload=i) for i in range(300)], now=T0)
    ran: dict[str, list[int]] = {}
    errors = []

    def work(store, owner):
        mine = ran.setdefault(owner, [])
        try:
            claimed = store.claim(ClaimRequest(owner, ("default",), 7), now=T0)
            while claimed:
                mine.extend(job.id for job in claimed)
                _, claimed = store.settle_and_claim(
                    owner, [Outcome.ack(job.id, owner) for job in claimed],
                    ClaimRequest(owner, ("default",), 7), now=T0 + 1)
        except Exception as exc:  # noqa: BLE001 -- reported below, on the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(stores[i % 2], f"w{i}")) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    every_run = sorted(job_id for runs in ran.values() for job_id in runs)
    assert every_run == ids, "a job was run twice or never"
    rows = stores[1].executions()
    assert sorted(row["job_id"] for row in rows) == ids
    assert all(stores[0].get(row["job_id"]).result == row["worker"] for row in rows)
    stats = stores[1].stats("default", now=T0 + 1)
    assert (stats.runnable, stats.running, stats.completion_rate * stats.window) == (0, 0, 300)
    for store in stores:
        store.close()


# -- cheap at scale ------------------------------------------------------------------------

def _plans(store, call):
    """Run ``call`` and return (sql, query plan lines) for each statement it issued."""
    issued = []
    store.database.connection.set_trace_callback(issued.append)
    try:
        call()
    finally:
        store.database.connection.set_trace_callback(None)
    with sqlite3.connect(store.path) as conn:
        return [(sql, [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql)])
                for sql in dict.fromkeys(issued)  # trigger programs repeat their statement
                if re.match(r"\s*(SELECT|UPDATE|DELETE|INSERT)", sql, re.I)]


@pytest.mark.slow
def test_hot_paths_use_the_partial_indexes_with_a_large_backlog(tmp_path):
    store = open_backend(url_of(tmp_path / "queue.db", synchronous="normal"))
    batch = 50_000
    for start in range(0, 200_000, batch):
        store.enqueue([NewJob(task="t", priority=(start + i) % 3, delay=100 if i % 4 == 0 else 0,
                              tenant="acme" if i % 2 else None) for i in range(batch)], now=T0)
    running = store.claim(ClaimRequest("w1", ("default",), 2000), now=T0 + 1)
    store.settle("w1", [Outcome.ack(job.id) for job in running[:1000]], now=T0 + 2)
    store.settle("w1", [Outcome.dead(job.id, "x") for job in running[1000:1100]], now=T0 + 2)
    held = [job.id for job in running[1100:]]

    calls = {
        "stats": lambda: store.stats("default", now=T0 + 3),
        "claim": lambda: store.claim(ClaimRequest("w2", ("default", "other"), 50), now=T0 + 3),
        "settle_and_claim": lambda: store.settle_and_claim(
            "w1", [Outcome.ack(held[0]), Outcome.fail(held[1], "x"), Outcome.release(held[2])],
            ClaimRequest("w1", ("default",), 10), now=T0 + 4),
        "renew": lambda: store.renew("w1", held[3:20], 30, now=T0 + 4),
        "recover_expired": lambda: store.recover_expired(now=T0 + 5),
        "enqueue with a key": lambda: store.enqueue([NewJob(task="t", idempotency_key="k")], now=T0 + 5),
        # The 50,000 delayed jobs come due: this read promotes them.
        "stats promoting": lambda: store.stats("default", now=T0 + 101),
    }
    for name, call in calls.items():
        plans = _plans(store, call)
        assert plans, name
        for sql, plan in plans:
            # The retention sweep walks the per-second rate buckets: bounded by the retention
            # times the (queue, tenant) pairs, not by the backlog.
            walkable = ("rates",) if sql.startswith("DELETE FROM rates WHERE second <") else ()
            for line in plan:
                # A SCAN of a table is a walk of every row; SEARCH is an index range.
                scanned = re.match(r"SCAN (\w+)", line)
                assert not scanned or scanned[1] not in ("jobs", "counts", "rates") or \
                    scanned[1] in walkable, (name, sql, plan)
                assert "USE TEMP B-TREE" not in line, (name, sql, plan)
            if re.search(r"FROM jobs WHERE state = 'queued'|UPDATE jobs SET delayed", sql):
                assert any(re.search(r"jobs_(claim|age|due|waiting|coming)\b", line) for line in plan), (name, sql, plan)
    stats = store.stats("default", now=T0 + 101)
    assert (stats.runnable + stats.running, stats.delayed) == (200_001 - 1_001 - 100, 0)
    assert stats.dead == 100
    store.close()


def test_purge_removes_the_purged_jobs_executions_too(sqlite_backend):
    from flexiqd.queue.types import ClaimRequest, JobState, NewJob, Outcome

    ids = sqlite_backend.enqueue([NewJob(task="t"), NewJob(task="t")], now=100.0)
    sqlite_backend.claim(ClaimRequest("w", ("default",), 2), now=100.0)
    sqlite_backend.settle("w", [Outcome.ack(i) for i in ids], now=101.0)
    assert len(sqlite_backend.executions()) == 2
    assert sqlite_backend.purge(states=[JobState.DONE], finished_before=200.0) == 2
    assert sqlite_backend.executions() == []


def test_a_zero_stats_window_is_refused_clearly(sqlite_backend):
    from flexiqd.errors import QueueError

    with pytest.raises(QueueError, match="window must be more than 0s"):
        sqlite_backend.stats("default", now=1.0, window=0)


def test_lost_attempts_count_as_failures(sqlite_backend):
    from flexiqd.queue.types import ClaimRequest, NewJob

    sqlite_backend.enqueue([NewJob(task="t")], now=100.0)
    sqlite_backend.claim(ClaimRequest("w", ("default",), 1), now=100.0)
    sqlite_backend.recover_owner("w", now=101.0, reason="worker died")
    assert sqlite_backend.stats("default", now=102.0, window=60).failure_rate == pytest.approx(1 / 60)


def test_a_new_database_is_group_writable_under_a_umask_of_0007(tmp_path):
    import os
    import stat

    old = os.umask(0o007)
    try:
        backend = open_backend(url_of(tmp_path / "shared.db"))
        backend.enqueue([NewJob(task="t")], now=T0)
        backend.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "shared.db").st_mode) == 0o660


@pytest.mark.parametrize("setgid, expected", [(True, 0o664), (False, 0o644)])
def test_a_database_made_under_a_umask_of_0022_is_group_writable_in_a_set_group_id_folder(tmp_path, setgid,
                                                                                        expected):
    # A producer (umask 0022) may be the first to open the shared store in /var/lib/flexiq.
    import os
    import stat

    shared = tmp_path / "shared"
    shared.mkdir()
    if setgid:
        shared.chmod(0o2770)
    old = os.umask(0o022)
    try:
        backend = open_backend(url_of(shared / "queue.db"))
        backend.enqueue([NewJob(task="t")], now=T0)
        backend.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(shared / "queue.db").st_mode) == expected


# -- schema versions -----------------------------------------------------------------------

# The schema of version 1, as flexiqd 0.1.0 created it (git show a73bb31~1:flexiqd/queue/sqlite_schema.py).
V1_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    task TEXT NOT NULL,
    payload TEXT NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL,
    run_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    timeout REAL,
    idempotency_key TEXT,
    tenant TEXT NOT NULL DEFAULT '',
    lease_owner TEXT,
    lease_expires REAL,
    enqueued_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    result TEXT,
    error TEXT
);
CREATE INDEX IF NOT EXISTS jobs_claim ON jobs(queue, priority DESC, run_at, id)
    WHERE state = 'queued';
CREATE INDEX IF NOT EXISTS jobs_age ON jobs(queue, tenant, run_at)
    WHERE state = 'queued';
CREATE INDEX IF NOT EXISTS jobs_lease ON jobs(lease_expires)
    WHERE state = 'running';
CREATE INDEX IF NOT EXISTS jobs_finished ON jobs(queue, state, finished_at)
    WHERE finished_at IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS jobs_idempotency ON jobs(idempotency_key)
    WHERE idempotency_key IS NOT NULL AND state IN ('queued', 'running');

CREATE TABLE IF NOT EXISTS counts (
    queue TEXT NOT NULL,
    tenant TEXT NOT NULL,
    state TEXT NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (queue, tenant, state)
) WITHOUT ROWID;

CREATE TRIGGER IF NOT EXISTS jobs_count_insert AFTER INSERT ON jobs BEGIN
    INSERT INTO counts(queue, tenant, state, n) VALUES (NEW.queue, NEW.tenant, NEW.state, 1)
        ON CONFLICT(queue, tenant, state) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER IF NOT EXISTS jobs_count_update AFTER UPDATE OF state ON jobs
    WHEN OLD.state IS NOT NEW.state BEGIN
    UPDATE counts SET n = n - 1
        WHERE queue = OLD.queue AND tenant = OLD.tenant AND state = OLD.state;
    INSERT INTO counts(queue, tenant, state, n) VALUES (NEW.queue, NEW.tenant, NEW.state, 1)
        ON CONFLICT(queue, tenant, state) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER IF NOT EXISTS jobs_count_delete AFTER DELETE ON jobs BEGIN
    UPDATE counts SET n = n - 1
        WHERE queue = OLD.queue AND tenant = OLD.tenant AND state = OLD.state;
END;

-- Per-second buckets: a rate over a window is a sum of at most `window` rows.
CREATE TABLE IF NOT EXISTS rates (
    queue TEXT NOT NULL,
    tenant TEXT NOT NULL,
    second INTEGER NOT NULL,
    arrivals INTEGER NOT NULL DEFAULT 0,
    completions INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, tenant, second)
) WITHOUT ROWID;

-- Who ran what: one row per attempt that ended (settled, or lost with its worker).
CREATE TABLE IF NOT EXISTS executions (
    id INTEGER PRIMARY KEY,
    job_id INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    worker TEXT NOT NULL,
    started_at REAL,
    finished_at REAL NOT NULL,
    outcome TEXT NOT NULL,
    error TEXT
);
CREATE INDEX IF NOT EXISTS executions_job ON executions(job_id);
"""
V2_STATEMENT = "ALTER TABLE jobs ADD COLUMN lease_outcome TEXT"  # what version 2 added


def _old_store(path, version, now):
    """A store of ``version`` (1 or 2) holding a job in every state, made with that version's DDL."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(V1_SCHEMA)
    if version >= 2:
        conn.execute(V2_STATEMENT)
    # run_at relative to the wall clock: the migration tells due from delayed jobs by it.
    jobs = [dict(state="queued", run_at=now - 10, tenant="acme", priority=1),
            dict(state="queued", run_at=now + 3600, tenant="acme", idempotency_key="k1"),
            dict(state="running", attempts=1, lease_owner="w1", lease_expires=now + 30, started_at=now - 5),
            dict(state="done", attempts=1, tenant="acme", started_at=now - 3, finished_at=now - 2, result="7"),
            dict(state="dead", attempts=3, started_at=now - 4, finished_at=now - 4, error="boom"),
            dict(state="cancelled", finished_at=now - 1),
            dict(state="done", attempts=1, tenant="old", run_at=now - 9000, enqueued_at=now - 9000,
                 started_at=now - 9000, finished_at=now - 8999)]
    for n, job in enumerate(jobs):
        row = {"queue": "default", "task": "t", "payload": f'{{"n":{n}}}', "run_at": now - 20,
               "max_attempts": 3, "enqueued_at": now - 20, **job}
        conn.execute(f"INSERT INTO jobs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                     list(row.values()))
    conn.execute("INSERT INTO rates (queue, tenant, second, arrivals, completions, failures) "
                 "VALUES ('default', 'acme', ?, 3, 1, 0)", (int(now) - 5,))
    if version >= 2:
        conn.execute("UPDATE jobs SET lease_outcome = 'release' WHERE state = 'running'")
    conn.execute(f"PRAGMA user_version = {version}")
    conn.close()


def _jobs_as_stored(path):
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute("SELECT id, queue, task, payload, priority, state, run_at, attempts, "
                            "max_attempts, idempotency_key, tenant, lease_owner, lease_expires, "
                            "enqueued_at, started_at, finished_at, result, error "
                            "FROM jobs ORDER BY id").fetchall()


def _schema_shape(path):
    """Every table's columns and every other object's SQL, whitespace aside."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        shape = {}
        for kind, name, sql in conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name"):
            shape[name] = (kind, " ".join((sql or "").split()).replace('"', "") if kind != "table" else
                           conn.execute(f"PRAGMA table_xinfo({name})").fetchall(),
                           sql is not None and sql.rstrip().upper().endswith("WITHOUT ROWID"))
        return shape


@pytest.mark.parametrize("version", [1, 2])
def test_an_older_store_is_migrated_keeping_every_job_and_its_state(tmp_path, version):
    path = str(tmp_path / "queue.db")
    now = time.time()
    _old_store(path, version, now)
    before = _jobs_as_stored(path)
    store = SQLiteBackend(path, synchronous="normal")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert schema_state(conn) == (SCHEMA_LEVEL, SCHEMA_VERSION)
    assert _jobs_as_stored(path) == before
    fresh = tmp_path / "fresh.db"
    SQLiteBackend(str(fresh)).close()
    assert _schema_shape(path) == _schema_shape(fresh)

    stats = store.stats("default", now=now, window=60)
    assert (stats.runnable, stats.delayed, stats.running, stats.dead) == (1, 1, 1, 1)
    assert (stats.arrival_rate * 60, stats.completion_rate * 60) == (pytest.approx(3), pytest.approx(1))
    assert set(stats.tenants) == {"acme"}  # "old" has nothing left and no recent events
    # The store carries on: the due job is claimed, the delayed one is not, its key still holds.
    due, delayed, running = (row[0] for row in before[:3])
    assert store.enqueue([NewJob(task="t", idempotency_key="k1")], now=now) == [delayed]
    assert [job.id for job in store.claim(ClaimRequest("w2", ("default",), 10, 7200), now=now)] == [due]
    assert store.recover_owner("w1", now=now, reason="worker exited") == 1
    expected = ("release", 0) if version == 2 else ("lost", 1)  # v2's abandon mark is kept
    assert (store.executions(job_id=running)[0]["outcome"], store.get(running).attempts) == expected
    assert [job.id for job in store.claim(ClaimRequest("w2", ("default",), 10), now=now + 3601)] == [
        running, delayed]
    store.close()


def schema_state(conn: sqlite3.Connection) -> tuple[int, int]:
    """(the level older code reads, the newest step recorded)."""
    return (conn.execute("PRAGMA user_version").fetchone()[0],
            conn.execute("SELECT max(step) FROM schema_steps").fetchone()[0])


def test_a_new_store_is_made_at_the_current_version(tmp_path):
    SQLiteBackend(str(tmp_path / "queue.db")).close()
    with contextlib.closing(sqlite3.connect(tmp_path / "queue.db")) as conn:
        assert schema_state(conn) == (SCHEMA_LEVEL, SCHEMA_VERSION)


# -- counts stay small ---------------------------------------------------------------------

def _counts(store):
    with contextlib.closing(sqlite3.connect(store.path)) as conn:
        return sorted(conn.execute("SELECT queue, state, tenant, n FROM counts"))


def test_counts_rows_of_emptied_tenants_vanish(sqlite_backend):
    store = sqlite_backend
    ids = store.enqueue([NewJob(task="t", tenant=f"t{i}", delay=i * 10) for i in range(3)], now=T0)
    assert _counts(store) == [("default", "delayed", "t1", 1), ("default", "delayed", "t2", 1),
                              ("default", "queued", "t0", 1)]
    claimed = store.claim(ClaimRequest("w", ("default",), 3), now=T0 + 30)
    store.settle("w", [Outcome.ack(job.id) for job in claimed], now=T0 + 31)
    assert _counts(store) == [("default", "done", f"t{i}", 1) for i in range(3)]
    store.purge(states=[JobState.DONE], finished_before=T0 + 32)
    assert _counts(store) == []
    assert store.queues() == []
    assert all(job.state is JobState.DONE for job in store.list_jobs()) and len(ids) == 3


def test_stats_read_nothing_of_the_tenants_of_the_past(tmp_path):
    """stats() issues the same statements with or without 2,000 tenants whose jobs are done."""
    def issued_by_stats(path, past_tenants):
        store = SQLiteBackend(str(path), synchronous="normal")
        store.enqueue([NewJob(task="t", tenant=f"past{i}") for i in range(past_tenants)], now=T0)
        claimed = store.claim(ClaimRequest("w", ("default",), past_tenants), now=T0)
        store.settle("w", [Outcome.ack(job.id) for job in claimed], now=T0 + 1)
        store.enqueue([NewJob(task="t", tenant="live"), NewJob(task="t", tenant="live", delay=50)],
                      now=T0 + 9_000)
        issued = []
        store.database.connection.set_trace_callback(issued.append)
        stats = store.stats("default", now=T0 + 10_000)
        store.close()
        return issued, set(stats.tenants)

    alone = issued_by_stats(tmp_path / "alone.db", 0)
    assert alone[1] == {"live"}
    assert issued_by_stats(tmp_path / "past.db", 2000) == alone


def test_delayed_jobs_come_due_in_batches_earliest_first(sqlite_backend, monkeypatch):
    monkeypatch.setattr(lifecycle, "PROMOTION_BATCH", 3)
    store = sqlite_backend
    ids = store.enqueue([NewJob(task="t", run_at=T0 + 8 - i) for i in range(8)], now=T0)  # latest first
    [job] = store.claim(ClaimRequest("w", ("default",), 1), now=T0 + 100)
    assert job.id == ids[-1]  # one batch promoted: the three due first
    assert _counts(store) == [("default", "delayed", "", 5), ("default", "queued", "", 2),
                              ("default", "running", "", 1)]
    stats = store.stats("default", now=T0 + 100, window=200)  # promotes every batch left
    assert (stats.runnable, stats.delayed, stats.running, stats.arrival_rate * 200) == (7, 0, 1, 8)


# -- work coming due, running jobs' age, a worker's first claim -----------------------------

def test_coming_due_is_counted_up_to_its_bound_by_an_index_range(sqlite_backend, monkeypatch):
    monkeypatch.setattr(sqlite_sql, "COMING_DUE_LIMIT", 3)
    store = sqlite_backend
    store.enqueue([NewJob(task="t", run_at=T0 + 5) for _ in range(10)], now=T0)
    issued = []
    store.database.connection.set_trace_callback(issued.append)
    assert store.stats("default", now=T0, horizon=60).coming_due == 3
    [count] = [sql for sql in issued if "LIMIT 3)" in sql]
    plan = store.database.connection.execute("EXPLAIN QUERY PLAN " + count).fetchall()
    assert any("USING INDEX jobs_coming" in row[-1] for row in plan), plan
