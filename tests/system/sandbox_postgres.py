"""The sandbox's PostgreSQL (the one the machine image starts inside the container, on its own
network namespace: 127.0.0.1:5432 there is the sandbox's own), with a fresh database owned
by a role that logs in with a password."""

from __future__ import annotations

import pytest

from .flexiqd_install import DAEMON
from .sandbox import Sandbox

PASSWORD = "credential-s3cret"
DATABASE = "flexiq_sbx"


def psql(sbx: Sandbox, sql: str) -> None:
    sbx.run(["runuser", "-u", "postgres", "--", "psql", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql])


def start_postgres(sbx: Sandbox, password: str = PASSWORD) -> None:
    """PostgreSQL up, flexiqd stopped, and an empty database ``DATABASE`` of role flexiq."""
    started = sbx.run("systemctl start postgresql@15-main", check=False)
    if started.returncode != 0:
        pytest.fail(f"the sandbox's PostgreSQL did not start: {started.stderr}", pytrace=False)
    sbx.wait_for(lambda: sbx.run("pg_isready -q -h 127.0.0.1 -p 5432", check=False).returncode == 0,
                 60, what="PostgreSQL in the sandbox to accept connections")
    sbx.run(f"systemctl stop {DAEMON} 'flexiq-worker@*' 2>/dev/null; true")
    psql(sbx, f"DROP DATABASE IF EXISTS {DATABASE}")
    psql(sbx, "DROP ROLE IF EXISTS flexiq")
    psql(sbx, f"CREATE ROLE flexiq LOGIN PASSWORD '{password}'")
    psql(sbx, f"CREATE DATABASE {DATABASE} OWNER flexiq")
