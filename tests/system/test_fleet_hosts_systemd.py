"""Three machines, one PostgreSQL: heartbeats, a global cap shared between them, and a whole
machine killed under a flood -- each machine a systemd sandbox of its own (its own systemd,
flexiqd and worker units, its own network namespace and host name).

They reach one server through its unix socket: the server runs on this machine with its
socket directory inside the checkout, which every sandbox sees at the same path (and the
worker units through their read-only bind of it).  The tasks (tests/apps/fleet_app.py)
record each execution's start and end, with the time, in a folder every sandbox writes
to, so executions are counted even on the machine that was killed.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from pg_server import PostgresServer, unavailable_reason as pg_unavailable

from .conftest import require
from .flexiqd_install import REPO, install
from .sandbox import Sandbox, start_all, unavailable_reason

HOSTS = 3
CAPACITY = 6        # the global dependency: at most 6 workers in the whole fleet
JOBS = 400
SECONDS = 0.4
RESCUE_AIM = 10.0   # seconds from a machine's death to its jobs back in the queue


def fleet_config(url: str, marks: str) -> str:
    return f"""
store: '{url}'
tick: 500ms
heartbeat: 2s
dependencies:
  api: {{capacity: {CAPACITY}, global: true}}
pools:
  default:
    app: fleet_app:queue
    concurrency: 2
    min_workers: 1
    max_workers: 6
    drain_timeout: 10s
    uses: {{api: {{per_worker: 1}}}}
    environment:
      PYTHONPATH: {REPO / "tests" / "apps"}
      FLEXIQ_TEST_MARKS: {marks}
    targets: {{age: 2s, lead_time: 1s}}
    behavior:
      down_window: 4s
      up_limit: {{workers: 6, percent: 100, period: 1s}}
      down_limit: {{workers: 6, percent: 100, period: 1s}}
"""


class SharedServer(PostgresServer):
    """The test PostgreSQL with its socket in a folder of the checkout (seen by every sandbox)."""

    def __init__(self) -> None:
        super().__init__()
        shutil.rmtree(self.directory, ignore_errors=True)
        cache = REPO / ".cache"
        cache.mkdir(exist_ok=True)
        self.directory = Path(tempfile.mkdtemp(prefix="fleet-pg-", dir=cache))
        self.directory.chmod(0o755)
        self.data = self.directory / "data"

    def store_url(self) -> str:
        return (f"postgresql://postgres@/flexiq_test?host={quote(str(self.directory), safe='')}"
                f"&port={self.port}")


@pytest.fixture
def fleet():
    """A PostgreSQL, a shared marks folder, and three booted sandboxes; all torn down after."""
    yield from machines(HOSTS)


def machines(count: int):
    """(server, marks, sandboxes): a PostgreSQL, a shared marks folder and ``count`` booted
    sandboxes, torn down after (a fixture's body)."""
    for reason in (unavailable_reason(), pg_unavailable()):
        require(reason, "system tests")
    server = SharedServer().start()
    marks = Path(tempfile.mkdtemp(prefix="fleet-marks-", dir=REPO / ".cache"))
    marks.chmod(0o777)
    sandboxes = [Sandbox() for _ in range(count)]
    try:
        start_all(sandboxes)
        yield server, marks, sandboxes
    finally:
        for sbx in sandboxes:
            sbx.stop()
        server.stop()
        shutil.rmtree(marks, ignore_errors=True)


def start_flexiqd(sbx: Sandbox, config: str, marks: Path, *, tree: Path = REPO) -> str:
    """Install and start flexiqd (of ``tree``: see flexiqd_install.install) on a machine of
    ``machines``; its host name."""
    sbx.wait_for(lambda: sbx.run(["systemctl", "is-active", "dbus"], check=False).stdout.strip() == "active",
                 30, what="the sandbox's D-Bus")
    # The sandboxes boot this machine's root, /etc/hostname included: each gets a name of its own.
    sbx.run(["hostname", f"fleet-{sbx.name.rsplit('-', 1)[-1]}"])
    # The tasks write their marks to the shared folder (the unit's file system is read-only).
    sbx.write_file("/etc/systemd/system/flexiq-worker@.service.d/20-marks.conf",
                   f"[Service]\nReadWritePaths={marks}\n")
    install(sbx, config, tree=tree)
    return sbx.run(["hostname"]).stdout.strip()


def read_marks(marks: Path) -> tuple[dict[int, list[tuple[float, str]]], dict[int, list[tuple[float, str]]]]:
    """((time, host) of each start per job, the same of each end) from every machine's tasks."""
    starts: dict[int, list[tuple[float, str]]] = collections.defaultdict(list)
    ends: dict[int, list[tuple[float, str]]] = collections.defaultdict(list)
    for log in marks.glob("*.log"):
        for line in log.read_text().splitlines():
            what, job_id, _attempt, host, at = line.split()
            (starts if what == "start" else ends)[int(job_id)].append((float(at), host))
    return starts, ends


class Sampler(threading.Thread):
    """Samples the fleet-wide use of the global dependency from the store, five times a second:
    the workers each live machine reports (active, starting and draining), and the workers
    holding jobs (distinct lease owners), and keeps the largest of each."""

    def __init__(self, server: SharedServer) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.stop_event = threading.Event()
        self.most_reported = 0
        self.most_busy = 0
        self.reports: dict[str, int] = {}

    def run(self) -> None:
        while not self.stop_event.wait(0.2):
            now = time.time()
            rows = self.server.admin("SELECT name, last_beat, interval, report FROM flexiq_hosts",
                                     database="flexiq_test")
            reports = {name: json.loads(report).get("pools", {}).get("default", {}).get("current", 0)
                       for name, beat, interval, report in rows if now - beat <= 2 * interval}
            busy = self.server.admin("SELECT count(DISTINCT lease_owner) FROM flexiq_jobs "
                                     "WHERE state = 'running'", database="flexiq_test")[0][0]
            self.reports = reports
            self.most_reported = max(self.most_reported, sum(reports.values()))
            self.most_busy = max(self.most_busy, busy)


def wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {value!r})")
        time.sleep(0.1)


def test_three_machines_share_a_global_cap_and_a_killed_machines_jobs_come_back_once(fleet):
    server, marks, sandboxes = fleet
    server.admin("CREATE DATABASE flexiq_test")
    config = fleet_config(server.store_url(), str(marks))
    names = [start_flexiqd(sbx, config, marks) for sbx in sandboxes]
    assert len(set(names)) == HOSTS
    from flexiqd import Queue

    queue = Queue(server.store_url())
    sampler = Sampler(server)
    try:
        wait(lambda: {h.name for h in queue.backend.hosts(now=time.time()) if h.alive} == set(names), 30,
             "every machine's heartbeat")
        sampler.start()
        ids = [queue.enqueue("work", [SECONDS]) for _ in range(JOBS)]
        # The fleet grows to the capacity, every machine running some of it.
        wait(lambda: sum(sampler.reports.values()) == CAPACITY and len(sampler.reports) == HOSTS
             and all(sampler.reports.values()), 40, "the fleet at its global capacity")

        victim, victim_name = sandboxes[-1], names[-1]
        owned = lambda: [j.id for j in queue.backend.list_jobs(state=None, limit=100_000)  # noqa: E731
                         if j.lease_owner and j.lease_owner.startswith(victim_name + ":")
                         and j.state.value == "running"]
        running_there = wait(owned, 20, "jobs running on the machine to kill")
        killed_at = time.time()
        os.kill(victim.leader, signal.SIGKILL)  # the whole machine at once: its PID namespace dies
        back = wait(lambda: not owned() and time.time(), RESCUE_AIM + 20, "the dead machine's jobs back")
        rescue_seconds = back - killed_at

        # The two machines left take the whole capacity between them.
        try:
            wait(lambda: len(sampler.reports) == HOSTS - 1 and sum(sampler.reports.values()) == CAPACITY, 40,
                 "the shares rebalanced over the two machines left")
        except AssertionError:
            print("REPORTS", sampler.reports)
            for sbx in sandboxes[:-1]:
                print(sbx.run(["journalctl", "-u", "flexiqd", "--no-pager", "-n", "150"], check=False).stdout)
            raise
        wait(lambda: all(queue.get(job_id).state.value == "done" for job_id in ids), 120, "every job done")
    finally:
        sampler.stop_event.set()
        sampler.join()

    print(f"rescue: {rescue_seconds:.2f}s after the kill; {len(running_there)} jobs were running there; "
          f"most workers reported {sampler.most_reported}, most busy {sampler.most_busy}")
    assert rescue_seconds < RESCUE_AIM
    assert sampler.most_reported <= CAPACITY
    assert sampler.most_busy <= CAPACITY
    starts, ends = read_marks(marks)
    assert set(ends) == set(ids)
    twice = {job_id for job_id in ids if len(starts[job_id]) > 1}
    # Only jobs the killed machine had started ran again: elsewhere, after it died.
    for job_id in twice:
        first, *again = sorted(starts[job_id])
        assert first[1] == victim_name, f"job {job_id} ran twice, first on live machine {first[1]}"
        assert all(at > killed_at and host != victim_name for at, host in again), (job_id, starts[job_id])
    # Cut by the kill: started there, never ended there.  Each ran again elsewhere, handed
    # back by the rescue (not lost with its lease), and with no attempt used.
    cut = {j for j in ids if any(host == victim_name for _, host in starts[j])
           and not any(host == victim_name for _, host in ends[j])}
    assert cut and cut <= twice
    rescued = {job_id for (job_id,) in server.admin(
        "SELECT job_id FROM flexiq_executions WHERE outcome = 'release' AND error LIKE '%stopped beating%'",
        database="flexiq_test")}
    assert cut <= rescued <= set(ids)
    assert all(queue.get(j).attempts == 1 for j in rescued)
    assert len(twice) <= 6 * (2 + 16)  # the crash bound, per worker the lost machine ran
    # A job ends twice only when the killed machine had finished it without recording it yet.
    assert all(len(ends[job_id]) == 1 for job_id in ids if job_id not in twice), "a job ran twice"
    queue.close()
