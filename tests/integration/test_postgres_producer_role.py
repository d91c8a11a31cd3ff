"""A PostgreSQL role with the grants ``flexiq producer-grants`` prints enqueues, and does nothing else.

docs/security.md promises that a producer (a web application) may add jobs without being
able to claim, settle, cancel or delete them, or read their arguments and results.  Here
a real role gets exactly the printed grants on a store the owner created, and tries.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from urllib.parse import quote

import pytest

from flexiqd import Queue
from flexiqd.errors import FlexiqdError
from flexiqd.queue import ClaimRequest, JobState, NewJob, open_backend
from flexiqd.queue.declarations import TaskDeclaration

from .conftest import REPO


def flexiq(*argv: str, url: str | None = None) -> subprocess.CompletedProcess:
    prefix = ["--url", url] if url else []
    return subprocess.run([sys.executable, "-m", "flexiqd.cli.flexiq", *prefix, *argv], capture_output=True,
                          text=True, cwd=str(REPO), timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))


@pytest.fixture
def store(pg_server):
    """(the owner's URL, the producer's URL, the producer role, the schema) of a fresh store."""
    schema = pg_server.fresh_schema()
    owner_url = pg_server.socket_url(schema=schema)
    open_backend(owner_url).close()  # the owner (as the daemon would) creates the tables
    role = f"producer_{schema}"
    pg_server.admin(f"CREATE ROLE {role} LOGIN")
    printed = flexiq("producer-grants", role, "--schema", schema)
    assert printed.returncode == 0, printed.stderr
    statements = [line for line in printed.stdout.splitlines() if line and not line.startswith("--")]
    assert statements and all(line.startswith("GRANT ") for line in statements), printed.stdout
    for statement in statements:
        pg_server.admin(statement, database="flexiq")
    options = quote(f"-csearch_path={schema}", safe="")
    producer_url = (f"postgresql://{role}@/flexiq?host={quote(str(pg_server.directory), safe='')}"
                    f"&port={pg_server.port}&options={options}")
    yield owner_url, producer_url, role, schema
    pg_server.admin(f"DROP OWNED BY {role}", database="flexiq")
    pg_server.admin(f"DROP ROLE {role}")


def as_producer(pg_server, store, sql: str):
    import psycopg

    _, _, role, schema = store
    with psycopg.connect(host=str(pg_server.directory), port=pg_server.port, user=role, dbname="flexiq",
                         options=f"-csearch_path={schema}", autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def test_the_producer_enqueues_through_the_api_and_the_cli(store):
    owner_url, producer_url, _, _ = store
    queue = Queue(producer_url)
    try:
        @queue.task(queue="mail")
        def send(address):  # registered only to enqueue
            raise AssertionError("never run here")

        first = send.enqueue("a@example.com")
        keyed = send.schedule(("b@example.com",), idempotency_key="welcome-b")
        again = send.schedule(("b@example.com",), idempotency_key="welcome-b")
        delayed = send.schedule(("c@example.com",), delay=3600)
    finally:
        queue.close()
    assert again == keyed  # the key's holder found with the columns the producer may read
    done = flexiq("enqueue", "mail.digest", "--queue", "mail", "--count", "2", url=producer_url)
    assert done.returncode == 0 and done.stdout.startswith("enqueued 2 jobs"), done.stderr

    owner = open_backend(owner_url)
    try:
        jobs = owner.list_jobs(queue="mail", limit=100)
        assert sorted(job.id for job in jobs if job.task.endswith("send")) == sorted([first, keyed, delayed])
        assert [job.payload["args"] for job in jobs if job.id == keyed] == [["b@example.com"]]
        assert len([job for job in jobs if job.task == "mail.digest"]) == 2
        stats = owner.stats("mail", now=time.time(), window=60)
        assert (stats.runnable, stats.delayed) == (4, 1)
        # What a producer enqueued is claimable by the owner (the workers).
        claimed = owner.claim(ClaimRequest("w1", ("mail",), 10), now=time.time())
        assert len(claimed) == 4
    finally:
        owner.close()


def test_the_producer_enqueues_with_the_sql_function_in_its_own_transaction(pg_server, store):
    owner_url, _, _, _ = store
    owner = open_backend(owner_url)
    try:
        owner.declare_tasks([TaskDeclaration("mail.send", queue="mail", priority=5, max_attempts=7, timeout=30.0)],
                            by="test", now=time.time())
    finally:
        owner.close()
    [(job_id,)] = as_producer(pg_server, store, "SELECT flexiq_enqueue('mail.send', '[\"a@example.com\"]')")
    owner = open_backend(owner_url)
    try:
        job = owner.get(job_id)
        assert (job.queue, job.priority, job.max_attempts, job.payload["args"]) == ("mail", 5, 7, ["a@example.com"])
    finally:
        owner.close()


def test_the_producer_cannot_claim_cancel_purge_or_read_jobs(pg_server, store):
    owner_url, producer_url, _, _ = store
    owner = open_backend(owner_url)
    try:
        [job_id] = owner.enqueue([NewJob(task="secret.task", payload={"args": ["card 4111"], "kwargs": {}})],
                                 now=time.time())
    finally:
        owner.close()
    producer = open_backend(producer_url)
    now = time.time()
    try:
        attempts = {
            "claim": lambda: producer.claim(ClaimRequest("intruder", ("default",), 1), now=now),
            "cancel": lambda: producer.cancel(job_id, now=now),
            "get": lambda: producer.get(job_id),
            "list": lambda: producer.list_jobs(),
            "purge": lambda: producer.purge(states=[JobState.DEAD, JobState.DONE], finished_before=now + 1),
            "retry dead": lambda: producer.retry_dead(now=now),
        }
        for name, attempt in attempts.items():
            with pytest.raises(FlexiqdError, match="permission denied"):
                attempt()
    finally:
        producer.close()
    import psycopg

    for sql in ("SELECT payload FROM flexiq_jobs", "SELECT result, error FROM flexiq_jobs",
                "UPDATE flexiq_jobs SET state = 'running'", "DELETE FROM flexiq_jobs",
                "SELECT * FROM flexiq_executions", "SELECT * FROM flexiq_counts",
                "TRUNCATE flexiq_rate_changes"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            as_producer(pg_server, store, sql)
    owner = open_backend(owner_url)
    try:
        job = owner.get(job_id)
        assert (job.state, job.payload["args"]) == (JobState.QUEUED, ["card 4111"])
    finally:
        owner.close()


def test_the_grants_refuse_names_that_would_need_quoting():
    done = flexiq("producer-grants", "web; DROP TABLE flexiq_jobs")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("flexiq: role 'web; DROP TABLE flexiq_jobs' is not a plain PostgreSQL name")
