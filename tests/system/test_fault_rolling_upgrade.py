"""A rolling upgrade of a PostgreSQL fleet: machine B runs the previous release (built from
this repository's git history, tests/previous_release.py), machine A is upgraded to this
one and moves the schema on, and both keep claiming and scaling under a steady load.

The fault: the first upgraded host migrates the schema while another host runs the older
code.  Before expand steps left the level older code checks alone, every process of the
older release that opened the store after that was refused ("newer than this flexiqd
understands"): its new workers exited 69, again and again, and its `flexiq enqueue`
failed.  Then B is upgraded too, the way a package does it: new programs, the daemon
restarted, its running workers left to run the older code.

Each machine is a systemd sandbox of its own (test_fleet_hosts_systemd.machines); the
tasks (tests/apps/fleet_app.py of each release) record every execution with its host.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

import previous_release
from flexiqd.queue.postgres.schema import SCHEMA_LEVEL, SCHEMA_VERSION

from .conftest import require
from .faults import Load, journal_entries, start_limit_hits
from .flexiqd_install import DAEMON, REPO, unit_text, workers
from .test_fleet_hosts_systemd import fleet_config, machines, read_marks, start_flexiqd, wait

SECONDS = 0.3          # each job's work (one time.sleep)
STEADY = (4, 0.5)      # 4 jobs every 0.5 s: 2.4 slots busy, more than one worker's 2
BURST = 240            # a backlog that makes each machine's pool grow


def upgrade_config(url: str, marks: str, apps) -> str:
    """The fleet test's pool, without its global cap (each machine scales on its own), with
    ``apps`` (the release's own test apps) on the workers' path."""
    text = fleet_config(url, marks).replace(str(REPO / "tests" / "apps"), str(apps))
    return text.replace("    uses: {api: {per_worker: 1}}\n", "").replace(
        "dependencies:\n  api: {capacity: 6, global: true}\n", "")


@pytest.fixture
def two_machines():
    require(previous_release.unavailable_reason(), "the rolling-upgrade test")
    yield from machines(2)


@pytest.fixture
def previous():
    """The previous release, exported and installed into a venv of its own inside the
    checkout (where every sandbox sees it); removed after."""
    tree = Path(tempfile.mkdtemp(prefix="previous-release-", dir=REPO / ".cache"))
    tree.chmod(0o755)
    try:
        previous_release.export(tree)
        previous_release.install(tree)
        yield tree
    finally:
        shutil.rmtree(tree, ignore_errors=True)


class PoolSizes(threading.Thread):
    """The active worker units of each machine, sampled every half second: (when, count)."""

    def __init__(self, sandboxes) -> None:
        super().__init__(name="pool-sizes", daemon=True)
        self.sandboxes = sandboxes
        self.samples: list[list[tuple[float, int]]] = [[] for _ in sandboxes]
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.5):
            for seen, sbx in zip(self.samples, self.sandboxes):
                seen.append((time.time(), len(workers(sbx))))

    def most_since(self, index: int, since: float) -> int:
        return max((n for at, n in self.samples[index] if at >= since), default=0)


def schema_state(server) -> tuple[int, int | None]:
    level = server.admin("SELECT max(version) FROM flexiq_schema", database="flexiq_test")[0][0]
    if server.admin("SELECT to_regclass('flexiq_schema_steps')", database="flexiq_test")[0][0] is None:
        return level, None
    return level, server.admin("SELECT max(step) FROM flexiq_schema_steps", database="flexiq_test")[0][0]


def unavailable_exits(sbx) -> list[str]:
    """Worker units that exited 69 (EX_UNAVAILABLE: the store could not be opened)."""
    return [e["MESSAGE"] for e in journal_entries(sbx, "flexiq-worker@*")
            if "status=69" in e.get("MESSAGE", "")]


def workers_older_than_the_daemon(sbx) -> list[str]:
    """Worker units that became active before the daemon's process started (the monotonic clock)."""
    daemon = int(sbx.unit_property(DAEMON, "ExecMainStartTimestampMonotonic"))
    return [unit for unit in workers(sbx)
            if 0 < int(sbx.unit_property(unit, "ActiveEnterTimestampMonotonic") or 0) < daemon]


def upgrade_in_place(sbx) -> None:
    """A package upgrade: this release's programs in the units, the daemon restarted; the
    running workers go on with the code they started with."""
    sbx.write_file(f"/etc/systemd/system/{DAEMON}", unit_text("flexiqd.service"))
    sbx.write_file("/etc/systemd/system/flexiq-worker@.service", unit_text("flexiq-worker@.service"))
    sbx.systemctl("daemon-reload")
    sbx.systemctl("restart", DAEMON)


def reports(server) -> dict[str, dict]:
    """Each host's last published report."""
    return {name: json.loads(report) for name, report in
            server.admin("SELECT name, report FROM flexiq_hosts", database="flexiq_test")}


def states(server, ids) -> dict[str, int]:
    """Jobs of ``ids`` per state, read with SQL: this process runs no flexiqd code on the store
    (it would move the schema on itself)."""
    rows = server.admin("SELECT state, count(*) FROM flexiq_jobs WHERE id = ANY(%s) GROUP BY state"
                        % ("ARRAY[" + ",".join(map(str, ids)) + "]::bigint[]"), database="flexiq_test")
    return dict(rows)


def all_done(server, ids) -> bool:
    return states(server, ids) == {"done": len(ids)}


def test_a_host_of_the_previous_release_keeps_claiming_and_scaling_after_another_upgraded_the_schema(
        two_machines, previous):
    server, marks, (sbx_a, sbx_b) = two_machines
    server.admin("CREATE DATABASE flexiq_test")
    url = server.store_url()
    name_b = start_flexiqd(sbx_b, upgrade_config(url, str(marks), previous / "tests" / "apps"), marks,
                           tree=previous)
    assert schema_state(server) == (previous_release.PREVIOUS_POSTGRES_SCHEMA, None)
    # The producers are not upgraded yet: the previous release's `flexiq enqueue`, on B.
    count, every = STEADY
    load = Load(sbx_b, url, ((count, SECONDS),), every, program=str(previous / ".venv" / "bin" / "flexiq"))
    sizes = PoolSizes([sbx_a, sbx_b])
    try:
        load.start()
        sizes.start()
        wait(lambda: len(load.enqueues.ids) >= 20, 60, "the steady load under way")
        # The fault: machine A comes up on this release and moves the schema on.
        name_a = start_flexiqd(sbx_a, upgrade_config(url, str(marks), REPO / "tests" / "apps"), marks)
        wait(lambda: schema_state(server) == (SCHEMA_LEVEL, SCHEMA_VERSION), 30, "machine A's schema steps")
        upgraded_at = time.time()
        assert SCHEMA_LEVEL == previous_release.PREVIOUS_POSTGRES_SCHEMA < SCHEMA_VERSION

        # A backlog: each machine's pool grows, B's new workers (the previous release's
        # code) opening the store A moved on.
        assert load.enqueue(BURST, SECONDS)
        wait(lambda: sizes.most_since(0, upgraded_at) > 1 and sizes.most_since(1, upgraded_at) > 1, 60,
             "both machines' pools grown on the backlog")
        backlog = sorted(load.enqueues.ids)
        wait(lambda: all_done(server, backlog), 120, "the backlog done")
        scaled = (sizes.most_since(0, upgraded_at), sizes.most_since(1, upgraded_at))
        # A reports the schema its code knows; B, of the previous release, reports none.
        seen = reports(server)
        assert seen[name_a].get("schema") == {"postgresql": SCHEMA_VERSION}, seen[name_a]
        assert "schema" not in seen[name_b], seen[name_b]

        # Then B is upgraded in place; its workers from before go on with the older code.
        b_upgraded_at = time.time()
        upgrade_in_place(sbx_b)
        assert load.enqueue(BURST // 2, SECONDS)
        backlog = sorted(load.enqueues.ids)
        wait(lambda: all_done(server, backlog), 120, "a backlog after B's upgrade done")
        # B reports its schema only once none of its workers predates its daemon: a contract
        # step must not find the older code still running there.
        older_workers = workers_older_than_the_daemon(sbx_b)
        b_report = reports(server)[name_b].get("schema")
        if older_workers:
            assert b_report is None, (older_workers, b_report)
        else:
            wait(lambda: reports(server)[name_b].get("schema") == {"postgresql": SCHEMA_VERSION}, 20,
                 "B's report of its schema, its older workers gone")
    finally:
        load.stop()
        sizes.halt.set()
        sizes.join()
    ids = sorted(load.enqueues.ids)
    wait(lambda: all_done(server, ids), 120, "every job done")
    finished = time.time()

    starts, ends = read_marks(marks)
    lost = [job_id for job_id in ids if not ends.get(job_id)]
    twice = [job_id for job_id in ids if len(starts.get(job_id, [])) > 1]

    def executed(name: str, since: float, until: float) -> int:
        return sum(1 for job_id in ids for at, host in ends.get(job_id, []) if host == name and since <= at < until)
    by_host_after = {name: executed(name, upgraded_at, b_upgraded_at) for name in (name_a, name_b)}
    b_after_its_upgrade = executed(name_b, b_upgraded_at, finished)
    completions = sorted(at for job_id in ids for at, _ in ends.get(job_id, []))
    gap = max((b - a for a, b in zip(completions, completions[1:]) if a >= upgraded_at - 5), default=0.0)
    exits = {name: unavailable_exits(sbx) for name, sbx in ((name_a, sbx_a), (name_b, sbx_b))}
    limits = {name: start_limit_hits(journal_entries(sbx, "flexiq-worker@*"))
              for name, sbx in ((name_a, sbx_a), (name_b, sbx_b))}
    print(f"rolling upgrade: {len(ids)} jobs; executions after A upgraded the schema (to {SCHEMA_VERSION}, "
          f"level {SCHEMA_LEVEL}), before B's own upgrade: {by_host_after}; most workers since: "
          f"A {scaled[0]}, B {scaled[1]}; lost {len(lost)}, run twice {len(twice)}; longest time without "
          f"a completion {gap:.2f}s; worker exits 69: {sum(map(len, exits.values()))}; "
          f"B after its own upgrade: {b_after_its_upgrade} executions, its workers older than its daemon "
          f"{older_workers}, its report's schema {b_report}; "
          f"enqueue failures {load.enqueues.failed}")
    assert not load.enqueues.failed
    assert not lost, f"jobs lost: {lost[:20]}"
    assert not twice, f"jobs run twice: {[(j, starts[j]) for j in twice[:10]]}"
    assert all(by_host_after.values()), f"a machine stopped claiming: {by_host_after}"
    assert b_after_its_upgrade > 0
    assert scaled[0] > 1 and scaled[1] > 1
    assert not any(exits.values()), exits
    assert not any(limits.values()), limits
