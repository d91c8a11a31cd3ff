"""Fixtures every test folder shares: the PostgreSQL server the tests start themselves.

``pg_server`` skips where the server binaries are missing on a developer's machine,
and fails instead when the ``CI`` environment variable is set: CI must run the
PostgreSQL tests, and a skip there would hide a broken runner.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from pg_server import PostgresServer, in_ci, unavailable_reason


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """One PostgreSQL 15 server for the session, stopped and removed at its end."""
    reason = unavailable_reason()
    if reason is not None:
        if in_ci():
            pytest.fail(f"PostgreSQL tests must run in CI, but {reason}", pytrace=False)
        pytest.skip(reason)
    with PostgresServer() as server:
        yield server


@pytest.fixture
def pg_url(pg_server) -> str:
    """The URL of an empty schema of its own on the session's server."""
    return pg_server.fresh_url()
