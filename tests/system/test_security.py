"""The privilege boundaries of docs/security.md, tried on a real system as each kind of user.

Four users try every boundary inside the sandbox: root (who may do everything: it
proves each probe can succeed), a member of group ``flexiq`` (a job producer: it may
write the queue), a member of the steering group ``flexiq-admin`` and an unrelated user.
A probe is a real attempt -- open for writing, create a file, read -- never a look at
mode bits, so a test fails when the boundary is open, whatever made it so.  Steering
over D-Bus as flexiqctl does is covered in test_flexiqctl_systemd.py; here the bus is
called directly, member by member; test_roles_systemd.py tries every steering member
and the job reads as each role, on both stores.
"""

from __future__ import annotations

import hashlib
import json
import shlex

import pytest

from .flexiqd_install import BIN, CONFIG, DAEMON, MARKS, flexiq, install, workers
from .sandbox import Sandbox

MEMBER = "steward"       # in group flexiq: may enqueue (the group that can write the most)
STEERER = "pilot"        # in group flexiq-admin: may steer over D-Bus
OUTSIDER = "outsider"    # nothing to do with flexiqd
USERS = ("root", MEMBER, STEERER, OUTSIDER)

WORKER = "flexiq-worker@default-1.service"
RUN_DIR = "/run/flexiqd"
APPLIED = f"{RUN_DIR}/applied.yaml"
PAUSED = f"{RUN_DIR}/paused.json"
DAEMON_STATE = "/var/lib/flexiqd"
QUEUE_DIR = "/var/lib/flexiq"
DROPINS = "/run/systemd/system"
CONFIG_DIR = "/etc/flexiqd"
CONFIG_FILE = f"{CONFIG_DIR}/flexiqd.yaml"

def as_user(who: str) -> list[str]:
    if who == "root":
        return []
    return ["setpriv", f"--reuid={who}", f"--regid={who}", "--init-groups", "--"]


def attempt(sbx: Sandbox, who: str, script: str, *args: str) -> bool:
    """Run a shell snippet as ``who``; True when it succeeded."""
    return sbx.run([*as_user(who), "sh", "-c", script, "sh", *args], check=False).returncode == 0


def can_open_for_writing(sbx: Sandbox, who: str, path: str) -> bool:
    """Open an existing file for appending and write nothing: a real attempt that changes nothing."""
    sbx.run(["test", "-f", path])
    return attempt(sbx, who, ': >> "$1"', path)


def can_create_in(sbx: Sandbox, who: str, directory: str) -> bool:
    """Create (and remove again) a file in ``directory``."""
    probe = f"{directory}/.probe-{who}"
    made = attempt(sbx, who, ': > "$1"', probe)
    sbx.run(["rm", "-f", probe])
    return made


def can_read(sbx: Sandbox, who: str, path: str) -> bool:
    sbx.run(["test", "-e", path])
    return attempt(sbx, who, 'cat "$1" >/dev/null', path)


def worker_environ(sbx: Sandbox, unit: str) -> dict[str, str]:
    pid = sbx.unit_property(unit, "MainPID")
    raw = sbx.run(["cat", f"/proc/{pid}/environ"]).stdout
    return dict(entry.split("=", 1) for entry in raw.split("\0") if "=" in entry)


def apply_config(sbx: Sandbox, text: str) -> str | None:
    """Write and reload a config; None once flexiqd applied it, else why it was rejected."""
    sbx.write_file(CONFIG_FILE, text)
    # flexiqctl reload waits for the daemon's verdict on this very reload.
    done = sbx.run([str(BIN / "flexiqctl"), "reload"], check=False)
    return None if done.returncode == 0 else done.stderr.strip()


def pool_config(name: str, body: str) -> str:
    """``CONFIG`` (the default pool) plus one more pool."""
    lines = [f"  {name}:", *(f"    {line}" for line in body.strip().splitlines())]
    return CONFIG.rstrip("\n") + "\n" + "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def flexiqd(sandbox: Sandbox) -> Sandbox:
    install(sandbox)
    sandbox.wait_for(lambda: WORKER in workers(sandbox), 30, what="the first worker")
    sandbox.run(f"getent passwd {MEMBER} >/dev/null || useradd --no-create-home --groups flexiq {MEMBER}; "
                f"getent passwd {STEERER} >/dev/null || useradd --no-create-home --groups flexiq-admin {STEERER}; "
                f"getent passwd {OUTSIDER} >/dev/null || useradd --no-create-home {OUTSIDER}")
    yield sandbox
    sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*'; true", timeout=120)


# -- what a worker loads ------------------------------------------------------------------------

@pytest.mark.parametrize("who", USERS)
def test_only_root_writes_the_config_workers_load(flexiqd, who):
    # Workers import the pool's `app:` from the applied config: writing it is running code.
    assert can_open_for_writing(flexiqd, who, APPLIED) is (who == "root")
    assert can_create_in(flexiqd, who, RUN_DIR) is (who == "root")


def test_only_root_writes_the_paused_pools_file(flexiqd):
    assert flexiqd.run([str(BIN / "flexiqctl"), "pause", "default"], check=False).returncode == 0
    try:
        flexiqd.wait_for(lambda: flexiqd.run(["test", "-f", PAUSED], check=False).returncode == 0, 10,
                         what=f"{PAUSED} to be published")
        assert [who for who in USERS if can_open_for_writing(flexiqd, who, PAUSED)] == ["root"]
    finally:
        flexiqd.run([str(BIN / "flexiqctl"), "resume", "default"], check=False)


@pytest.mark.parametrize("who", USERS)
def test_only_root_writes_the_config_file(flexiqd, who):
    assert can_open_for_writing(flexiqd, who, CONFIG_FILE) is (who == "root")
    assert can_create_in(flexiqd, who, CONFIG_DIR) is (who == "root")


@pytest.mark.parametrize("who", USERS)
def test_only_root_writes_worker_drop_ins(flexiqd, who):
    # A drop-in can set User=root or ExecStartPre=: writing one is running code as root.
    dropin_dir = f"{DROPINS}/{WORKER}.d"
    dropin = flexiqd.run(f"ls {dropin_dir}/*.conf").stdout.split()[0]
    assert can_open_for_writing(flexiqd, who, dropin) is (who == "root")
    assert can_create_in(flexiqd, who, dropin_dir) is (who == "root")
    assert can_create_in(flexiqd, who, DROPINS) is (who == "root")


def test_worker_home_is_private_and_its_user_site_off(flexiqd):
    env = worker_environ(flexiqd, WORKER)
    home = env["HOME"]
    assert not home.startswith(QUEUE_DIR + "/") and home != QUEUE_DIR
    assert env.get("PYTHONNOUSERSITE") == "1"
    # Neither HOME nor any folder above it may be writable by group or others (a
    # writable parent lets one swap HOME for a folder of one's own).
    path, modes = home, []
    while path:
        modes.append((path, *flexiqd.run(["stat", "-c", "%a %U %G", path]).stdout.split()))
        path = path.rsplit("/", 1)[0]
    loose = [(p, mode, user, group) for p, mode, user, group in modes
             if int(mode, 8) & 0o022 or (user not in ("root", "flexiq"))]
    assert loose == [], modes
    cwd = flexiqd.run(["readlink", f"/proc/{flexiqd.unit_property(WORKER, 'MainPID')}/cwd"]).stdout.strip()
    assert cwd == "/"


@pytest.mark.parametrize("who", USERS)
def test_only_root_and_the_workers_user_write_the_workers_home(flexiqd, who):
    home = worker_environ(flexiqd, WORKER)["HOME"]
    assert can_create_in(flexiqd, who, home) is (who == "root")
    site = f"{home}/.local/lib/python3.11/site-packages"
    made = attempt(flexiqd, who, 'mkdir -p "$1"', site)
    flexiqd.run(["rm", "-rf", f"{home}/.local"])
    assert made is (who == "root")


def test_python_planted_where_the_group_can_write_is_not_run_by_a_worker(flexiqd):
    marker = f"{MARKS}/planted-code-ran"
    code = f"import os; os.close(os.open({marker!r}, os.O_CREAT | os.O_WRONLY, 0o666))\n"
    # Every folder group flexiq can write, the old HOME's user site included.
    user_site = f"{QUEUE_DIR}/.local/lib/python3.11/site-packages"
    assert attempt(flexiqd, MEMBER, 'mkdir -p "$1"', user_site)
    found = flexiqd.run([*as_user(MEMBER), "find", "/", "(", "-path", "/proc", "-o", "-path", "/sys", "-o",
                         "-path", "/dev", ")", "-prune", "-o", "-type", "d", "-writable", "-print"],
                        check=False, timeout=120).stdout.split("\n")
    folders = sorted({f for f in found if f and not f.startswith(MARKS)})
    assert user_site in folders
    # A .pth runs at start-up from a site folder; the modules from anywhere on sys.path.
    names = ("zz-flexiq-probe.pth", "sitecustomize.py", "usercustomize.py", "counting_app.py")
    planted = [f"{folder}/{name}" for folder in folders for name in names
               if attempt(flexiqd, MEMBER, 'test ! -e "$1" && printf %s "$2" > "$1"', f"{folder}/{name}", code)]
    try:
        before = flexiqd.unit_property(WORKER, "MainPID")
        flexiqd.systemctl("restart", WORKER)
        flexiqd.wait_for(lambda: flexiqd.unit_property(WORKER, "ActiveState") == "active"
                         and flexiqd.unit_property(WORKER, "MainPID") != before, 30,
                         what="the restarted worker to be ready")
        assert flexiqd.run(["test", "-e", marker], check=False).returncode != 0, \
            f"a worker ran code planted by group flexiq in one of {planted}"
        # The same plant does run in a Python that reads the old HOME's user site: the
        # test can see what it looks for.
        flexiqd.run([*as_user("flexiq"), "env", f"HOME={QUEUE_DIR}", "python3", "-c", "pass"])
        assert flexiqd.run(["test", "-e", marker], check=False).returncode == 0
    finally:
        flexiqd.run(["rm", "-rf", marker, f"{QUEUE_DIR}/.local", *planted])


# -- the daemon's own state ---------------------------------------------------------------------

@pytest.mark.parametrize("who", USERS)
def test_only_root_reaches_the_daemons_state(flexiqd, who):
    events = f"{DAEMON_STATE}/events.jsonl"
    flexiqd.wait_for(lambda: flexiqd.run(["test", "-f", events], check=False).returncode == 0, 10,
                     what="the event history in the daemon's state directory")
    assert can_read(flexiqd, who, events) is (who == "root")
    assert can_open_for_writing(flexiqd, who, events) is (who == "root")
    assert can_create_in(flexiqd, who, DAEMON_STATE) is (who == "root")
    # Nothing of the daemon's own is left where the group writes.
    assert flexiqd.run(["test", "-e", f"{QUEUE_DIR}/events.jsonl"], check=False).returncode != 0


# -- the queue store: data for whoever may enqueue ----------------------------------------------

@pytest.mark.parametrize("who", USERS)
def test_root_and_group_flexiq_may_enqueue(flexiqd, who):
    store = f"{QUEUE_DIR}/queue.db"
    assert can_open_for_writing(flexiqd, who, store) is (who in ("root", MEMBER))
    enqueued = flexiqd.run([*as_user(who), str(BIN / "flexiq"), "--url", f"sqlite:///{store}",
                            "enqueue", "count", "0", "--count", "1"], check=False)
    assert (enqueued.returncode == 0) is (who in ("root", MEMBER)), enqueued.stderr


def test_group_flexiq_cannot_swap_the_queue_database(flexiqd):
    # flexiqd (root) opens the store by name: were it a link the group planted, root
    # would create or write the file it points at.
    for name in ("queue.db", "queue.db-wal", "queue.db-shm"):
        path = f"{QUEUE_DIR}/{name}"
        assert not attempt(flexiqd, MEMBER, 'mv "$1" "$1.moved"', path), path
        assert not attempt(flexiqd, MEMBER, 'rm -f "$1"', path), path
        flexiqd.run(["test", "-f", path])
    # What a member made is theirs to move (the probe can succeed).
    own = f"{QUEUE_DIR}/member-file"
    assert attempt(flexiqd, MEMBER, ': > "$1" && mv "$1" "$1.moved" && rm "$1.moved"', own)


# -- a worker's secrets -------------------------------------------------------------------------

@pytest.mark.parametrize("who", USERS)
def test_only_root_reads_a_workers_environment(flexiqd, who):
    pid = flexiqd.unit_property(WORKER, "MainPID")
    assert can_read(flexiqd, who, f"/proc/{pid}/environ") is (who == "root")
    # Not even another process of the workers' user (a worker of another pool): the
    # worker runs in a user namespace of its own (PrivateUsers=).
    assert not can_read(flexiqd, "flexiq", f"/proc/{pid}/environ")


CREDENTIAL_APP = '''
import hashlib

import flexiqd
from flexiqd import Queue

queue = Queue()


@queue.task("secret_digest")
def secret_digest() -> str:
    return hashlib.sha256(flexiqd.credential("db_password").encode()).hexdigest()
'''
APP_DIR = "/usr/local/lib/flexiq-test-apps"
SECRET = "s3cr%t \"pass\"\\word"


def test_a_pool_credential_reaches_its_worker_alone(flexiqd):
    flexiqd.write_file(f"{APP_DIR}/credential_app.py", CREDENTIAL_APP)
    flexiqd.write_file(f"{CONFIG_DIR}/db-password", SECRET, mode=0o600)
    unit = "flexiq-worker@secret-1.service"
    rejected = apply_config(flexiqd, pool_config("secret", f"""
app: credential_app:queue
queues: [secret]
min_workers: 1
max_workers: 1
environment: {{PYTHONPATH: {APP_DIR}}}
credentials: {{db_password: {CONFIG_DIR}/db-password}}
"""))
    try:
        assert rejected is None, rejected
        flexiqd.wait_for(lambda: unit in workers(flexiqd), 30, what=f"{unit} to be active")
        # The task reads it through flexiqd.credential().
        flexiq(flexiqd, "enqueue", "secret_digest", "--queue", "secret")
        done = flexiqd.wait_for(
            lambda: json.loads(flexiq(flexiqd, "jobs", "list", "--state", "done", "--queue", "secret",
                                      "--json").stdout), 30, what="the secret_digest job to be done")
        shown = json.loads(flexiq(flexiqd, "jobs", "show", str(done[0]["id"]), "--json").stdout)
        assert shown["result"] == hashlib.sha256(SECRET.encode()).hexdigest()
        # Nobody else reads the credential...
        secret = f"{worker_environ(flexiqd, unit)['CREDENTIALS_DIRECTORY']}/db_password"
        assert [who for who in USERS if can_read(flexiqd, who, secret)] == ["root"]
        # Nor does a worker of another pool, though it runs as the same user: a worker's
        # mount namespace shows it its own credentials alone.
        other = flexiqd.unit_property(WORKER, "MainPID")
        assert not attempt(flexiqd, "root", f'nsenter -t {other} -m -- {shlex.join(as_user("flexiq"))} cat "$1"',
                           secret)
        # ...and it is nowhere the world can look: unit properties, drop-ins, environment, command line.
        pid = flexiqd.unit_property(unit, "MainPID")
        for where in (f"systemctl show {unit}", f"cat {DROPINS}/{unit}.d/*",
                      f"tr '\\0' '\\n' < /proc/{pid}/environ", f"tr '\\0' ' ' < /proc/{pid}/cmdline",
                      f"cat {APPLIED}"):
            assert "s3cr%t" not in flexiqd.run(where).stdout, where
    finally:
        apply_config(flexiqd, CONFIG)
        flexiqd.run(f"systemctl stop {unit}; rm -f {CONFIG_DIR}/db-password; true")


# -- hostile values in the config ---------------------------------------------------------------

HOSTILE = {
    "NEWLINE": "a\nNice=5\n#",   # the comment line swallows the closing quote
    "SPECIFIERS": "%u on %H is %%",
    "QUOTES": 'say "hi" \\ and \\" bye',
    "DOLLAR": "$HOME ${USER}",
}


def test_hostile_config_values_cannot_add_unit_directives(flexiqd):
    unit = "flexiq-worker@odd-1.service"
    environment = {"PYTHONPATH": str(BIN.parent.parent / "tests" / "apps"), "FLEXIQ_TEST_MARKS": MARKS, **HOSTILE}
    rejected = apply_config(flexiqd, pool_config("odd", f"""
app: counting_app:queue
queues: [odd]
min_workers: 1
max_workers: 1
environment: {json.dumps(environment)}
"""))
    try:
        if rejected is not None:
            # Refusing such a value is fine too, if the reason names the key.
            assert "pools.odd.environment." in rejected, rejected
            return
        flexiqd.wait_for(lambda: unit in workers(flexiqd), 30, what=f"{unit} to be active")
        # No directive came from a value: the unit is the template's plus ours.
        assert flexiqd.unit_property(unit, "Nice") == "0"
        # Every value reached the worker exactly as written.
        env = worker_environ(flexiqd, unit)
        assert {key: env.get(key) for key in HOSTILE} == HOSTILE
    finally:
        apply_config(flexiqd, CONFIG)
        flexiqd.run(f"systemctl stop {unit}; true")


# -- steering over D-Bus ------------------------------------------------------------------------

BUSCTL = ["busctl", "--system", "call", "org.flexiq.flexiqd1", "/org/flexiq/flexiqd1",
          "org.flexiq.flexiqd1.Manager"]
# Arguments that would be valid: a refusal is the access check, not a bad request.
MUTATING_CALLS = {
    "Scale": ["sud", "default", "1", "5"],
    "Unpin": ["s", "default"],
    "Pause": ["s", "default"],
    "Resume": ["s", "default"],
    "Drain": ["s", "default"],
    "Reload": [],
}


def call(sbx: Sandbox, who: str, member: str, *args: str):
    return sbx.run([*as_user(who), *BUSCTL, member, *args], check=False)


@pytest.mark.parametrize("who", [MEMBER, OUTSIDER])
@pytest.mark.parametrize("member", sorted(MUTATING_CALLS))
def test_neither_group_flexiq_nor_an_unrelated_user_may_call_a_mutating_member(flexiqd, member, who):
    refused = call(flexiqd, who, member, *MUTATING_CALLS[member])
    assert refused.returncode != 0 and "Access denied" in refused.stderr, refused.stderr


@pytest.mark.parametrize("who", USERS)
def test_everyone_reads_the_status_and_the_steering_group_reloads(flexiqd, who):
    status = call(flexiqd, who, "Status")
    assert status.returncode == 0 and "default" in status.stdout, status.stderr
    reload = call(flexiqd, who, "Reload")
    assert (reload.returncode == 0) is (who in ("root", STEERER)), reload.stderr


def test_the_unit_sandboxing_holds_for_both_units(flexiqd):
    """The settings the boundaries above rest on, as systemd applies them."""
    daemon = flexiqd.unit_properties(DAEMON, "StateDirectory", "StateDirectoryMode", "UMask")
    assert daemon == {"StateDirectory": "flexiqd", "StateDirectoryMode": "0700", "UMask": "0007"}
    assert flexiqd.run(["stat", "-c", "%a %U", DAEMON_STATE]).stdout.split() == ["700", "root"]
    worker = flexiqd.unit_properties(WORKER, "User", "WorkingDirectory", "Environment")
    assert worker["User"] == "flexiq" and worker["WorkingDirectory"] in ("/", "")
    assert "PYTHONNOUSERSITE=1" in shlex.split(worker["Environment"])
