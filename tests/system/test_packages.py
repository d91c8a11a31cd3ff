"""The packages as a user gets them: the .deb in a clean Debian bookworm, the .rpm in the sandbox.

The .deb's tests are one story, run in file order on one booted machine:
install (only Debian packages come along) -> the daemon runs and answers
flexiqctl -> a burst scales the pool up and runs every job once -> an upgrade
keeps the config edit, the queued jobs and the running workers -> remove drains
the fleet and keeps the queue -> purge removes config and state.  Each test
starts from where the previous one left the machine; a failure early on makes
the later ones fail too, which is the truth (nothing after a broken install can
work).

The machine is a minimal bookworm made by mmdebstrap (cached under .cache/,
about 30 s the first time) booted with a tmpfs overlay, so every run starts
clean.  apt inside fetches the dependencies from the Debian mirror this machine
uses.  The .rpm (built with Debian's rpmbuild, so with Debian's Python paths)
is installed with ``rpm -i --nodeps`` into a sandbox of this machine's own root,
which has the Python dependencies from Debian.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from .conftest import require
from .debian_rootfs import (PACKAGES_INSIDE, REPO, DebianMachine, build_deb, build_rpm, cached_rootfs, cockpit_deb,
                            lintian, unavailable_reason)
from .sandbox import Sandbox

pytestmark = pytest.mark.slow

UPGRADE_VERSION = "0.1.0+test1"
DAEMON = "flexiqd.service"
CONFIG = "/etc/flexiqd/flexiqd.yaml"
STATE = "/var/lib/flexiq"
DAEMON_STATE = "/var/lib/flexiqd"
WORKER_HOME = "/var/lib/flexiq-worker"
QUEUE_DB = f"{STATE}/queue.db"
# One query of the store: every job with its state, attempts and recorded executions.
JOBS_QUERY = f"""python3 - <<'EOF'
import json, sqlite3
db = sqlite3.connect("{QUEUE_DB}")
rows = db.execute("SELECT j.id, j.task, j.state, j.attempts, j.run_at,"
                  " (SELECT count(*) FROM executions e WHERE e.job_id = j.id),"
                  " (SELECT group_concat(DISTINCT e.worker) FROM executions e WHERE e.job_id = j.id)"
                  " FROM jobs j ORDER BY j.id").fetchall()
print(json.dumps([dict(zip(("id", "task", "state", "attempts", "run_at", "executions", "workers"), r))
                  for r in rows]))
EOF"""


def _require_machine() -> None:
    require(unavailable_reason(), "the package tests")


@dataclass(frozen=True)
class Packages:
    dir: Path        # on the host; /srv/flexiq-packages inside the Debian machine
    deb: Path
    upgrade_deb: Path

    def inside(self, package: Path) -> str:
        return f"{PACKAGES_INSIDE}/{package.relative_to(self.dir)}"


@pytest.fixture(scope="module")
def packages(release_deb: Path) -> Iterator[Packages]:
    _require_machine()
    # The session's build (conftest.release_deb), and beside it the same tree as a newer version.
    out = release_deb.parent.parent
    try:
        upgrade = build_deb(out / "upgrade", version=UPGRADE_VERSION, check=False)
        yield Packages(out, release_deb, upgrade)
    finally:
        shutil.rmtree(out / "upgrade", ignore_errors=True)


@pytest.fixture(scope="module")
def debian(packages: Packages) -> Iterator[DebianMachine]:
    machine = DebianMachine(cached_rootfs(), binds=[(packages.dir, PACKAGES_INSIDE)])
    with machine:
        machine.apt("update")
        yield machine


# -- helpers ---------------------------------------------------------------------------------------

def jobs(machine: Sandbox) -> list[dict]:
    return json.loads(machine.run(JOBS_QUERY).stdout)


def active_workers(machine: Sandbox) -> list[str]:
    out = machine.run(["systemctl", "list-units", "--plain", "--no-legend", "--state=active",
                       "flexiq-worker@*.service"]).stdout
    return sorted(line.split()[0] for line in out.splitlines() if line.strip())


def live_worker_units(machine: Sandbox) -> list[str]:
    """Worker units in any state but inactive/failed (running, starting, stopping)."""
    out = machine.run(["systemctl", "list-units", "--all", "--plain", "--no-legend",
                       "flexiq-worker@*.service"]).stdout
    return sorted(line.split()[0] for line in out.splitlines()
                  if line.strip() and line.split()[2] not in ("inactive", "failed"))


def daemon_log(machine: Sandbox) -> str:
    return machine.run(f"journalctl --no-pager -n 40 -u {DAEMON}", check=False).stdout


def is_active(machine: Sandbox, unit: str) -> bool:
    return machine.systemctl("is-active", unit, check=False).stdout.strip() == "active"


def installed_version(machine: Sandbox) -> str:
    return machine.run("dpkg-query -W -f='${Status} ${Version}' flexiqd 2>/dev/null || true").stdout.strip()


def status_text(machine: Sandbox, user: str | None = None) -> str:
    """``flexiqctl status``, polled until the daemon answers on the bus."""
    command = ["flexiqctl", "status"] if user is None else ["runuser", "-u", user, "--", "flexiqctl", "status"]

    def answer() -> str | None:
        done = machine.run(command, check=False)
        return done.stdout if done.returncode == 0 else None

    return machine.wait_for(answer, 30, what=f"flexiqctl status ({user or 'root'}) to answer")


# -- the source of the version -----------------------------------------------------------------

def test_every_package_carries_the_version_of_the_code():
    from flexiqd import __version__

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    changelog = re.match(r"flexiqd \(([^)]+)\)", (REPO / "debian" / "changelog").read_text())[1]
    spec = re.search(r"^Version:\s*(\S+)", (REPO / "packaging" / "rpm" / "flexiqd.spec").read_text(), re.M)[1]
    assert pyproject == __version__ == spec == changelog.split("-")[0]


# -- the .deb in a clean Debian ----------------------------------------------------------------

def test_the_deb_is_lintian_clean(packages: Packages):
    changes = next(packages.deb.parent.glob("*.changes"))
    done = lintian(changes)
    # N: explains an override, O: an override, M: a tag masked by lintian itself.
    tags = [line for line in done.stdout.splitlines() if line[:2] not in ("N:", "O:", "M:")]
    assert done.returncode == 0 and not tags, done.stdout + done.stderr


def test_install_pulls_only_debian_packages_and_starts_the_daemon(debian: DebianMachine, packages: Packages):
    deb = packages.inside(packages.deb)
    planned = debian.run(["apt-get", "install", "-s", deb]).stdout
    installs = re.findall(r"^Inst (\S+) \((\S+) ([^)]*)\)", planned, re.M)
    assert ("flexiqd", "0.1.0") in [(name, version) for name, version, _ in installs]
    foreign = [(name, origin) for name, _version, origin in installs
               if name != "flexiqd" and not origin.startswith("Debian")]
    assert not foreign, f"packages from outside Debian: {foreign}"

    # No web console comes with the daemon: the Cockpit page is flexiqd-cockpit's.
    planned_names = {name for name, _version, _origin in installs}
    assert not planned_names & {"cockpit", "cockpit-ws", "cockpit-bridge", "libjs-dygraphs"}, planned_names
    debian.apt("install", deb)
    # The documentation the man pages and the config cite, readable where they say.
    for page in ("applications.md", "postgresql.md", "guarantees.md", "security.md", "README.md"):
        debian.run(["test", "-f", f"/usr/share/doc/flexiqd/{page}"])
    assert "/usr/share/doc/flexiqd/NAME.md" in debian.run("zcat /usr/share/man/man8/flexiqd.8.gz").stdout

    assert installed_version(debian) == "install ok installed 0.1.0"
    # Nothing from PyPI: no pip, nothing in /usr/local.
    assert debian.run("dpkg-query -W python3-pip 2>/dev/null", check=False).returncode != 0
    assert debian.run("find /usr/local -name '*.py' | head -1").stdout == ""
    debian.wait_for(lambda: is_active(debian, DAEMON), 30, what="flexiqd.service to be active")
    assert debian.systemctl("is-enabled", DAEMON).stdout.strip() == "enabled"
    # The template is never enabled; flexiqd starts its instances.
    assert debian.systemctl("is-enabled", "flexiq-worker@.service", check=False).stdout.strip() == "static"
    assert debian.run(["getent", "passwd", "flexiq"]).stdout.startswith("flexiq:")
    assert debian.run(["getent", "group", "flexiq"]).stdout.startswith("flexiq:")
    assert debian.run(["getent", "group", "flexiq-admin"]).stdout.startswith("flexiq-admin:")
    assert debian.run(["stat", "-c", "%U:%G %a", STATE]).stdout.split() == ["flexiq:flexiq", "3770"]
    assert debian.run(["stat", "-c", "%U %a", DAEMON_STATE]).stdout.split() == ["root", "700"]
    conffiles = debian.run(["dpkg-query", "-W", "-f=${Conffiles}", "flexiqd"]).stdout
    assert CONFIG in conffiles
    debian.run(["test", "-f", "/usr/share/dbus-1/system.d/org.flexiq.flexiqd1.conf"])
    debian.run("test -f /usr/lib/sysusers.d/flexiqd.conf && test -f /usr/lib/tmpfiles.d/flexiqd.conf")
    for page in ("man1/flexiq.1.gz", "man1/flexiqctl.1.gz", "man5/flexiqd.yaml.5.gz", "man8/flexiqd.8.gz"):
        debian.run(["test", "-f", f"/usr/share/man/{page}"])
    debian.wait_for(lambda: active_workers(debian), 30, what="the minimum worker")


def test_the_cockpit_page_and_its_chart_library_links_are_installed(debian: DebianMachine, packages: Packages):
    page = "/usr/share/cockpit/flexiqd"
    debian.run(["test", "!", "-e", page])   # not with the daemon alone
    # Its own package, without the web server it recommends: the bridge and the chart library
    # come as its dependencies (docs/cockpit.md).
    debian.apt("install", "--no-install-recommends", packages.inside(cockpit_deb(packages.deb)))
    # The links must resolve: libjs-dygraphs came along as a dependency.
    debian.run(["python3", "-m", "json.tool", f"{page}/manifest.json"])
    # Every file of cockpit/: the page's ES modules are loaded by name, one missing breaks the page.
    names = sorted(path.name for path in (REPO / "cockpit").iterdir() if path.is_file())
    assert "flexiqd.js" in names and "schedules.js" in names, names
    for name in names:
        debian.run(["test", "-f", f"{page}/{name}", "-a", "!", "-L", f"{page}/{name}"])
    for name in ("dygraph.min.js", "dygraph.min.css"):
        target = debian.run(["readlink", "-e", f"{page}/{name}"]).stdout.strip()
        assert target == f"/usr/share/javascript/dygraphs/{name}", target


def test_the_replay_harness_is_not_shipped(debian: DebianMachine):
    # The systemd-nspawn replay harness lives in the checkout's bench/ (docs/replay.md).
    shipped = debian.run(["dpkg-query", "-L", "flexiqd"]).stdout.split()
    assert not [path for path in shipped if "replay_machine" in path or "replay_driver" in path], shipped
    trace = next(path for path in shipped if path.endswith("/flexiqd/sim/traces/steady.json"))
    out = debian.run(["flexiq", "bench", "replay", "--trace", trace], check=False)
    assert out.returncode == 69 and "needs a source checkout of flexiqd" in out.stderr, out


def test_the_units_exposure_is_no_worse_than_documented(debian: DebianMachine):
    # docs/packaging.md records these; a unit that loosens its sandboxing fails here.
    recorded = {DAEMON: 1.6, "flexiq-worker@default-1.service": 1.1}
    debian.wait_for(lambda: "flexiq-worker@default-1.service" in active_workers(debian), 30,
                    what="the first worker")
    for unit, most in recorded.items():
        text = debian.run(["systemd-analyze", "security", "--no-pager", unit]).stdout
        exposure = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", text)[1])
        assert exposure <= most, f"{unit}: exposure {exposure} > {most} recorded in docs/packaging.md\n{text}"


def test_flexiqctl_shows_the_default_pool_to_root_and_to_everyone(debian: DebianMachine):
    text = status_text(debian)
    assert "pool default" in text and "workers" in text, text
    # The D-Bus policy lets any user read the status.
    assert "pool default" in status_text(debian, user="nobody")


BURST = 200


def test_a_burst_scales_the_pool_up_and_runs_every_job_exactly_once(debian: DebianMachine):
    # 200 s of work: one worker of 4 slots would keep the last job waiting ~50 s, past the
    # shipped 30 s age target, so the pool must grow (40 jobs fit in one worker's target).
    debian.run(["flexiq", "enqueue", "flexiqd.demo.sleep", "1", "--count", str(BURST)])
    most = 0

    def all_done() -> bool:
        nonlocal most
        most = max(most, len(active_workers(debian)))
        done = json.loads(debian.run(["flexiq", "jobs", "list", "--state", "done", "--limit", "1000",
                                      "--json"]).stdout)
        return len(done) == BURST

    debian.wait_for(all_done, 180, interval=0.5, what=f"all {BURST} jobs to be done")
    assert most > 1, f"the pool never grew past {most} worker(s):\n{daemon_log(debian)}"
    burst = [job for job in jobs(debian) if job["task"] == "flexiqd.demo.sleep"]
    assert len(burst) == BURST
    assert [job for job in burst if (job["state"], job["attempts"], job["executions"]) != ("done", 1, 1)] == []
    assert len({job["workers"] for job in burst}) > 1, "every job ran on the same worker"
    shown = json.loads(debian.run(["flexiq", "jobs", "show", str(burst[0]["id"]), "--json"]).stdout)
    assert (shown["state"], shown["attempts"]) == ("done", 1)


def test_an_upgrade_keeps_the_config_edit_the_queued_jobs_and_the_workers(debian: DebianMachine,
                                                                           packages: Packages):
    # A local edit of the conffile, applied with a reload.
    debian.run(["sed", "-i", "s/^    max_workers: 10$/    max_workers: 7/", CONFIG])
    debian.run(["grep", "-q", "^    max_workers: 7$", CONFIG])
    debian.systemctl("reload", DAEMON)
    debian.wait_for(lambda: "max 7" in status_text(debian), 30, what="the reloaded config in the status")
    # Jobs that wait in the queue across the upgrade.
    debian.run(["flexiq", "enqueue", "flexiqd.demo.sleep", "0.1", "--count", "5", "--delay", "1h"])
    queued = sorted(job["id"] for job in jobs(debian) if job["state"] == "queued")
    assert len(queued) == 5
    daemon_pid = debian.unit_property(DAEMON, "MainPID")
    fleet = {unit: debian.unit_property(unit, "MainPID") for unit in active_workers(debian)}
    assert fleet

    debian.apt("install", "--no-install-recommends", packages.inside(packages.upgrade_deb),
               packages.inside(cockpit_deb(packages.upgrade_deb)))

    assert installed_version(debian) == f"install ok installed {UPGRADE_VERSION}"
    debian.run(["grep", "-q", "^    max_workers: 7$", CONFIG])
    assert debian.run("ls /etc/flexiqd").stdout.split() == ["flexiqd.yaml"], "dpkg left a .dpkg-* copy"
    debian.wait_for(lambda: is_active(debian, DAEMON), 30, what="flexiqd to be active after the upgrade")
    assert debian.unit_property(DAEMON, "MainPID") != daemon_pid, "the upgrade did not restart flexiqd"
    assert "max 7" in status_text(debian)
    assert sorted(job["id"] for job in jobs(debian) if job["state"] == "queued") == queued
    # A restart is not a stop: the workers ran on, untouched, and the new daemon adopted them.
    # (It may scale some in, as a fresh daemon would: stopped is fine, restarted is not.)
    after = {unit: debian.unit_property(unit, "MainPID") for unit in fleet}
    assert all(after[unit] in (pid, "0") for unit, pid in fleet.items()), (fleet, after)
    assert any(after[unit] == pid for unit, pid in fleet.items()), (fleet, after)


def test_remove_drains_the_fleet_and_keeps_the_queue(debian: DebianMachine):
    # Work in flight when the package goes: it must finish (or go back to the queue), not vanish.
    debian.run(["flexiq", "enqueue", "flexiqd.demo.sleep", "3", "--count", "4"])
    debian.wait_for(lambda: any(job["state"] == "running" for job in jobs(debian)), 30,
                    what="a job to be running")

    debian.apt("remove", "flexiqd")

    assert live_worker_units(debian) == []
    assert not is_active(debian, DAEMON)
    debian.run(["test", "-f", QUEUE_DB])
    debian.run(["test", "-f", CONFIG])
    debian.run(["test", "-f", f"{DAEMON_STATE}/events.jsonl"])
    after = jobs(debian)
    assert [job["id"] for job in after if job["state"] == "running"] == []
    assert sum(job["state"] == "queued" for job in after) >= 5  # the delayed ones, at least
    assert all(job["executions"] <= 1 for job in after)
    assert installed_version(debian).startswith("deinstall ok config-files")


def test_purge_removes_the_config_and_the_state(debian: DebianMachine):
    debian.apt("purge", "flexiqd")
    debian.run(["test", "!", "-e", "/etc/flexiqd"])
    for folder in (STATE, DAEMON_STATE, WORKER_HOME):
        debian.run(["test", "!", "-e", folder])
    assert installed_version(debian) == ""
    assert debian.systemctl("is-enabled", DAEMON, check=False).returncode != 0


# -- the .rpm in the sandbox ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def rpm_package() -> Iterator[Path]:
    _require_machine()
    out = Path(tempfile.mkdtemp(prefix="flexiq-rpm-", dir="/var/tmp"))
    try:
        yield build_rpm(out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_the_rpm_installs_runs_a_job_and_erases(rpm_package: Path):
    # A sandbox of its own: the session's shared one runs other tests' flexiqd.service.
    with Sandbox() as sbx:
        sbx.run(["rpm", "-i", "--nodeps", str(rpm_package)])
        flags = sbx.run(["rpm", "-q", "--qf", "[%{FILEFLAGS:fflags} %{FILENAMES}\n]", "flexiqd"]).stdout
        assert f"cn {CONFIG}" in flags.splitlines()
        assert "/usr/share/doc/flexiqd/postgresql.md" in flags and "/usr/share/cockpit" not in flags
        cockpit = sbx.run(["rpm", "-qlp", str(next(rpm_package.parent.glob("flexiqd-cockpit-*.rpm")))]).stdout
        assert "/usr/share/cockpit/flexiqd/manifest.json" in cockpit.split()
        assert sbx.run(["getent", "passwd", "flexiq"]).stdout.startswith("flexiq:")
        sbx.run(["test", "-d", STATE])
        sbx.systemctl("daemon-reload")
        sbx.systemctl("enable", "--now", DAEMON)
        sbx.wait_for(lambda: is_active(sbx, DAEMON), 30, what="flexiqd.service to be active")
        sbx.run(["/usr/bin/flexiq", "enqueue", "flexiqd.demo.sleep", "0.2", "--count", "3"])
        sbx.wait_for(lambda: sum(job["state"] == "done" for job in jobs(sbx)) == 3, 60,
                     what="three jobs to be done")
        assert all((job["attempts"], job["executions"]) == (1, 1) for job in jobs(sbx))

        sbx.run(["rpm", "-e", "flexiqd"])
        assert live_worker_units(sbx) == []
        assert not is_active(sbx, DAEMON)
        sbx.run(["test", "-f", QUEUE_DB])
