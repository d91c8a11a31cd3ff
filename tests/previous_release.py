"""The previous release of flexiqd, built from this repository's own history.

A rolling upgrade runs this release on some hosts and the previous one on the others, on
one schema; the tests that check it run the previous release's code as it is, taken
from git (``git archive``), never a copy kept in the tests.

There are no release tags: the previous release is the commit below, pinned here alone.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The last commit before the schedules' ledger (PostgreSQL schema 5, SQLite 10): the
# schema a fleet ran before this one (PostgreSQL 4, SQLite 9), whose code refuses a store
# of a higher version ("newer than this flexiqd understands").  Moved forward when a
# release's schema changes again.
PREVIOUS_RELEASE = "4ecc5232443929077f5e2f6b04c13d37d247da23"
PREVIOUS_POSTGRES_SCHEMA = 4
PREVIOUS_SQLITE_SCHEMA = 9


def unavailable_reason() -> str | None:
    """Why the previous release cannot be taken from git here (None: it can).  A source
    tarball has no history; CI's clone of main has."""
    if shutil.which("git") is None:
        return "git is not installed"
    found = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"],
                           capture_output=True, check=False)
    if found.returncode != 0:
        return f"the previous release ({PREVIOUS_RELEASE[:12]}) is not in this checkout's git history"
    return None


def before_schema_steps() -> str:
    """The last commit before the schema steps were recorded (flexiqd/queue/schema_steps.py):
    its code wrote its own newest step as the level, and checks for it exactly."""
    added = subprocess.run(["git", "-C", str(REPO), "log", "--diff-filter=A", "--format=%H", "--",
                            "flexiqd/queue/schema_steps.py"], capture_output=True, text=True, check=True)
    return added.stdout.split()[-1] + "^"


def export(destination: Path, commit: str = PREVIOUS_RELEASE) -> Path:
    """The files of ``commit`` (the previous release unless told), as committed, in
    ``destination`` (made if missing)."""
    destination.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(destination)  # our own commit: no member escapes it
    return destination


def install(tree: Path) -> Path:
    """Install the exported release into a virtual environment of its own inside ``tree``
    (the system's Python packages, as the checkout's own .venv); its bin folder."""
    venv = tree / ".venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-build-isolation",
                    "--no-deps", "--no-index", str(tree)], check=True, cwd=tree)
    return venv / "bin"


def run(tree: Path, code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``code`` (with ``args`` in sys.argv[1:]) in this machine's Python, flexiqd imported
    from ``tree``: its folder comes first on the path, before the checkout's own install."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONNOUSERSITE": "1"}
    return subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=tree,
                          capture_output=True, text=True, timeout=timeout, check=False)
