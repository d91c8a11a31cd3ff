"""The roles of docs/security.md, tried on a real systemd and a real bus as each kind of user,
on both stores.

- a job producer (``webapp``, group ``flexiq``) enqueues -- into the SQLite file, or into
  PostgreSQL as a role with the grants ``flexiq producer-grants`` prints -- and may
  neither steer nor read the jobs over D-Bus;
- an operator (``helmsman``, group ``flexiq-admin``) steers and reads the jobs over D-Bus;
- an unrelated user (``stranger``) does neither.

Every probe is a real attempt (an enqueue, a D-Bus call) whose effect is checked: a job
a producer enqueued runs exactly once (counted by the task's own marks), a pause by the
operator shows in the status.  test_security.py tries the file boundaries.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from .flexiqd_install import BIN, CONFIG, DAEMON, STORE, install, marks, workers
from .sandbox import Sandbox
from .sandbox_postgres import DATABASE, PASSWORD, psql, start_postgres

PRODUCER = "webapp"      # group flexiq: may enqueue, nothing more
STEERER = "helmsman"     # group flexiq-admin: may steer and read the jobs over D-Bus
STRANGER = "stranger"    # nothing to do with flexiqd
USERS = ("root", PRODUCER, STEERER, STRANGER)
STEERS = ("root", STEERER)

QUEUE_DIR = "/var/lib/flexiq"
DATABASE_FILE = f"{QUEUE_DIR}/queue.db"
BUSCTL = ["busctl", "--system", "call", "org.flexiq.flexiqd1"]
MANAGER = ["/org/flexiq/flexiqd1", "org.flexiq.flexiqd1.Manager"]
POOL = ["/org/flexiq/flexiqd1/pool/default", "org.flexiq.flexiqd1.Pool"]
# Every member for root and the steering group alone, with arguments that would be valid (or,
# for a schedule no one configured, refused for that reason): a refusal is the access check.
CHECKED_CALLS = {
    "Scale": (MANAGER, ["sud", "default", "1", "5"]),
    "Unpin": (MANAGER, ["s", "default"]),
    "Pause": (MANAGER, ["s", "default"]),
    "Resume": (MANAGER, ["s", "default"]),
    "Drain": (MANAGER, ["s", "default"]),
    "ClearCeiling": (MANAGER, ["s", "default"]),
    "Reload": (MANAGER, []),
    "Jobs": (MANAGER, ["s", "{}"]),
    "Job": (MANAGER, ["t", "1"]),
    "RetryDead": (MANAGER, ["sat", "default", "0"]),
    "PurgeDead": (MANAGER, ["sat", "default", "0"]),
    "RunSchedule": (MANAGER, ["s", "nightly"]),
    "PauseSchedule": (MANAGER, ["s", "nightly"]),
    "ResumeSchedule": (MANAGER, ["s", "nightly"]),
    "Pool.Pause": (POOL, []),
    "Pool.Scale": (POOL, ["ud", "1", "5"]),
}


def as_user(who: str) -> list[str]:
    if who == "root":
        return []
    return ["setpriv", f"--reuid={who}", f"--regid={who}", "--init-groups", "--"]


def call(sbx: Sandbox, who: str, member: str, *args: str, where: list[str] = MANAGER):
    return sbx.run([*as_user(who), *BUSCTL, *where, member.split(".")[-1], *args], check=False)


def refused_by_policy(done) -> bool:
    return done.returncode != 0 and "Access denied" in done.stderr


def paused(sbx: Sandbox) -> bool:
    status = json.loads(sbx.run([str(BIN / "flexiqctl"), "status", "--json"]).stdout)
    return status["pools"]["default"]["paused"]


def executions_of(sbx: Sandbox, job_ids: list[int]) -> list[tuple[int, int]]:
    """(starts, ends) of each job, as its task marked them."""
    starts, ends = marks(sbx)
    return [(starts[job_id], ends[job_id]) for job_id in job_ids]


def run_once(sbx: Sandbox, job_ids: list[int], what: str) -> None:
    sbx.wait_for(lambda: all(ended for _, ended in executions_of(sbx, job_ids)), 60, what=what)
    assert executions_of(sbx, job_ids) == [(1, 1)] * len(job_ids)


@pytest.fixture(scope="module")
def roles(sandbox: Sandbox) -> Sandbox:
    install(sandbox)
    sandbox.wait_for(lambda: workers(sandbox), 30, what="the first worker")
    sandbox.run(f"getent passwd {PRODUCER} >/dev/null || useradd --no-create-home --groups flexiq {PRODUCER}; "
                f"getent passwd {STEERER} >/dev/null || useradd --no-create-home --groups flexiq-admin {STEERER}; "
                f"getent passwd {STRANGER} >/dev/null || useradd --no-create-home {STRANGER}")
    yield sandbox
    sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*' 'flexiq-test-producer*'; true", timeout=120)


# -- SQLite: the file ---------------------------------------------------------------------------

@pytest.mark.parametrize("who", USERS)
def test_only_root_and_producers_enqueue_into_the_sqlite_store_and_their_jobs_run_once(roles, who):
    # No --url: the store comes from the daemon's config, as a producer's script would use it.
    done = roles.run([*as_user(who), str(BIN / "flexiq"), "enqueue", "count", "0.1", "--count", "3"], check=False)
    assert (done.returncode == 0) is (who in ("root", PRODUCER)), done.stderr
    if done.returncode != 0:
        assert "queue.db" in done.stderr and "Traceback" not in done.stderr
        return
    first, last = (int(n) for n in done.stdout.split("ids ")[1].split(".."))
    ids = list(range(first, last + 1))
    run_once(roles, ids, f"jobs {ids} to run")


def test_a_store_a_producer_opened_first_stays_writable_for_the_daemon_and_the_workers(roles):
    """SQLite makes the -wal and -shm files as whoever opens the database first.  In the
    set-group-ID queue folder they join group flexiq, so the daemon and the workers, who
    open it after a producer, can still write them."""
    roles.run(f"systemctl stop {DAEMON} 'flexiq-worker@*'", timeout=120)
    # Nothing has the database open now: fold the log in and remove it, as after a reboot.
    roles.run([str(BIN / "python"), "-c", textwrap.dedent(f"""
        import sqlite3
        conn = sqlite3.connect({DATABASE_FILE!r})
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
    """)])
    roles.run(f"rm -f {DATABASE_FILE}-wal {DATABASE_FILE}-shm")
    hold = textwrap.dedent(f"""
        import sys, time
        from flexiqd.queue import NewJob, open_backend
        backend = open_backend("{STORE}")
        ids = backend.enqueue([NewJob(task="count", payload={{"args": [0.1], "kwargs": {{}}}})] * 5, now=time.time())
        print(*ids, flush=True)
        time.sleep(600)  # holds the database, and the -wal and -shm it made, open
    """)
    roles.run(["systemd-run", "--unit=flexiq-test-producer", f"--uid={PRODUCER}", "-p", "UMask=0022",
               "-p", "StandardOutput=file:/run/flexiq-test-producer.out", str(BIN / "python"), "-c", hold])
    try:
        # systemd-run returns once the producer is forked, before its output file is opened: a
        # file not there yet is read as nothing printed yet.
        printed = "cat /run/flexiq-test-producer.out 2>/dev/null; true"
        ids = roles.wait_for(lambda: [int(n) for n in roles.run(printed).stdout.split()],
                             30, what="the producer's enqueue")
        owners = roles.run(["stat", "-c", "%U:%G %a", f"{DATABASE_FILE}-wal", f"{DATABASE_FILE}-shm"]).stdout
        assert owners.split("\n")[:2] == [f"{PRODUCER}:flexiq 660"] * 2, owners
        roles.systemctl("start", DAEMON)
        run_once(roles, ids, "the producer's jobs to run once the daemon is back")
    finally:
        roles.run("systemctl stop flexiq-test-producer; rm -f /run/flexiq-test-producer.out; true")
        roles.systemctl("start", DAEMON)  # the tests after this one need it, whatever happened here


# -- D-Bus: steering and the jobs ---------------------------------------------------------------

@pytest.mark.parametrize("who", USERS)
def test_only_root_and_the_steering_group_may_call_a_steering_member(roles, who):
    for member, (where, args) in CHECKED_CALLS.items():
        done = call(roles, who, member, *args, where=where)
        if who in STEERS:
            assert not refused_by_policy(done), f"{member}: {done.stderr}"
        else:
            assert refused_by_policy(done), f"{member} was not refused to {who}: {done.stdout} {done.stderr}"
    roles.run([str(BIN / "flexiqctl"), "resume", "default"])  # whatever a call above left
    roles.run([str(BIN / "flexiqctl"), "unpin", "default"])


@pytest.mark.parametrize("who", USERS)
def test_only_root_and_the_steering_group_pause_a_pool_with_flexiqctl(roles, who):
    try:
        done = roles.run([*as_user(who), str(BIN / "flexiqctl"), "pause", "default"], check=False)
        assert paused(roles) is (who in STEERS), done.stderr
        if who not in STEERS:
            assert done.returncode == 1 and "member of the flexiq-admin group" in done.stderr
    finally:
        roles.run([str(BIN / "flexiqctl"), "resume", "default"])


@pytest.mark.parametrize("who", USERS)
def test_only_root_and_the_steering_group_read_a_jobs_arguments_over_d_bus(roles, who):
    secret = f"argument-of-a-producer-for-{who}"
    # Delayed: it stays in the store with its argument while the test looks.
    job_id = roles.run([*as_user(PRODUCER), str(BIN / "flexiq"), "enqueue", "count", json.dumps(secret),
                        "--delay", "1h"]).stdout.strip()
    job = call(roles, who, "Job", "t", job_id)
    jobs = call(roles, who, "Jobs", "s", "{}")
    if who in STEERS:
        assert job.returncode == 0 and secret in job.stdout, job.stderr
        assert jobs.returncode == 0 and f'\\"id\\": {job_id},' in jobs.stdout, jobs.stdout + jobs.stderr
    else:
        assert refused_by_policy(job) and refused_by_policy(jobs), job.stderr + jobs.stderr
        # Nor through what everyone may read.
        for member, args in (("Status", []), ("Events", ["t", "0"])):
            public = call(roles, who, member, *args)
            assert public.returncode == 0 and secret not in public.stdout


def test_everyone_reads_the_status(roles):
    for who in USERS:
        done = roles.run([*as_user(who), str(BIN / "flexiqctl"), "status"], check=False)
        assert done.returncode == 0 and "default" in done.stdout, f"{who}: {done.stderr}"


# -- PostgreSQL: a role of its own --------------------------------------------------------------

PG_SECRET = "/etc/flexiqd/db.password"          # the daemon's and workers' (root's alone)
PRODUCER_SECRET = "/etc/flexiqd/webapp.password"  # the producer's own, readable by it alone
PRODUCER_PASSWORD = "producer-s3cret"
PG_STORE = f"postgresql://flexiq@127.0.0.1:5432/{DATABASE}?password_credential=flexiq-db"
PRODUCER_URL = f"postgresql://web@127.0.0.1:5432/{DATABASE}?password_file={PRODUCER_SECRET}"


@pytest.fixture(scope="module")
def postgres_roles(roles: Sandbox) -> Sandbox:
    sbx = roles
    start_postgres(sbx)
    sbx.write_file(PG_SECRET, PASSWORD + "\n", mode=0o600)
    config = (CONFIG.replace(f"store: {STORE}", f"store: '{PG_STORE}'")
              + f"    credentials: {{flexiq-db: {PG_SECRET}}}\n")
    install(sbx, config, daemon_dropin=f"[Service]\nLoadCredential=flexiq-db:{PG_SECRET}\n")
    sbx.wait_for(lambda: workers(sbx), 30, what="the minimum worker on PostgreSQL")
    psql(sbx, "DROP ROLE IF EXISTS web")
    psql(sbx, f"CREATE ROLE web LOGIN PASSWORD '{PRODUCER_PASSWORD}'")
    grants = sbx.run([str(BIN / "flexiq"), "producer-grants", "web"]).stdout
    sbx.run(["runuser", "-u", "postgres", "--", "psql", "-q", "-v", "ON_ERROR_STOP=1", "-d", DATABASE],
            input=grants)
    sbx.write_file(PRODUCER_SECRET, PRODUCER_PASSWORD + "\n", mode=0o600)
    sbx.run(["chown", PRODUCER, PRODUCER_SECRET])
    yield sbx
    sbx.run(f"systemctl stop {DAEMON} 'flexiq-worker@*'; true", timeout=120)


def as_producer_on_postgres(sbx: Sandbox, *argv: str):
    return sbx.run([*as_user(PRODUCER), str(BIN / "flexiq"), "--url", PRODUCER_URL, *argv], check=False)


def test_a_producer_role_enqueues_into_postgresql_and_its_jobs_run_once(postgres_roles):
    sbx = postgres_roles
    done = as_producer_on_postgres(sbx, "enqueue", "count", "0.1", "--count", "4")
    assert done.returncode == 0, done.stderr
    first, last = (int(n) for n in done.stdout.split("ids ")[1].split(".."))
    ids = list(range(first, last + 1))
    run_once(sbx, ids, f"jobs {ids} to run")
    # The operator reads them over D-Bus (the daemon reads as the store's owner); the producer may not.
    jobs = call(sbx, STEERER, "Jobs", "s", "{}")
    assert jobs.returncode == 0 and str(first) in jobs.stdout, jobs.stderr
    assert refused_by_policy(call(sbx, PRODUCER, "Jobs", "s", "{}"))


def test_a_producer_role_cannot_read_claim_cancel_or_purge_on_postgresql(postgres_roles):
    sbx = postgres_roles
    job_id = as_producer_on_postgres(sbx, "enqueue", "count", "0", "--delay", "1h").stdout.strip()
    assert job_id.isdigit()
    for argv in (["jobs", "list"], ["jobs", "show", job_id], ["jobs", "cancel", job_id],
                 ["dead-letter", "list"], ["dead-letter", "retry"], ["dead-letter", "purge"], ["stats"]):
        done = as_producer_on_postgres(sbx, *argv)
        assert done.returncode == 1 and "permission denied" in done.stderr, f"{argv}: {done.stdout} {done.stderr}"
        assert PRODUCER_PASSWORD not in done.stderr and "Traceback" not in done.stderr
    claim = sbx.run([*as_user(PRODUCER), str(BIN / "python"), "-c", textwrap.dedent(f"""
        import time
        from flexiqd.queue import ClaimRequest, open_backend
        open_backend({PRODUCER_URL!r}).claim(ClaimRequest("intruder", ("default",), 1), now=time.time() + 7200)
    """)], check=False)
    assert claim.returncode != 0 and "permission denied" in claim.stderr, claim.stderr
    # The job is still there, waiting, for the owner.
    shown = json.loads(sbx.run([str(BIN / "flexiq"), "--url",
                                f"postgresql://flexiq@127.0.0.1:5432/{DATABASE}?password_file={PG_SECRET}",
                                "jobs", "show", job_id, "--json"]).stdout)
    assert shown["state"] == "queued"


# -- upgrading: the package's first creation of the steering group ---------------------------------

POSTINST = BIN.parents[1] / "debian" / "flexiqd.postinst"


def test_the_first_creation_of_flexiq_admin_adds_group_flexiqs_members_to_it_once(roles):
    """An upgrade from a version where group flexiq steered: its members keep steering, and a
    member taken out afterwards is not put back by a later upgrade."""
    sbx = roles
    before = sbx.run("getent group flexiq-admin | cut -d: -f4").stdout.strip()
    # The package's postinst, with what debhelper puts in its place: sysusers.d creating the groups.
    sbx.write_file("/run/flexiqd-postinst", POSTINST.read_text().replace(
        "#DEBHELPER#", "systemd-sysusers /etc/sysusers.d/flexiqd.conf"), mode=0o755)
    try:
        sbx.run("groupdel flexiq-admin; "
                "getent passwd oldop >/dev/null || useradd --no-create-home --groups flexiq oldop; "
                "getent passwd oldweb >/dev/null || useradd --no-create-home --groups flexiq oldweb")
        upgraded = sbx.run(["/run/flexiqd-postinst", "configure", "0.1.0"])
        for user in ("oldop", "oldweb"):
            assert "flexiq-admin" in sbx.run(["id", "-nG", user]).stdout.split(), user
            assert user in upgraded.stderr
        assert "gpasswd -d USER flexiq-admin" in upgraded.stderr
        sbx.run(["gpasswd", "-d", "oldweb", "flexiq-admin"])
        again = sbx.run(["/run/flexiqd-postinst", "configure", "0.1.0"])
        assert "flexiq-admin" not in sbx.run(["id", "-nG", "oldweb"]).stdout.split()
        assert "flexiq-admin" in sbx.run(["id", "-nG", "oldop"]).stdout.split()
        assert "flexiq-admin" not in again.stderr
    finally:
        # The group as it was, and the bus policy resolving its new gid.
        sbx.run("getent group flexiq-admin >/dev/null || groupadd --system flexiq-admin; "
                f"gpasswd -M '{before}' flexiq-admin; userdel oldop; userdel oldweb; "
                "rm -f /run/flexiqd-postinst; systemctl reload dbus", check=False)
    assert sbx.run("getent group flexiq-admin | cut -d: -f4").stdout.strip() == before
