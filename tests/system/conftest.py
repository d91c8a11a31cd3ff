"""Fixtures for tests that need a real systemd: one sandbox per test session.

Every test collected under tests/system is marked ``system``, so
``pytest -m "not system"`` leaves them out wherever they live in a run.

The ``sandbox`` fixture skips when the machine cannot boot one (not root, no
systemd-nspawn) -- on a developer's laptop that is fine -- but fails instead
when the ``CI`` environment variable is set: CI must run these tests, and a
skip there would hide a broken runner.

``release_deb`` builds this checkout's .deb once for the session: the package tests and
the newcomer's path install the same build.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from . import debian_rootfs
from .sandbox import Sandbox, unavailable_reason

HERE = Path(__file__).resolve().parent


def in_ci() -> bool:
    """True when ``CI`` is set to anything but "", "0", "false" or "no"."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # This hook sees every item of the session, not only this folder's.
    for item in items:
        if Path(item.path).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.system)


def require(reason: str | None, what: str) -> None:
    """Skip when a prerequisite is missing (``reason``), but fail in CI, where ``what`` must run."""
    if reason is None:
        return
    if in_ci():
        pytest.fail(f"{what} must run in CI, but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def sandbox() -> Iterator[Sandbox]:
    """A booted container with systemd as PID 1, shared by the whole session.

    Tests share it, so each uses its own unit and instance names and stops
    what it started. A failed boot is an error everywhere (it is cached: the
    session does not retry it for every test); only missing prerequisites skip.
    """
    require(unavailable_reason(), "system tests")
    with Sandbox() as sbx:
        yield sbx


@pytest.fixture(scope="session")
def release_deb() -> Iterator[Path]:
    """This checkout's .deb, built once for the session (``<dir>/release/``, beside its
    flexiqd-cockpit .deb and .changes): the package tests and the newcomer's path install
    the same build.  Not under /tmp: the sandbox of this machine's root has a /tmp of its own.

    Built without the build-time unit tests: this suite runs them itself.
    """
    require(debian_rootfs.unavailable_reason(), "the package tests")
    out = Path(tempfile.mkdtemp(prefix="flexiq-packages-", dir="/var/tmp"))
    try:
        yield debian_rootfs.build_deb(out / "release", check=False)
    finally:
        shutil.rmtree(out, ignore_errors=True)
