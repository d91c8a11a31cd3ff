"""``flexiq`` commands and worker processes on a PostgreSQL store (the session's own server).

The ``store`` fixture of this folder's conftest is replaced by a fresh PostgreSQL schema,
so the ``app`` and ``workers`` fixtures run on PostgreSQL here.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

import pytest

from flexiqd import Queue
from flexiqd.queue import JobState, NewJob, open_backend
from flexiqd.queue.postgres.schema import SCHEMA_VERSION
from flexiqd.worker.runtime import Worker, WorkerConfig

from .conftest import REPO, read_marks, wait_for


@pytest.fixture
def store(pg_server) -> str:
    return pg_server.fresh_url()


def flexiq(url: str, *argv: str) -> str:
    done = subprocess.run([sys.executable, "-m", "flexiqd.cli.flexiq", "--url", url, *argv],
                          capture_output=True, text=True, cwd=str(REPO), timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_enqueue_stats_and_jobs_commands(store):
    assert flexiq(store, "enqueue", "count", "--queue", "mail", "--count", "3").startswith("enqueued 3 jobs")
    [job_id] = [int(flexiq(store, "enqueue", "count", "0.5", "--queue", "mail", "--tenant", "acme"))]
    stats = json.loads(flexiq(store, "stats", "--json"))
    assert (stats["mail"]["runnable"], stats["mail"]["tenants"]["acme"]["runnable"]) == (4, 1)
    listed = json.loads(flexiq(store, "jobs", "list", "--queue", "mail", "--json"))
    assert [job["id"] for job in listed][0] == job_id and len(listed) == 4
    shown = json.loads(flexiq(store, "jobs", "show", str(job_id), "--json"))
    assert (shown["payload"], shown["tenant"], shown["state"]) == ({"args": [0.5], "kwargs": {}},
                                                                   "acme", "queued")
    assert flexiq(store, "jobs", "cancel", str(job_id)).strip() == f"cancelled job {job_id}"
    assert json.loads(flexiq(store, "stats", "--json", "--queue", "mail"))["mail"]["runnable"] == 3


def test_a_store_error_is_one_line_without_a_traceback(pg_server):
    done = subprocess.run([sys.executable, "-m", "flexiqd.cli.flexiq", "--url",
                           pg_server.url("nosuchdb"), "stats"],
                          capture_output=True, text=True, cwd=str(REPO), timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 1
    assert 'database "nosuchdb" does not exist' in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_workers_run_each_job_once_and_dead_letters_are_listed_retried_and_purged(store, app, workers):
    ids = [app.enqueue("count", [0.01]) for _ in range(40)]
    flexiq(store, "enqueue", "no.such.task", "--count", "2", "--max-attempts", "1")
    for _ in range(2):
        workers.start(concurrency=4)
    wait_for(lambda: all(app.get(job_id).state is JobState.DONE for job_id in ids), 60, "40 jobs done")
    wait_for(lambda: len(json.loads(flexiq(store, "dead-letter", "list", "--json"))) == 2, 60,
             "2 dead letters")
    for proc in workers.procs:
        proc.terminate()
    for proc in workers.procs:
        assert proc.wait(timeout=30) == 0
    starts, ends = read_marks(workers.marks)
    assert sorted(starts) == sorted(ids) and set(starts.values()) == {1} and starts == ends
    dead = json.loads(flexiq(store, "dead-letter", "list", "--json"))
    assert {job["task"] for job in dead} == {"no.such.task"}
    assert flexiq(store, "dead-letter", "retry", str(dead[0]["id"])).strip() == "1 dead jobs queued again"
    assert flexiq(store, "dead-letter", "purge").strip() == "1 dead jobs purged"
    stats = json.loads(flexiq(store, "stats", "--json", "--queue", "default"))["default"]
    assert (stats["runnable"], stats["dead"]) == (1, 0)


def test_an_idle_worker_is_woken_by_an_enqueue_not_by_its_poll(store, app, tmp_path):
    """The worker polls once an hour here: only the NOTIFY of the enqueue can wake it."""
    os.environ["FLEXIQ_TEST_MARKS"] = str(tmp_path)
    backend = open_backend(store)
    worker = Worker(app, backend, WorkerConfig(concurrency=1, idle_poll_min=3600, idle_poll_max=3600))
    producer = Queue(store)
    job_ids: list[int] = []

    async def main() -> None:
        runner = asyncio.create_task(worker.run())
        # Idle first: its first claims found nothing and it sleeps until woken.
        await asyncio.sleep(1.0)
        deadline = time.monotonic() + 30
        while not job_ids or app.get(job_ids[-1]).state is not JobState.DONE:
            assert time.monotonic() < deadline, "the enqueue did not wake the idle worker"
            assert not runner.done()
            if not job_ids:
                job_ids.append(producer.backend.enqueue([NewJob(task="count")], now=time.time())[0])
            await asyncio.sleep(0.05)
        worker.request_stop()
        assert await runner == 0

    try:
        asyncio.run(main())
    finally:
        os.environ.pop("FLEXIQ_TEST_MARKS", None)
        producer.close()
        backend.close()
    assert worker.counters.done == 1
    assert [t for t in threading.enumerate() if t.name == "flexiq-listen"] == []


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def check_config(tmp_path: pathlib.Path, store: str) -> subprocess.CompletedProcess:
    config = tmp_path / "flexiqd.yaml"
    config.write_text(f"store: '{store}'\nfleet: process\n")
    return subprocess.run([sys.executable, "-m", "flexiqd.cli.daemon", "--check-config", str(config)],
                          capture_output=True, text=True, cwd=str(REPO), timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))


def test_check_config_connects_to_the_database_and_changes_nothing(pg_server, store, tmp_path):
    done = check_config(tmp_path, store)
    assert done.returncode == 0, done.stderr
    assert "PostgreSQL 15" in done.stdout and "schema not created yet" in done.stdout
    open_backend(store).close()
    assert f"schema version {SCHEMA_VERSION}" in check_config(tmp_path, store).stdout


@pytest.mark.parametrize("case, expected", [
    ("missing-database", 'database "nosuchdb" does not exist'),
    ("auth-failed", "password authentication failed"),
    ("unreachable", "Connection refused"),
    ("bad-option", "listen must be on or off"),
])
def test_check_config_says_in_one_line_why_the_database_cannot_be_used(pg_server, tmp_path, case, expected):
    secret = tmp_path / "wrong.password"
    secret.write_text("wrong")
    store = {"missing-database": pg_server.url("nosuchdb"),
             "auth-failed": pg_server.url(user="flexiq_pw", password_file=str(secret)),
             "unreachable": f"postgresql://flexiq@127.0.0.1:{closed_port()}/flexiq",
             "bad-option": pg_server.url(listen="sometimes")}[case]
    done = check_config(tmp_path, store)
    assert done.returncode == 1
    assert expected in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("flexiqd: ")


def test_without_url_the_commands_use_the_configs_postgresql_store_and_hide_its_password(pg_server, tmp_path):
    from pg_server import PASSWORD, PASSWORD_ROLE
    from urllib.parse import quote

    schema = pg_server.fresh_schema()
    pg_server.admin(f"ALTER SCHEMA {schema} OWNER TO {PASSWORD_ROLE}", database="flexiq")
    options = quote(f"-csearch_path={schema}", safe="")
    url = f"postgresql://{PASSWORD_ROLE}:{PASSWORD}@127.0.0.1:{pg_server.port}/flexiq?options={options}"
    config = tmp_path / "flexiqd.yaml"
    config.write_text(f"store: {url}\npools:\n  default:\n    app: counting_app:queue\n")
    env = {key: value for key, value in os.environ.items() if key != "FLEXIQ_URL"}
    env.update(PYTHONPATH=str(REPO), FLEXIQD_CONFIG=str(config))

    def run(*argv: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "flexiqd.cli.flexiq", *argv], capture_output=True,
                              text=True, cwd=str(REPO), timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        assert PASSWORD not in done.stdout + done.stderr
        # First: the schema's creation, at the first command, is logged after it.
        assert done.stderr.splitlines()[0] == (f"flexiq: using the store postgresql://{PASSWORD_ROLE}:***@127.0.0.1:"
                                       f"{pg_server.port}/flexiq?options={options} (from {config})")
        return done

    job_id = int(run("enqueue", "count", "0.1", "--queue", "moved").stdout)
    backend = open_backend(url)
    try:
        assert backend.get(job_id).queue == "moved"  # in PostgreSQL, not in a SQLite file
    finally:
        backend.close()
    assert json.loads(run("stats", "--json").stdout)["moved"]["runnable"] == 1
    assert [job["id"] for job in json.loads(run("jobs", "list", "--json").stdout)] == [job_id]
    assert json.loads(run("dead-letter", "list", "--json").stdout) == []
