"""A newcomer's path, end to end, in a clean Debian bookworm with the packages as a user gets them.

One story, each step building on the last, each step's outcome printed at the end:

1. install the .deb (its Recommends, no Cockpit);
2. put an application in a virtual environment under /opt and configure its pool;
3. ``flexiqd --check-config`` fails on a typo in the app's name, then passes;
4. a web application's user in group ``flexiq`` enqueues, and may not steer;
5. it enqueues in its own transaction: a rollback leaves no job, a commit one that runs;
6. a new version is deployed with ``flexiqctl restart --wait`` under load: every job runs
   once, none is lost, and the jobs started after the restart run the new version;
7. the live store is backed up;
8. the store moves to PostgreSQL (a password in its URL), the daemon runs on it, and
   the password appears in no output of any step: commands, journal, status.

Executions are counted by the application itself (a line per execution in a folder the
workers may write), not by the store's view of them.
"""

from __future__ import annotations

import json
import re
import textwrap
import time
from pathlib import Path
from typing import Iterator

import pytest

from .conftest import require
from .debian_rootfs import PACKAGES_INSIDE, DebianMachine, cached_rootfs, unavailable_reason

pytestmark = pytest.mark.slow

SECRET = "n3wc0mer-Pa55word"
DAEMON = "flexiqd.service"
CONFIG = "/etc/flexiqd/flexiqd.yaml"
MARKS = "/var/lib/flexiq/marks"
APP_SRC = "/opt/shop/src"
VENV = "/opt/shop/venv"
LOAD = 120         # jobs of 1 s in flight while the new version is deployed: ~20 s of work for 6 slots

APP = textwrap.dedent('''
    """The shop's tasks: a receipt per order, each execution marked with the code's version."""

    import os
    import time

    from flexiqd import Queue
    from flexiqd.worker.execution import current_job

    VERSION = "{version}"
    queue = Queue()


    @queue.task(queue="receipts", max_attempts=5)
    def send_receipt(order_id: int, seconds: float = 0.2) -> str:
        job = current_job()
        line = f"{{job.id}} {{VERSION}} {{os.getpid()}}\\n".encode()
        fd = os.open(os.path.join("{marks}", f"{{os.getpid()}}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        time.sleep(seconds)
        return f"receipt {{order_id}} by version {{VERSION}}"
''')

PYPROJECT = textwrap.dedent("""
    [build-system]
    requires = ["setuptools"]
    build-backend = "setuptools.build_meta"

    [project]
    name = "shop"
    version = "{version}"

    [tool.setuptools]
    packages = ["shop"]
""")

POOL = """
store: {store}
tick: 500ms
pools:
  shop:
    app: {app}
    python: /opt/shop/venv/bin/python
    queues: [receipts]
    concurrency: 2
    min_workers: 1
    max_workers: 4
    drain_timeout: 20s
    targets: {{age: 2s}}
"""

TX_SCRIPT = textwrap.dedent("""
    import sqlite3, sys
    from shop.tasks import queue, send_receipt

    queue.use("sqlite:////var/lib/flexiq/queue.db")
    conn = sqlite3.connect("/var/lib/flexiq/queue.db", timeout=30)
    conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")
    conn.commit()
    order = int(sys.argv[2])
    conn.execute("INSERT INTO orders (id) VALUES (?)", (order,))
    job = send_receipt.enqueue(order, connection=conn)
    if sys.argv[1] == "commit":
        conn.commit()
    else:
        conn.rollback()
    print(job)
""")


def _require_machine() -> None:
    require(unavailable_reason(), "the newcomer's path")


@pytest.fixture(scope="module")
def debs(release_deb: Path) -> Path:
    """The folder of the session's .deb (conftest.release_deb), the one the package tests install."""
    _require_machine()
    return release_deb.parent


class Walk:
    """The machine, every output it gave (to look for the password), and each step's outcome."""

    def __init__(self, machine: DebianMachine) -> None:
        self.machine = machine
        self.outputs: list[str] = []
        self.steps: list[str] = []

    def run(self, command, *, check: bool = True, user: str | None = None, timeout: float = 120.0):
        if user is not None:
            command = ["runuser", "-u", user, "--", *command] if isinstance(command, list) \
                else ["runuser", "-u", user, "--", "bash", "-c", command]
        done = self.machine.run(command, check=check, timeout=timeout)
        self.outputs += [done.stdout, done.stderr]
        return done

    def step(self, text: str) -> None:
        self.steps.append(text)
        print(f"step {len(self.steps)}: {text}")

    def executions(self) -> dict[int, list[str]]:
        """Each job's executions, by the version of the code that ran it."""
        out = self.run(f"cat {MARKS}/*.log 2>/dev/null || true").stdout
        runs: dict[int, list[str]] = {}
        for line in out.splitlines():
            job, version, _pid = line.split()
            runs.setdefault(int(job), []).append(version)
        return runs

    def job(self, job_id: int, url: str | None = None) -> dict:
        args = ["flexiq", *(["--url", url] if url else []), "jobs", "show", str(job_id), "--json"]
        return json.loads(self.run(args).stdout)

    def jobs(self, job_ids: list[int]) -> dict[int, dict]:
        """These jobs, read in one listing of the store (not a process per job)."""
        out = self.run(["flexiq", "jobs", "list", "--limit", "1000000", "--json"]).stdout
        wanted = set(job_ids)
        return {job["id"]: job for job in json.loads(out) if job["id"] in wanted}

    def status(self) -> dict:
        return json.loads(self.run(["flexiqctl", "status", "--json"]).stdout)


def install_app(walk: Walk, version: str) -> None:
    """The shop's code, installed into its virtual environment with pip (no index: its own source)."""
    machine = walk.machine
    machine.write_file(f"{APP_SRC}/pyproject.toml", PYPROJECT.format(version=version))
    machine.write_file(f"{APP_SRC}/shop/__init__.py", "")
    machine.write_file(f"{APP_SRC}/shop/tasks.py", APP.format(version=version, marks=MARKS))
    walk.run([f"{VENV}/bin/pip", "install", "--quiet", "--no-index", "--no-deps", "--no-build-isolation",
              APP_SRC])


def test_the_newcomers_path(debs: Path, pg_server) -> None:
    machine = DebianMachine(cached_rootfs(), binds=[(debs, PACKAGES_INSIDE)])
    with machine:
        walk = Walk(machine)
        try:
            _walk(walk, pg_server)
        finally:
            print("\n".join(f"{n}. {text}" for n, text in enumerate(walk.steps, 1)))


def _walk(walk: Walk, pg_server) -> None:
    machine = walk.machine
    # 1. Install.
    machine.apt("update")
    deb = next(debs_inside(walk))
    machine.apt("install", deb)
    # The shop's tools, without pip's Recommends (a compiler, Python's headers: 114 packages,
    # some 12 s here): the shop's code is pure Python, and the .deb's own Recommends came above.
    machine.apt("install", "--no-install-recommends", "python3-venv", "python3-pip", "python3-setuptools")
    machine.wait_for(lambda: walk.run(["systemctl", "is-active", DAEMON], check=False).stdout.strip() == "active",
                     30, what="flexiqd to be active")
    assert walk.run("dpkg-query -W cockpit-ws cockpit-bridge 2>/dev/null || true").stdout.strip() == ""
    walk.step("installed the .deb: flexiqd active, no web console pulled in")

    # 2. The application in a virtual environment; a folder where it marks each execution.
    walk.run(f"install -d -m 0755 /opt/shop && python3 -m venv --system-site-packages {VENV}")
    install_app(walk, "1")
    walk.run(f"install -d -m 0770 -o flexiq -g flexiq {MARKS}")
    walk.step("the shop's code installed with pip into /opt/shop/venv (--system-site-packages)")

    # 3. A pool for it: a typo fails --check-config, naming it; the fix passes.
    store = "sqlite:////var/lib/flexiq/queue.db"
    machine.write_file(CONFIG, POOL.format(store=store, app="shop.taks:queue"))
    typo = walk.run(["flexiqd", "--check-config"], check=False)
    assert typo.returncode == 1 and "no module named 'shop.taks'" in typo.stderr, typo
    assert "Traceback" not in typo.stderr
    machine.write_file(CONFIG, POOL.format(store=store, app="shop.tasks:queue"))
    good = walk.run(["flexiqd", "--check-config"], check=False)
    assert good.returncode == 0 and "imports as flexiq with /opt/shop/venv/bin/python" in good.stdout, good
    assert "shop.tasks.send_receipt" in good.stdout
    walk.run(["systemctl", "reload", DAEMON])
    machine.wait_for(lambda: "shop" in walk.status()["pools"] and walk.status()["pools"]["shop"]["workers"]
                     and walk.status()["pools"]["shop"]["workers"]["active"] >= 1, 60, what="the shop pool's worker")
    walk.step(f"check-config: the typo failed ({typo.stderr.strip().splitlines()[-1]}), the fix passed")

    # 4. The web application's user: a producer, not an operator.
    walk.run("useradd --create-home web && usermod -aG flexiq web")
    enqueued = walk.run(["flexiq", "enqueue", "shop.tasks.send_receipt", "1"], user="web")
    first = int(enqueued.stdout.split()[-1])
    machine.wait_for(lambda: walk.job(first)["state"] == "done", 60, what="the web user's job")
    assert walk.job(first)["queue"] == "receipts"   # the task's declaration, without its code
    refused = walk.run(["flexiqctl", "pause", "shop"], user="web", check=False)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused
    assert walk.status()["pools"]["shop"]["paused"] is False
    walk.step(f"user web (group flexiq) enqueued job {first} into its declared queue, and may not pause "
              f"the pool: {refused.stderr.strip().splitlines()[-1]}")

    # 5. In the web application's own transaction.
    machine.write_file("/home/web/tx.py", TX_SCRIPT, mode=0o644)
    before = {job_id for job_id in walk.executions()}
    rolled = int(walk.run([f"{VENV}/bin/python", "/home/web/tx.py", "rollback", "100"], user="web").stdout)
    committed = int(walk.run([f"{VENV}/bin/python", "/home/web/tx.py", "commit", "101"], user="web").stdout)
    machine.wait_for(lambda: walk.job(committed)["state"] == "done", 60, what="the committed job")
    gone = walk.run(["flexiq", "jobs", "show", str(rolled)], check=False)
    assert gone.returncode != 0 or rolled == committed, gone   # a rolled-back id may be reused
    assert walk.executions().get(committed) == ["1"] and set(walk.executions()) - before == {committed}
    walk.step("a transaction rolled back left no job; one committed ran once")

    # 6. Deploy version 2 under load with flexiqctl restart.
    load = walk.run(["flexiq", "enqueue", "shop.tasks.send_receipt", "7", "--kwargs", '{"seconds": 1.0}',
                     "--count", str(LOAD)], user="web").stdout
    low, high = re.search(r"ids (\d+)\.\.(\d+)", load).groups()   # "enqueued 40 jobs, ids 5..44"
    load_ids = list(range(int(low), int(high) + 1))
    assert len(load_ids) == LOAD, load
    machine.wait_for(lambda: walk.status()["pools"]["shop"]["workers"]["active"] >= 2, 60,
                     what="the pool to grow under the load")
    install_app(walk, "2")
    assert walk.run(["flexiqd", "--check-config"]).returncode == 0
    # As docs/deploy.md says: a pool at its max_workers has no room for a step; pin it one below.
    walk.run(["flexiqctl", "scale", "shop", "3", "--for", "10m"])
    restarted_at = time.time()
    restart = walk.run(["flexiqctl", "restart", "shop", "--wait", "--timeout", "5m"], timeout=330)
    restart_done = time.time()
    walk.run(["flexiqctl", "unpin", "shop"])

    def load_done() -> dict[int, dict] | None:
        found = walk.jobs(load_ids)
        return found if len(found) == LOAD and all(job["state"] == "done" for job in found.values()) else None

    jobs = machine.wait_for(load_done, 180, interval=1.0, what="every job of the load to be done")
    runs = walk.executions()
    twice = [j for j in load_ids if len(runs.get(j, [])) > 1]
    lost = [j for j in load_ids if not runs.get(j)]
    assert not twice and not lost, (twice, lost)
    started_after = [j for j in load_ids if jobs[j]["started_at"] and jobs[j]["started_at"] > restart_done]
    assert all(runs[j] == ["2"] for j in started_after), {j: runs[j] for j in started_after}
    versions = sorted(v for j in load_ids for v in runs[j])
    assert started_after and "2" in versions, (
        f"the restart ended with no job left for the new version: it took {restart_done - restarted_at:.1f} s, "
        f"said {restart.stdout!r}; the load's jobs started from {min(jobs[j]['started_at'] for j in load_ids) - restarted_at:.1f} "
        f"to {max(jobs[j]['started_at'] for j in load_ids) - restarted_at:.1f} s after the request")
    walk.step(f"flexiqctl restart --wait under load of {LOAD} jobs: {len(twice)} run twice, {len(lost)} lost; "
              f"{versions.count('1')} ran on version 1, {versions.count('2')} on version 2; every job started "
              f"after the restart ended ({len(started_after)}) ran version 2; took {restart_done - restarted_at:.1f} s "
              f"({restart.stdout.strip().splitlines()[-1] if restart.stdout.strip() else 'no output'})")

    # 7. Back up the live store.
    backup = walk.run(["flexiq", "backup", "/var/backups/queue.db"])
    check = walk.run(["python3", "-c", "import sqlite3; print(sqlite3.connect('/var/backups/queue.db')"
                      ".execute('PRAGMA integrity_check').fetchone()[0])"]).stdout.strip()
    assert check == "ok", check
    walk.step(f"backup of the live store: {backup.stdout.strip().splitlines()[0]}; integrity {check}")

    # 8. Move the store to PostgreSQL, the password in its URL.
    database = "shop_queue"
    pg_server.admin(f"DROP DATABASE IF EXISTS {database}")
    pg_server.admin("DROP ROLE IF EXISTS shop")
    pg_server.admin(f"CREATE ROLE shop LOGIN PASSWORD '{SECRET}'")
    pg_server.admin(f"CREATE DATABASE {database} OWNER shop")
    url = f"postgresql://shop:{SECRET}@127.0.0.1:{pg_server.port}/{database}"
    delayed = int(walk.run(["flexiq", "enqueue", "shop.tasks.send_receipt", "9", "--delay", "5s"]).stdout.split()[-1])
    walk.run(["systemctl", "stop", DAEMON], timeout=120)
    moved = machine.wait_for(lambda: (lambda done: done if done.returncode == 0 else None)(
        walk.run(["flexiq", "move-store", "--to", url], check=False)), 60, interval=1.0,
        what="move-store to be allowed once the daemon's heartbeat is old")
    machine.write_file(CONFIG, POOL.format(store=url, app="shop.tasks:queue"), mode=0o640)
    walk.run(["chgrp", "flexiq", CONFIG])
    checked = walk.run(["flexiqd", "--check-config"])
    walk.run(["systemctl", "start", DAEMON], timeout=120)
    machine.wait_for(lambda: walk.job(delayed, url)["state"] == "done", 90, interval=1.0,
                     what="the delayed job, carried over, to run on PostgreSQL")
    after = int(walk.run(["flexiq", "--url", url, "enqueue", "shop.tasks.send_receipt", "10"]).stdout.split()[-1])
    machine.wait_for(lambda: walk.job(after, url)["state"] == "done", 60, what="a new job on PostgreSQL")
    walk.run(["flexiqctl", "status"])
    walk.run(["systemctl", "status", "--no-pager", DAEMON], check=False)
    walk.run(["journalctl", "--no-pager", "-b", "-o", "verbose"])
    walk.run(["busctl", "--system", "get-property", "org.flexiq.flexiqd1", "/org/flexiq/flexiqd1",
              "org.flexiq.flexiqd1.Manager", "ConfigError"], check=False)
    assert walk.executions().get(delayed) and walk.executions().get(after)
    shown = [text for text in walk.outputs if SECRET in text]
    assert not shown, f"the password appeared in {len(shown)} outputs, e.g. {shown[0][:300]!r}"
    walk.step(f"moved to PostgreSQL ({moved.stdout.strip().splitlines()[0]}); the carried delayed job and a "
              f"new one ran there; check-config said {checked.stdout.splitlines()[0]!r}; the password appeared in "
              f"none of {len(walk.outputs)} outputs (commands, journal, status)")


def debs_inside(walk: Walk) -> Iterator[str]:
    out = walk.run(f"ls {PACKAGES_INSIDE}/flexiqd_*_all.deb").stdout.split()
    return iter(out)
