"""Fixtures for the job-store tests: one contract suite runs on every backend.

A backend joins the suite by adding its name to ``BACKENDS`` and a branch to
``open_test_backend`` that returns a fresh, empty store.
"""

from __future__ import annotations

import pathlib

import pytest

from flexiqd.queue import Backend, open_backend

BACKENDS = ["sqlite"]


def open_test_backend(kind: str, directory: pathlib.Path | str) -> Backend:
    """A fresh, empty store of ``kind`` keeping its files under ``directory``."""
    if kind == "sqlite":
        # synchronous=normal: no fsync per commit; durability is not what unit tests check.
        return open_backend(f"sqlite:///{pathlib.Path(directory).resolve()}/queue.db?synchronous=normal")
    raise ValueError(f"unknown test backend {kind!r}")


@pytest.fixture(params=BACKENDS)
def backend_kind(request) -> str:
    return request.param


@pytest.fixture
def backend(backend_kind, tmp_path):
    store = open_test_backend(backend_kind, tmp_path)
    yield store
    store.close()


@pytest.fixture
def sqlite_backend(tmp_path):
    """The SQLite store alone, for tests of its own behaviour (files, locks, query plans)."""
    store = open_test_backend("sqlite", tmp_path)
    yield store
    store.close()


@pytest.fixture
def backend_factory(backend_kind):
    """Opens fresh stores of the current kind, for tests that need many (one per example)."""
    return lambda directory: open_test_backend(backend_kind, directory)
