"""Which PostgreSQL connection errors pass by themselves (waited out) and which are a mistake to report."""

from __future__ import annotations

import psycopg
import pytest

from flexiqd.queue.postgres.database import _passes


@pytest.mark.parametrize("message", [
    'connection failed: connection to server on socket "/run/postgresql/.s.PGSQL.5432" failed: '
    "Connection refused",
    "connection failed: FATAL:  the database system is starting up",
    "connection failed: FATAL:  the database system is shutting down",
    # After an immediate shutdown, while recovery has not reached a consistent state (PostgreSQL 15).
    "connection failed: FATAL:  the database system is not yet accepting connections\n"
    "DETAIL:  Consistent recovery state has not been yet reached.",
])
def test_a_server_down_or_restarting_passes(message):
    assert _passes(psycopg.OperationalError(message))


@pytest.mark.parametrize("message", [
    'connection failed: FATAL:  password authentication failed for user "flexiq"',
    'connection failed: FATAL:  database "nope" does not exist',
])
def test_a_wrong_password_or_database_does_not(message):
    assert not _passes(psycopg.OperationalError(message))
