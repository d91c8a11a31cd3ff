"""flexiqd and its worker units on a PostgreSQL store under a real systemd, the password a
systemd credential: the daemon's from a drop-in's LoadCredential=, each worker's from its
pool's ``credentials:``.  The PostgreSQL is the one the machine image starts inside the
sandbox (its own network namespace: 127.0.0.1:5432 there is the sandbox's own)."""

from __future__ import annotations

import json

import pytest

from .flexiqd_install import BIN, CONFIG, DAEMON, STORE, install, marks, workers
from .sandbox import Sandbox
from .sandbox_postgres import DATABASE, PASSWORD, start_postgres

SECRET = "/etc/flexiqd/db.password"  # root's alone: systemd hands it to the units
STORE_URL = f"postgresql://flexiq@127.0.0.1:5432/{DATABASE}?password_credential=flexiq-db"
CLI_URL = f"postgresql://flexiq@127.0.0.1:5432/{DATABASE}?password_file={SECRET}"


def flexiq(sbx: Sandbox, *args: str) -> str:
    return sbx.run([str(BIN / "flexiq"), "--url", CLI_URL, *args]).stdout


@pytest.fixture
def postgres(sandbox: Sandbox) -> Sandbox:
    start_postgres(sandbox)
    sandbox.write_file(SECRET, PASSWORD + "\n", mode=0o600)
    yield sandbox
    sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*' 2>/dev/null; true")


def test_daemon_and_worker_units_run_jobs_once_on_postgresql_with_a_credential_password(postgres):
    sbx = postgres
    config = (CONFIG.replace(f"store: {STORE}", f"store: '{STORE_URL}'")
              + f"    credentials: {{flexiq-db: {SECRET}}}\n")
    check = sbx.run([str(BIN / "flexiqd"), "--check-config", "/dev/stdin"], input=config, check=False)
    assert check.returncode == 1 and "$CREDENTIALS_DIRECTORY is not set" in check.stderr  # not a unit
    install(sbx, config, daemon_dropin=f"[Service]\nLoadCredential=flexiq-db:{SECRET}\n")
    sbx.wait_for(lambda: workers(sbx), 30, what="the minimum worker")
    flexiq(sbx, "enqueue", "count", "0.2", "--count", "30")
    sbx.wait_for(lambda: len(json.loads(flexiq(sbx, "jobs", "list", "--state", "done", "--json"))) == 30,
                 90, what="30 jobs done")
    starts, ends = marks(sbx)
    assert len(starts) == 30 and set(starts.values()) == {1} and starts == ends
    unit = workers(sbx)[0]
    assert f"LoadCredential=flexiq-db:{SECRET}" in sbx.run(["systemctl", "cat", unit]).stdout
    # The password is in no unit's environment or command line, and nowhere in the journal.
    assert PASSWORD not in sbx.run(["systemctl", "show", unit, DAEMON]).stdout
    assert PASSWORD not in sbx.run(["journalctl", "--no-pager", "-u", DAEMON, "-u", "flexiq-worker@*"]).stdout
