"""The store's operations on an installed flexiqd under systemd: a backup taken while the
workers run, then the move of that store to PostgreSQL and the daemon started on it.

Counted by executions (tests/apps/counting_app.py marks each one): every job enqueued
on SQLite -- run before the move, queued or delayed at it -- runs exactly once, under
the id its enqueue reported, and none is lost on the way.
"""

from __future__ import annotations

import json
import re

import pytest

from .flexiqd_install import BIN, CONFIG, DAEMON, STORE, flexiq, install, marks, workers
from .sandbox import Sandbox
from .sandbox_postgres import DATABASE, PASSWORD, start_postgres

SECRET = "/etc/flexiqd/db.password"
PG_STORE = f"postgresql://flexiq@127.0.0.1:5432/{DATABASE}?password_credential=flexiq-db"
PG_CLI = f"postgresql://flexiq@127.0.0.1:5432/{DATABASE}?password_file={SECRET}"
CREDENTIALS = f"    credentials: {{flexiq-db: {SECRET}}}\n"
SQLITE_CONFIG = CONFIG + CREDENTIALS
PG_CONFIG = CONFIG.replace(f"store: {STORE}", f"store: '{PG_STORE}'") + CREDENTIALS
DAEMON_DROPIN = f"[Service]\nLoadCredential=flexiq-db:{SECRET}\n"
BACKUP = "/root/queue-backup.db"
_IDS = re.compile(r"enqueued (\d+) jobs, ids (\d+)\.\.(\d+)")

# Opens the backup read-only and reports what a consistent copy must show.
_INSPECT = """
import json, sqlite3, sys
conn = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
print(json.dumps({
    "integrity": conn.execute("PRAGMA integrity_check").fetchone()[0],
    "ids": [row[0] for row in conn.execute("SELECT id FROM jobs ORDER BY id")],
    "states": dict(conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()),
    "counted": dict(conn.execute("SELECT state, SUM(n) FROM counts GROUP BY state").fetchall()),
}))
"""


def _enqueue(sbx: Sandbox, *args: str) -> list[int]:
    out = flexiq(sbx, "enqueue", "count", *args).stdout.strip()
    found = _IDS.search(out)
    if found:
        return list(range(int(found.group(2)), int(found.group(3)) + 1))
    return [int(out)]


def _pg(sbx: Sandbox, *args: str, check: bool = True):
    return sbx.run([str(BIN / "flexiq"), "--url", PG_CLI, *args], check=check)


@pytest.fixture
def postgres(sandbox: Sandbox):
    start_postgres(sandbox)
    sandbox.write_file(SECRET, PASSWORD + "\n", mode=0o600)
    yield sandbox
    sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*' 2>/dev/null; true", timeout=120)


def test_a_backup_under_load_then_a_move_to_postgresql_runs_every_job_once(postgres: Sandbox):
    sbx = postgres
    install(sbx, SQLITE_CONFIG, daemon_dropin=DAEMON_DROPIN)
    sbx.wait_for(lambda: workers(sbx), 30, what="the minimum worker")
    ids = _enqueue(sbx, "0.2", "--count", "300")
    sbx.wait_for(lambda: len(marks(sbx)[1]) >= 10, 60, interval=0.2, what="the workers to finish 10 jobs")

    # The backup, while the workers claim and complete.
    out = flexiq(sbx, "backup", BACKUP).stdout
    assert f"to {BACKUP}" in out and "integrity check ok" in out
    copy = json.loads(sbx.run([str(BIN / "python"), "-c", _INSPECT, BACKUP]).stdout)
    finished_after = len(marks(sbx)[1])
    assert copy["integrity"] == "ok"
    assert copy["ids"] == ids and copy["states"] == copy["counted"]
    assert 10 <= copy["states"].get("done", 0) < len(ids), copy["states"]
    assert finished_after < len(ids), "the backup was not taken while jobs ran"

    # The move: the daemon stopped (its workers drain), more jobs enqueued meanwhile.
    sbx.systemctl("stop", DAEMON)
    sbx.wait_for(lambda: not workers(sbx), 60, interval=0.2, what="the workers to drain and stop")
    ids += _enqueue(sbx, "0.05", "--count", "50")
    ids += _enqueue(sbx, "0", "--delay", "3s")
    sbx.wait_for(lambda: not any(h["alive"] for h in json.loads(flexiq(sbx, "hosts", "--json").stdout)),
                 30, interval=0.5, what="the stopped daemon's host to count as gone")
    moved = flexiq(sbx, "move-store", "--to", PG_CLI).stdout
    assert "store:" in moved and "/etc/flexiqd/flexiqd.yaml" in moved and PASSWORD not in moved
    assert sbx.run(["stat", "-c", "%a", "/var/lib/flexiq/queue.db"]).stdout.strip()[0] in "45"
    refused = flexiq(sbx, "stats", check=False)
    assert refused.returncode == 1 and "was moved to postgresql://" in refused.stderr

    # The daemon started on the old file refuses; on the new store it runs what was carried.
    failed = sbx.systemctl("start", DAEMON, check=False)
    assert failed.returncode != 0
    journal = sbx.run(f"journalctl --no-pager -n 30 -u {DAEMON}", check=False).stdout
    assert "was moved to postgresql://" in journal
    sbx.run(f"systemctl stop {DAEMON}; systemctl reset-failed {DAEMON}; true")
    sbx.write_file("/etc/flexiqd/flexiqd.yaml", PG_CONFIG)
    sbx.systemctl("start", DAEMON)
    sbx.wait_for(lambda: len(marks(sbx)[1]) >= len(ids), 180, interval=0.5, what="every job to run on the new store")
    sbx.wait_for(lambda: len(json.loads(_pg(sbx, "jobs", "list", "--state", "done", "--limit", "1000",
                                            "--json").stdout)) >= len(ids), 30, interval=0.5,
                 what="every job's result recorded")
    done = json.loads(_pg(sbx, "jobs", "list", "--state", "done", "--limit", "1000", "--json").stdout)
    starts, ends = marks(sbx)
    assert sorted(job["id"] for job in done) == sorted(ids)  # every id the SQLite enqueues reported
    assert sorted(starts) == sorted(ids) and set(starts.values()) == {1}, "a job was lost or ran twice"
    assert ends == starts
