"""Fixtures for the job-store tests: one contract suite runs on every backend.

A backend joins the suite by adding its name to ``BACKENDS`` and a branch to
``open_test_backend`` that returns a fresh, empty store.  PostgreSQL stores live
on the session's own server (tests/pg_server.py), one schema per store.
"""

from __future__ import annotations

import pathlib

import pytest

from flexiqd.queue import Backend, open_backend

BACKENDS = ["sqlite", "postgres"]


def open_test_backend(kind: str, directory: pathlib.Path | str, pg_server=None) -> Backend:
    """A fresh, empty store of ``kind``: under ``directory`` (SQLite) or in a new schema (PostgreSQL)."""
    if kind == "sqlite":
        # synchronous=normal: no fsync per commit; durability is not what unit tests check.
        return open_backend(f"sqlite:///{pathlib.Path(directory).resolve()}/queue.db?synchronous=normal")
    if kind == "postgres":
        return open_backend(pg_server.fresh_url())
    raise ValueError(f"unknown test backend {kind!r}")


def exact_times(store: Backend) -> Backend:
    """``store`` taking the times it is given (``now=``) as exact: the contract's times are
    given, not read, so none of them is off by a measurement of the server's clock."""
    store.database.clock_error = lambda: 0.0
    return store


@pytest.fixture(params=BACKENDS)
def backend_kind(request) -> str:
    return request.param


def _server_for(kind: str, request):
    return request.getfixturevalue("pg_server") if kind == "postgres" else None


@pytest.fixture
def backend(backend_kind, tmp_path, request):
    store = exact_times(open_test_backend(backend_kind, tmp_path, _server_for(backend_kind, request)))
    yield store
    store.close()


@pytest.fixture
def sqlite_backend(tmp_path):
    """The SQLite store alone, for tests of its own behaviour (files, locks, query plans)."""
    store = open_test_backend("sqlite", tmp_path)
    yield store
    store.close()


@pytest.fixture
def postgres_backend(request):
    """The PostgreSQL store alone, for tests of its own behaviour (connections, notifications)."""
    store = open_test_backend("postgres", "", request.getfixturevalue("pg_server"))
    yield store
    store.close()


@pytest.fixture
def backend_factory(backend_kind, request):
    """Opens fresh stores of the current kind, for tests that need many (one per example)."""
    server = _server_for(backend_kind, request)
    return lambda directory: exact_times(open_test_backend(backend_kind, directory, server))
