"""Producers without the workers' code, on PostgreSQL under a real systemd: jobs enqueued in
the application's own transaction run exactly when it commits, and jobs enqueued by name
take the queue, priority and attempts their task declares, as the pool's workers wrote them
to the store when they started.  Executions are counted by the task's own marks."""

from __future__ import annotations

import json

import pytest

from .flexiqd_install import BIN, CONFIG, DAEMON, MARKS, REPO, STORE, install, marks, workers
from .sandbox import Sandbox
from .sandbox_postgres import DATABASE, PASSWORD, start_postgres

SECRET = "/etc/flexiqd/db.password"
STORE_URL = f"postgresql://flexiq@127.0.0.1:5432/{DATABASE}?password_credential=flexiq-db"
CLI_URL = f"postgresql://flexiq@127.0.0.1:5432/{DATABASE}?password_file={SECRET}"
POOL = f"""
  orders:
    app: orders_app:queue
    queues: [orders]
    concurrency: 2
    min_workers: 1
    max_workers: 2
    environment:
      PYTHONPATH: {REPO / "tests" / "apps"}
      FLEXIQ_TEST_MARKS: {MARKS}
    credentials: {{flexiq-db: {SECRET}}}
"""

# The web application: its own table, its own transactions, no import of the workers' code.
APPLICATION = f"""
import json
import psycopg
from flexiqd import Queue

url = {CLI_URL!r}
queue = Queue(url)
ids = {{}}
with psycopg.connect("host=127.0.0.1 dbname={DATABASE} user=flexiq password={PASSWORD}") as conn:
    conn.execute("CREATE TABLE IF NOT EXISTS orders (id integer PRIMARY KEY)")
    conn.commit()
    for order, commit in ((1, False), (2, True), (3, False), (4, True)):
        with conn.transaction(force_rollback=not commit):
            conn.execute("INSERT INTO orders VALUES (%s)", (order,))
            ids[order] = queue.enqueue("orders.confirm", [order], connection=conn)
print(json.dumps(ids))
"""


def flexiq(sbx: Sandbox, *args: str):
    return sbx.run([str(BIN / "flexiq"), "--url", CLI_URL, *args])


def jobs(sbx: Sandbox, state: str) -> list[dict]:
    return json.loads(flexiq(sbx, "jobs", "list", "--state", state, "--json").stdout)


@pytest.fixture
def orders_pool(sandbox: Sandbox) -> Sandbox:
    start_postgres(sandbox)
    sandbox.write_file(SECRET, PASSWORD + "\n", mode=0o600)
    config = CONFIG.replace(f"store: {STORE}", f"store: '{STORE_URL}'").replace(
        "    min_workers: 1\n", "    min_workers: 0\n", 1) + POOL
    install(sandbox, config, daemon_dropin=f"[Service]\nLoadCredential=flexiq-db:{SECRET}\n")
    sandbox.wait_for(lambda: any("orders" in unit for unit in workers(sandbox)), 30, what="the orders worker")
    yield sandbox
    sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*' 2>/dev/null; true")


def test_jobs_run_exactly_when_the_applications_transaction_commits_in_the_declared_queue(orders_pool):
    sbx = orders_pool
    # The worker published its task's declaration when it started.
    sbx.wait_for(lambda: "orders.confirm" in psql_out(sbx, "SELECT task FROM flexiq_task_declarations"), 30,
                 what="the orders worker's declaration")
    produced = sbx.run([str(BIN / "python"), "-c", APPLICATION]).stdout
    ids = {int(order): job_id for order, job_id in json.loads(produced).items()}
    assert set(ids) == {1, 2, 3, 4}
    # In SQL too, as another language would: a rollback and a commit.
    psql_out(sbx, "BEGIN; SELECT flexiq_enqueue('orders.confirm', '[5]'); ROLLBACK;")
    psql_out(sbx, "BEGIN; SELECT flexiq_enqueue('orders.confirm', '[6]'); COMMIT;")
    # And from the command line, by name, with no note about defaults.
    cli = flexiq(sbx, "enqueue", "orders.confirm", "7")
    assert "declared" not in cli.stderr

    done = sbx.wait_for(lambda: (lambda d: d if len(d) == 4 else None)(jobs(sbx, "done")), 60,
                        what="the four committed jobs done")
    assert sorted(job["payload"]["args"][0] for job in done) == [2, 4, 6, 7]
    assert {(job["queue"], job["priority"], job["max_attempts"], job["timeout"]) for job in done} == {
        ("orders", 4, 6, 120.0)}
    # The rolled-back jobs never existed: not in the store, never run.
    every = json.loads(flexiq(sbx, "jobs", "list", "--json", "--limit", "100").stdout)
    assert len(every) == 4 and ids[1] not in {job["id"] for job in every}
    starts, ends = marks(sbx)
    assert sorted(starts) == sorted(job["id"] for job in done) and set(starts.values()) == {1}
    assert starts == ends


def psql_out(sbx: Sandbox, sql: str) -> str:
    return sbx.run(["runuser", "-u", "postgres", "--", "psql", "-At", "-d", DATABASE, "-c", sql]).stdout
