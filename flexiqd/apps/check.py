"""Import a pool's app in a child process, as its workers would, and read what the child found.

As the workers' user (the worker unit's ``User=``) when run as root, in the pool's
interpreter (``python:``) and environment (the unit's own variables plus the pool's
``environment:``), from ``/`` as working directory.  What only systemd's sandbox does
(``ProtectHome=``, ``PrivateTmp=``) is judged from the files the import loaded
(``findings.hidden_files``): the child itself is not sandboxed.
"""

from __future__ import annotations

import dataclasses
import grp
import json
import os
import pwd
import subprocess
import sys
from typing import Mapping, Sequence

from ..config.model import DaemonConfig, PoolConfig
from ..queue.declarations import TaskDeclaration
from .findings import Finding, ScheduleNeed, app_findings, writable_findings

WORKER_USER = "flexiq"  # units/flexiq-worker@.service: User= and Group=
# The worker unit's own variables (units/flexiq-worker@.service), under the pool's.
WORKER_ENVIRONMENT = {"HOME": "/var/lib/flexiq-worker", "PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1",
                      "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# An import that takes longer than this is reported, not waited for.
PROBE_TIMEOUT = 30.0


@dataclasses.dataclass(frozen=True)
class WorkerIdentity:
    """Who the probe runs as: the workers' user where it exists and we may become it."""

    name: str
    uid: int
    gids: tuple[int, ...]     # primary first
    is_worker_user: bool      # False: the workers' user is missing or we are not root


@dataclasses.dataclass(frozen=True)
class AppProbe:
    """What importing one pool's app found."""

    pool: str
    app: str
    python: str
    identity: WorkerIdentity
    error: str | None = None                   # what a worker would die of; None: it imports
    tasks: Mapping[str, str] = dataclasses.field(default_factory=dict)  # task name -> its queue
    files: tuple[str, ...] = ()                # every file the import loaded
    declared: tuple[TaskDeclaration, ...] = ()  # what each task declares (flexiqd.queue.declarations)


def current_identity() -> WorkerIdentity:
    me = pwd.getpwuid(os.getuid()).pw_name if _has_uid(os.getuid()) else str(os.getuid())
    return WorkerIdentity(me, os.getuid(), tuple(dict.fromkeys((os.getgid(), *os.getgroups()))), False)


def worker_identity(user: str = WORKER_USER) -> WorkerIdentity:
    """The workers' user when it exists and we are root; else ourselves."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return current_identity()
    if os.geteuid() != 0:
        return current_identity()
    return WorkerIdentity(user, entry.pw_uid, tuple(dict.fromkeys(
        (entry.pw_gid, *os.getgrouplist(user, entry.pw_gid)))), True)


def _has_uid(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def worker_gids(user: str = WORKER_USER) -> tuple[int, ...]:
    """The workers' user's groups (its primary group first), or () where it does not exist."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return ()
    return tuple(dict.fromkeys((entry.pw_gid, *os.getgrouplist(user, entry.pw_gid),
                                *(g.gr_gid for g in grp.getgrall() if user in g.gr_mem))))


def probe_environment(pool: PoolConfig, fleet: str) -> dict[str, str]:
    """The variables a worker of ``pool`` starts with."""
    base = dict(os.environ) if fleet == "process" else dict(WORKER_ENVIRONMENT)
    base.update(pool.environment)
    return base


def probe_pool(pool: PoolConfig, *, fleet: str = "systemd", identity: WorkerIdentity | None = None,
               timeout: float = PROBE_TIMEOUT) -> AppProbe:
    """Import ``pool.app`` in a child process as its workers would (see the module's text)."""
    identity = identity or worker_identity()
    python = pool.python or (sys.executable if fleet == "process" else _system_python())
    result = AppProbe(pool.name, pool.app, python, identity)
    drop = {"user": identity.uid, "group": identity.gids[0], "extra_groups": list(identity.gids[1:])} \
        if identity.is_worker_user else {}
    command = [python, "-m", "flexiqd.apps.probe", pool.app]
    try:
        try:
            done = subprocess.run(command, capture_output=True, text=True, cwd="/",
                                  env=probe_environment(pool, fleet), timeout=timeout, **drop)
        except PermissionError:
            if not drop:
                raise
            # Root without the power to change user (flexiqd.service has no capabilities):
            # import as ourselves, and say so.
            result = dataclasses.replace(result, identity=current_identity())
            done = subprocess.run(command, capture_output=True, text=True, cwd="/",
                                  env=probe_environment(pool, fleet), timeout=timeout)
    except FileNotFoundError:
        return dataclasses.replace(result, error=f"python {python} does not exist")
    except PermissionError:
        return dataclasses.replace(result, error=f"python {python} cannot be run by {identity.name}")
    except subprocess.TimeoutExpired:
        return dataclasses.replace(result, error=f"importing it took longer than {timeout:g} s")
    if done.returncode != 0 or not done.stdout.strip():
        return dataclasses.replace(result, error=_child_failure(python, done.stderr))
    try:
        found = json.loads(done.stdout)
    except ValueError:
        return dataclasses.replace(result, error=f"it printed on standard output while importing: "
                                                 f"{done.stdout.strip()[:200]}")
    tasks = found.get("tasks", {})
    return dataclasses.replace(result, error=found.get("error"), files=tuple(found.get("files", ())),
                               tasks={name: task["queue"] for name, task in tasks.items()},
                               declared=_declarations(tasks))


def _declarations(tasks: Mapping[str, Mapping]) -> tuple[TaskDeclaration, ...]:
    """The declarations in the child's document (a child of an older flexiqd sends only queues)."""
    try:
        return tuple(TaskDeclaration(task=name, queue=str(task["queue"]), priority=int(task["priority"]),
                                     max_attempts=int(task["max_attempts"]),
                                     timeout=None if task["timeout"] is None else float(task["timeout"]))
                     for name, task in sorted(tasks.items()))
    except (KeyError, TypeError, ValueError):
        return ()


def _system_python() -> str:
    """The interpreter of /usr/bin/flexiq, which the worker unit runs (else this one)."""
    try:
        with open("/usr/bin/flexiq", "rb") as script:
            first = script.readline().decode(errors="replace")
    except OSError:
        return sys.executable
    if first.startswith("#!"):
        interpreter = first[2:].strip().split()[0]
        if os.path.isabs(interpreter) and os.access(interpreter, os.X_OK):
            return interpreter
    return sys.executable


def _child_failure(python: str, stderr: str) -> str:
    last = (stderr.strip().splitlines() or ["it exited without saying why"])[-1]
    if "No module named 'flexiqd'" in stderr or "No module named flexiqd" in stderr:
        return (f"{python} cannot import flexiqd itself: make the virtual environment with "
                f"--system-site-packages (python3 -m venv --system-site-packages DIR)")
    return f"{python} failed: {last}"


def check_apps(config: DaemonConfig, *, identity: WorkerIdentity | None = None,
               pools: Sequence[str] | None = None) -> tuple[list[AppProbe], list[Finding]]:
    """Probe each pool's app (all, or ``pools``) and say what is wrong or risky about it."""
    identity = identity or worker_identity()
    needs = [ScheduleNeed(name, schedule.task, schedule.queue) for name, schedule in sorted(config.schedules.items())]
    try:
        worker = pwd.getpwnam(WORKER_USER)
    except KeyError:
        worker = None
    probes, found = [], []
    for name in sorted(pools if pools is not None else config.pools):
        pool = config.pools[name]
        probe = probe_pool(pool, fleet=config.fleet, identity=identity)
        probes.append(probe)
        found += app_findings(name, pool.app, probe.error, probe.tasks, probe.files, pool.queues, needs,
                              sandboxed=config.fleet == "systemd")
        if worker is not None and config.fleet == "systemd":
            found += writable_findings(name, probe.files, worker.pw_uid, worker_gids(WORKER_USER),
                                       f"the workers' user or group ({WORKER_USER})")
    return probes, found
