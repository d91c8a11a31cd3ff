"""``flexiq backup``, ``move-store``, ``hosts`` and ``forget-host`` against real SQLite files,
real worker processes and the session's PostgreSQL server."""

from __future__ import annotations

import json
import os
import pathlib
import sqlite3
import stat
import subprocess
import sys
import time

import pytest

from flexiqd.errors import QueueError, StoreUnavailable
from flexiqd.queue import JobState, NewJob, open_backend
from flexiqd.queue.types import ClaimRequest, Outcome

from pg_server import DATABASE, PASSWORD, PASSWORD_ROLE

from .conftest import APPS, REPO, read_marks, wait_for

JOBS = 600


def flexiq(url: str, *argv: str, expect: int = 0) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "flexiqd.cli.flexiq", "--url", url, *argv],
                          capture_output=True, text=True, cwd=str(REPO), timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == expect, (done.stdout, done.stderr)
    if expect:
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done


def sqlite_states(path: pathlib.Path) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return dict(conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state"))
    finally:
        conn.close()


# -- backup ------------------------------------------------------------------------------------

def test_a_backup_taken_while_workers_claim_and_complete_is_consistent(store, app, workers, tmp_path):
    ids = [app.enqueue("count", [0.05]) for _ in range(JOBS)]
    path = pathlib.Path(store[len("sqlite:///"):])
    for _ in range(2):
        workers.start(concurrency=4)
    wait_for(lambda: sqlite_states(path).get("done", 0) >= 20, 60, "the workers to complete 20 jobs")
    copies = []
    for n in range(3):
        copy = tmp_path / f"backup-{n}.db"
        out = flexiq(store, "backup", str(copy)).stdout
        assert f"to {copy}" in out and "integrity check ok" in out
        copies.append(copy)
    live = sqlite_states(path)
    # The backups were taken while work was still in flight.
    assert live.get("queued", 0) + live.get("running", 0) > 0, live
    wait_for(lambda: sqlite_states(path).get("done", 0) == JOBS, 120, f"all {JOBS} jobs done")

    done_seen = []
    for copy in copies:
        assert stat.S_IMODE(copy.stat().st_mode) == 0o600
        assert not pathlib.Path(f"{copy}-wal").exists()  # one self-contained file
        conn = sqlite3.connect(f"file:{copy}?mode=ro", uri=True)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            rows = conn.execute("SELECT id, state FROM jobs").fetchall()
            # Every job enqueued before the backup is in it, exactly once, in one state.
            assert sorted(job_id for job_id, _ in rows) == sorted(ids)
            states = dict(conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state"))
            assert set(states) <= {"queued", "running", "done"} and sum(states.values()) == JOBS
            # The counts the triggers keep agree with the rows: one commit's snapshot, not a torn one.
            counted = dict(conn.execute("SELECT state, SUM(n) FROM counts GROUP BY state"))
            assert counted == states
            # Each job done in the copy has its attempt recorded in the copy, and only those.
            finished = {row[0] for row in conn.execute("SELECT job_id FROM executions WHERE outcome = 'ack'")}
            assert finished == {job_id for job_id, state in rows if state == "done"}
            done_seen.append(states.get("done", 0))
        finally:
            conn.close()
    assert 20 <= done_seen[0] <= done_seen[1] <= done_seen[2] < JOBS
    starts, _ = read_marks(workers.marks)
    assert sorted(starts) == sorted(ids) and set(starts.values()) == {1}  # the backups disturbed no job

    # A copy is a store: flexiq reads it as it reads the original.
    restored = tmp_path / "restored.db"
    restored.write_bytes(copies[-1].read_bytes())
    listed = json.loads(flexiq(f"sqlite:///{restored}", "jobs", "list", "--limit", str(JOBS), "--json").stdout)
    assert len(listed) == JOBS


def test_backup_refuses_to_overwrite_a_file_unless_forced(store, app, tmp_path):
    app.enqueue("count", [0])
    dest = tmp_path / "exists.db"
    dest.write_text("keep me")
    err = flexiq(store, "backup", str(dest), expect=1).stderr
    assert f"{dest} exists" in err and "--force" in err
    assert dest.read_text() == "keep me"
    flexiq(store, "backup", str(dest), "--force")
    assert sqlite_states(dest) == {"queued": 1}
    assert not list(tmp_path.glob(".flexiq-backup-*"))  # no partial file left behind
    own = store[len("sqlite:///"):]
    assert "is the store itself" in flexiq(store, "backup", own, "--force", expect=1).stderr


def test_backup_of_a_postgresql_store_points_to_pg_dump(pg_url, tmp_path):
    err = flexiq(pg_url, "backup", str(tmp_path / "x.db"), expect=1).stderr
    assert "pg_dump" in err and not (tmp_path / "x.db").exists()


# -- move to PostgreSQL --------------------------------------------------------------------------

def _claim(backend, owner: str, now: float, lease: float = 30.0):
    return backend.claim(ClaimRequest(owner=owner, queues=("default",), limit=1, lease_seconds=lease), now=now)


def _filled_sqlite(path: pathlib.Path, now: float) -> dict[str, int]:
    """A store with one job of each kind a move carries; their ids by kind."""
    backend = open_backend(f"sqlite:///{path}")
    try:
        ids = {}
        ids["done"], = backend.enqueue([NewJob(task="t.done", payload={"args": [1], "kwargs": {}})], now=now - 60)
        [job] = _claim(backend, "gone:default-1:1", now - 59)
        backend.settle("gone:default-1:1", [Outcome.ack(job.id, {"answer": 42})], now=now - 58)
        ids["dead"], = backend.enqueue([NewJob(task="t.dead", payload={"args": [], "kwargs": {}},
                                               max_attempts=1)], now=now - 50)
        [job] = _claim(backend, "gone:default-1:1", now - 49)
        backend.settle("gone:default-1:1", [Outcome.fail(job.id, "Traceback: it broke")], now=now - 48)
        ids["queued"], = backend.enqueue([NewJob(
            task="mail.send", payload={"args": ["a@example.com"], "kwargs": {"urgent": True}}, queue="mail",
            priority=7, max_attempts=5, timeout=12.5, idempotency_key="welcome-1", tenant="acme")], now=now - 40)
        ids["delayed"], = backend.enqueue([NewJob(task="report", payload={"args": [], "kwargs": {}},
                                                  run_at=now + 3600, tenant="globex")], now=now - 30)
        backend.pause_schedule("nightly", True, now=now - 20)
        ids["scheduled"] = backend.run_schedule("hourly", NewJob(task="tick", payload={"args": [], "kwargs": {}}),
                                                host="old", now=now - 10)
        # A daemon that stopped long ago: registered, dead.
        backend.heartbeat("old", now=now - 600, interval=2.0, report={"pools": {"default": {}}})
        return ids
    finally:
        backend.close()


def _password_url(pg_server) -> str:
    schema = pg_server.fresh_schema()
    pg_server.admin(f"GRANT ALL ON SCHEMA {schema} TO {PASSWORD_ROLE}", database=DATABASE)
    return pg_server.url(user=f"{PASSWORD_ROLE}:{PASSWORD}", schema=schema)


def test_move_store_carries_the_jobs_and_schedules_and_leaves_the_old_file_read_only(pg_server, tmp_path):
    now = time.time()
    path = tmp_path / "queue.db"
    ids = _filled_sqlite(path, now)
    old = open_backend(f"sqlite:///{path}")
    before = {job_id: old.get(job_id) for job_id in ids.values()}
    before_executions = old.executions()
    producer = open_backend(f"sqlite:///{path}")  # a producer that holds the file open across the move
    old.close()
    target = _password_url(pg_server)

    out = flexiq(f"sqlite:///{path}", "move-store", "--to", target).stdout
    assert PASSWORD not in out
    assert "5 jobs" in out and "/etc/flexiqd/flexiqd.yaml" in out and "store:" in out

    moved = open_backend(target)
    try:
        for job_id, job in before.items():
            assert moved.get(job_id) == job  # every field: args, priority, attempts, run_at, errors, tenant...
        assert moved.executions() == before_executions
        assert moved.get(ids["delayed"]).run_at == pytest.approx(now + 3600)
        records = moved.schedule_records(["nightly", "hourly"])
        assert records["nightly"].paused and not records["hourly"].paused
        assert [row.job_id for row in moved.schedule_ledger("hourly")] == [ids["scheduled"]]
        assert moved.hosts(now=now) == []  # each daemon registers its own host
        # The idempotency key still holds, and new ids follow the carried ones.
        again = moved.enqueue([NewJob(task="mail.send", idempotency_key="welcome-1")], now=now)
        assert again == [ids["queued"]]
        [new] = moved.enqueue([NewJob(task="fresh")], now=now)
        assert new > max(ids.values())
        mail = moved.stats("mail", now=now)
        assert mail.runnable == 1
    finally:
        moved.close()

    assert stat.S_IMODE(path.stat().st_mode) & 0o222 == 0
    with pytest.raises(StoreUnavailable, match="was moved to postgresql://"):
        open_backend(f"sqlite:///{path}")
    with pytest.raises(QueueError, match="was moved to"):
        producer.enqueue([NewJob(task="late")], now=now)
    producer.close()
    err = flexiq(f"sqlite:///{path}", "stats", expect=1).stderr
    assert "was moved to" in err and PASSWORD not in err
    # A worker started on the old file refuses to run, naming the new store.
    worker = subprocess.run([sys.executable, "-m", "flexiqd.cli.flexiq", "--url", f"sqlite:///{path}", "worker",
                             "--app", "counting_app:queue"], capture_output=True, text=True, timeout=60,
                            cwd=str(REPO), env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(APPS), str(REPO)])))
    assert worker.returncode != 0 and "was moved to postgresql://" in worker.stderr
    assert PASSWORD not in worker.stderr
    # So does the daemon, and --check-config says why before it is started.
    config = tmp_path / "flexiqd.yaml"
    config.write_text(f"store: sqlite:///{path}\nfleet: process\npools: {{}}\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("NOTIFY_SOCKET", None)
    for argv in (["--check-config", str(config)], ["--config", str(config)]):
        daemon = subprocess.run([sys.executable, "-m", "flexiqd.cli.daemon", *argv], capture_output=True,
                                text=True, timeout=60, cwd=str(tmp_path), env=env)
        assert daemon.returncode != 0 and "was moved to postgresql://" in daemon.stderr, (argv, daemon.stderr)
        assert PASSWORD not in daemon.stderr + daemon.stdout
    # Moving it again is refused, and changes nothing.
    assert "was moved to" in flexiq(f"sqlite:///{path}", "move-store", "--to", target, expect=1).stderr


def test_move_store_without_history_leaves_finished_jobs_behind(pg_url, tmp_path):
    now = time.time()
    path = tmp_path / "queue.db"
    ids = _filled_sqlite(path, now)
    out = flexiq(f"sqlite:///{path}", "move-store", "--to", pg_url, "--without-history").stdout
    assert "left behind: 1 finished jobs" in out
    moved = open_backend(pg_url)
    try:
        assert {job.id for job in moved.list_jobs(limit=100)} == {ids["dead"], ids["queued"], ids["delayed"],
                                                                ids["scheduled"]}
        assert all(row["job_id"] == ids["dead"] for row in moved.executions())
    finally:
        moved.close()


def test_move_store_refuses_while_a_daemon_beats_or_a_job_runs(pg_url, tmp_path):
    now = time.time()
    path = tmp_path / "queue.db"
    url = f"sqlite:///{path}"
    backend = open_backend(url)
    try:
        backend.enqueue([NewJob(task="t") for _ in range(3)], now=now)
        backend.heartbeat("web1", now=time.time(), interval=30.0)
        err = flexiq(url, "move-store", "--to", pg_url, expect=1).stderr
        assert "daemon on host web1 is running" in err and "systemctl stop flexiqd" in err
        backend.retire_host("web1", now=time.time())
        # A job held by a live worker (this test process) with an unexpired lease.
        [job] = _claim(backend, f"{os.uname().nodename}:default-1:{os.getpid()}", time.time(), lease=300)
        err = flexiq(url, "move-store", "--to", pg_url, expect=1).stderr
        assert "1 job is running" in err and "drain" in err
    finally:
        backend.close()
    assert stat.S_IMODE(path.stat().st_mode) & 0o200  # untouched
    assert sqlite_states(path) == {"queued": 2, "running": 1}
    target = open_backend(pg_url)
    try:
        assert target.list_jobs(limit=10) == []
    finally:
        target.close()


def test_move_store_into_a_store_that_holds_jobs_is_refused(pg_url, tmp_path):
    path = tmp_path / "queue.db"
    url = f"sqlite:///{path}"
    flexiq(url, "enqueue", "t", "--count", "2")
    flexiq(pg_url, "enqueue", "other")
    err = flexiq(url, "move-store", "--to", pg_url, expect=1).stderr
    assert "holds 1 job already" in err
    assert sqlite_states(path) == {"queued": 2}
    assert len(json.loads(flexiq(pg_url, "jobs", "list", "--json").stdout)) == 1
    flexiq(url, "enqueue", "t")  # the old file is still in service


def test_a_move_that_fails_half_way_writes_nothing_and_can_be_run_again(pg_server, tmp_path):
    now = time.time()
    path = tmp_path / "queue.db"
    ids = _filled_sqlite(path, now)
    schema = pg_server.fresh_schema()
    target = pg_server.socket_url(schema=schema)
    open_backend(target).close()  # the schema, so the fault can be planted in it
    # The fault: the ledger's rows, written after the jobs in the move's transaction, fail.
    pg_server.admin(f"""CREATE FUNCTION {schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'injected failure'; END $$""", database=DATABASE)
    pg_server.admin(f"CREATE TRIGGER refuse BEFORE INSERT ON {schema}.flexiq_schedule_slots "
                    f"FOR EACH ROW EXECUTE FUNCTION {schema}.refuse()", database=DATABASE)
    err = flexiq(f"sqlite:///{path}", "move-store", "--to", target, expect=1).stderr
    assert "rolled back" in err and "injected failure" in err
    assert pg_server.admin(f"SELECT (SELECT count(*) FROM {schema}.flexiq_jobs), "
                           f"(SELECT count(*) FROM {schema}.flexiq_executions), "
                           f"(SELECT count(*) FROM {schema}.flexiq_schedules)", database=DATABASE) == [(0, 0, 0)]
    assert stat.S_IMODE(path.stat().st_mode) & 0o200 and sqlite_states(path)  # the file untouched, in service
    pg_server.admin(f"DROP TRIGGER refuse ON {schema}.flexiq_schedule_slots", database=DATABASE)
    flexiq(f"sqlite:///{path}", "move-store", "--to", target)
    moved = open_backend(target)
    try:
        assert {job.id for job in moved.list_jobs(limit=10)} == set(ids.values())
    finally:
        moved.close()


# -- hosts -----------------------------------------------------------------------------------------

@pytest.fixture(params=["sqlite", "postgresql"])
def any_store(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'queue.db'}"
    return request.getfixturevalue("pg_server").fresh_url()


def test_hosts_are_listed_and_a_dead_one_is_forgotten_with_its_jobs_handed_back(any_store):
    now = time.time()
    backend = open_backend(any_store)
    try:
        backend.enqueue([NewJob(task="t") for _ in range(2)], now=now - 120)
        [held] = _claim(backend, "web9:default-1:4242", now - 100, lease=4.0)  # its lease long expired
        backend.heartbeat("web9", now=now - 100, interval=2.0, report={"pools": {"default": {}}})
        backend.heartbeat("web1", now=time.time(), interval=30.0, report={"pools": {"mail": {}}})
    finally:
        backend.close()

    listed = {row["name"]: row for row in json.loads(flexiq(any_store, "hosts", "--json").stdout)}
    assert (listed["web9"]["alive"], listed["web9"]["running"], listed["web9"]["pools"]) == (False, 1, ["default"])
    assert (listed["web1"]["alive"], listed["web1"]["running"]) == (True, 0)
    table = flexiq(any_store, "hosts").stdout
    assert "web9" in table and "dead" in table and "alive" in table

    err = flexiq(any_store, "forget-host", "web1", expect=1).stderr
    assert "host web1 is alive" in err and "--force" in err
    assert "no host named 'web7'" in flexiq(any_store, "forget-host", "web7", expect=1).stderr

    out = flexiq(any_store, "forget-host", "web9").stdout
    assert "forgot host web9: 1 running jobs handed back" in out
    backend = open_backend(any_store)
    try:
        job = backend.get(held.id)
        assert (job.state, job.attempts) == (JobState.QUEUED, 0)  # released: no attempt used
        assert [host.name for host in backend.hosts(now=time.time())] == ["web1"]
    finally:
        backend.close()
    flexiq(any_store, "forget-host", "web1", "--force")
    assert json.loads(flexiq(any_store, "hosts", "--json").stdout) == []


def test_ids_the_target_handed_out_before_are_never_handed_out_again(pg_url, tmp_path):
    import psycopg

    flexiq(pg_url, "enqueue", "earlier", "--count", "5")  # ids 1..5, then gone
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DELETE FROM flexiq_jobs")
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    flexiq(url, "enqueue", "t", "--count", "2")  # ids 1..2
    flexiq(url, "move-store", "--to", pg_url)
    assert flexiq(pg_url, "enqueue", "after").stdout.strip() == "6"
