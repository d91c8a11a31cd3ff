"""A throw-away container with a real systemd as PID 1, for system tests.

The test machines boot no systemd of their own, but systemd is installed, so
``systemd-nspawn`` can boot this machine's own root file system as a container
(notes/systemd-sandbox.md has the recipe and why each flag is there):

1. ``unshare --mount`` gives the container's launcher a private mount namespace;
   inside it ``/`` is bind-mounted (not recursively) onto an empty directory.
   The bind mount exists only in that namespace, so it disappears with
   ``systemd-nspawn`` however the run ends -- even if the test process is
   killed -- and the host's mount table never shows it.
2. ``systemd-nspawn --volatile=overlay`` boots that tree with a tmpfs overlay on
   top: everything written inside vanishes at shutdown, the host is untouched.
3. A host directory is bound over the container's ``/run/dbus``, so the
   container's system bus socket appears on the host at ``bus_address``:
   host-side D-Bus clients (pystemd with ``DBusAddress``, dbus-fast) talk to the
   container's systemd exactly as they would to a host's.
4. ``--private-network``: the container has only its own loopback, so what
   the image starts at boot (PostgreSQL on 5432, ...) takes neither the host's
   ports nor another sandbox's; concurrent sandboxes (two test runs, xdist
   workers) do not collide.
5. Commands run inside with ``nsenter -t <container PID 1> -a``. They stay in
   the test process's cgroup; use ``systemd-run`` inside for a unit of their own.

Teardown sends SIGTERM to the ``systemd-nspawn`` process this object started
(by its pid, never by name), which shuts the container down in an orderly way;
after ``stop_timeout`` it sends SIGKILL. ``stop()`` is registered with
``atexit`` for an interrupted run (Ctrl-C). nspawn is started with a
parent-death signal, so it shuts down even if the test process is killed
outright; the next sandbox then removes the state directory that run left.

Threads: ``run()`` and the helpers built on it may be called from several
threads at once (each call is its own process). ``start()`` and ``stop()``
belong to one thread, which must outlive the sandbox: the parent-death signal
fires when the *thread* that started it exits.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# Commands inside get this environment, not the test process's: a host
# DBUS_SYSTEM_BUS_ADDRESS pointing at bus_address, say, means nothing inside.
_INSIDE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/root",
    "TERM": "dumb",
    "SYSTEMD_PAGER": "",
    "SYSTEMD_COLORS": "0",
}
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\r")
_PR_SET_PDEATHSIG = 1
CHECKOUT = Path(__file__).resolve().parents[2]
# Default names: flexiq-sbx-<test pid>-<6 hex>, then mkdtemp's suffix.
_STATE_DIR_NAME = re.compile(r"flexiq-sbx-(\d+)-[0-9a-f]{6}-[A-Za-z0-9_]+")
_SYSTEMD_BINARIES = ("/lib/systemd/systemd", "/usr/lib/systemd/systemd")


class SandboxError(Exception):
    """The sandbox could not be booted, or it died while in use."""


class SandboxBootError(SandboxError):
    """The container did not boot to ``running``/``degraded`` in time."""


class SandboxTimeout(SandboxError, TimeoutError):
    """``Sandbox.wait_for`` gave up; the message names what was awaited."""


class SandboxCommandError(subprocess.CalledProcessError):
    """A command inside the container failed; ``str()`` includes its output."""

    def __str__(self) -> str:
        text = super().__str__()
        for label, stream in (("stdout", self.stdout), ("stderr", self.stderr)):
            if stream and stream.strip():
                text += f"\n--- {label} ---\n{_tail(stream, 40)}"
        return text


def unavailable_reason() -> str | None:
    """Why a sandbox cannot be booted on this machine, or None if it can.

    Only checks the prerequisites (root, the binaries); a machine that passes
    can still fail to boot, and that is an error, not a reason to skip.
    """
    if os.geteuid() != 0:
        return "system tests need root (systemd-nspawn, mount, nsenter)"
    for tool in ("systemd-nspawn", "nsenter", "unshare", "mount"):
        if shutil.which(tool) is None:
            hint = " (apt-get install systemd-container)" if tool == "systemd-nspawn" else ""
            return f"{tool} is not installed{hint}"
    if not any(os.path.exists(p) for p in _SYSTEMD_BINARIES):
        return "systemd is not installed, nothing to boot in the container"
    return None


class Sandbox:
    """This machine's root file system booted under a real systemd.

    Use as a context manager (``with Sandbox() as sbx: ...``) or call
    ``start()`` and ``stop()``. ``start()`` blocks until
    ``systemctl is-system-running`` says ``running`` or ``degraded``.
    ``stop()`` is idempotent and always leaves nothing behind: no process it
    started, no mount, no temporary directory.
    """

    def __init__(self, *, boot_timeout: float = 60.0, stop_timeout: float = 30.0,
                 name: str | None = None) -> None:
        self.boot_timeout = boot_timeout
        self.stop_timeout = stop_timeout
        #: The container's machine name (``-M``); unique per Sandbox.
        self.name = name or f"flexiq-sbx-{os.getpid()}-{secrets.token_hex(3)}"
        #: Units that had failed when the container finished booting.
        self.failed_units: list[str] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._leader: int | None = None
        self._state_dir: Path | None = None
        self._cgroups: list[str] = []
        self._atexit_registered = False

    # -- lifecycle ---------------------------------------------------------

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Boot the container; return once systemd inside reports it is up.

        Blocking. On any failure (including KeyboardInterrupt) the container
        is torn down before the exception propagates.
        """
        start_all((self,))

    def stop(self) -> None:
        """Shut the container down and remove everything start() created.

        Idempotent, safe to call from atexit and after a failed start().
        """
        try:
            self._terminate()
        finally:
            self._remove_state_dir()
            if self._atexit_registered:
                atexit.unregister(self.stop)
                self._atexit_registered = False

    def _launch(self) -> None:
        remove_stale_state_dirs()
        self._state_dir = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
        # Readable by all, so a test may connect to the bus as another user.
        self._state_dir.chmod(0o755)
        self.root_dir.mkdir()
        self.bus_dir.mkdir()
        nspawn = [
            "systemd-nspawn", "-D", str(self.root_dir),
            "--volatile=overlay",
            # No host systemd or machined to register with.
            "--register=no", "--keep-unit",
            "-M", self.name,
            # Its own network namespace (only "lo"): services the image starts
            # (PostgreSQL on 5432, ...) must not take the host's ports nor
            # collide with another sandbox's.
            "--private-network",
            f"--bind={self.bus_dir}:/run/dbus",
            # The checkout (and its .venv) at the same path inside, wherever it lives:
            # below /tmp, say, it would otherwise be hidden by the container's own /tmp.
            f"--bind={CHECKOUT}:{CHECKOUT}",
            # Boot messages go to the log, which boot errors quote.
            "--console=read-only",
            "-b", "--", "systemd.firstboot=off",
        ]
        # The bind mount is made inside unshare's private mount namespace, so
        # it lives exactly as long as nspawn does; sh then execs nspawn, so
        # the pid we hold is nspawn's.  Before that, sh moves itself into a
        # cgroup of this sandbox's own: nspawn without a host systemd puts its
        # container in "payload" below its own cgroup, and two sandboxes in one
        # cgroup would share it (the one's systemd then signals the other's
        # processes: "Failed to send signal ... Input/output error").
        self._cgroups = own_cgroup_dirs(self.name)
        launcher = [
            "unshare", "--mount", "--propagation", "private", "--",
            "/bin/sh", "-c",
            'mount --bind / "$1" && shift && '
            'for dir in $FLEXIQ_SBX_CGROUPS; do mkdir -p "$dir" && echo $$ > "$dir/cgroup.procs"; done && '
            'exec "$@"',
            "sh", str(self.root_dir), *nspawn,
        ]
        parent = os.getpid()
        with open(self.log_path, "wb") as log_file:
            self._proc = subprocess.Popen(
                launcher, stdin=subprocess.DEVNULL, stdout=log_file,
                env={**os.environ, "FLEXIQ_SBX_CGROUPS": " ".join(self._cgroups)},
                stderr=subprocess.STDOUT, start_new_session=True, cwd="/",
                preexec_fn=lambda: _die_with_parent(parent),
            )
        atexit.register(self.stop)
        self._atexit_registered = True
        log.info("Booting sandbox %s (nspawn pid %d).", self.name, self._proc.pid)

    def _wait_until_booted(self) -> None:
        deadline = time.monotonic() + self.boot_timeout
        last_state = "no container PID 1 yet"
        while True:
            self._ensure_alive()
            if self._leader is None:
                self._leader = _find_container_init(self._proc.pid)
            if self._leader is not None:
                try:
                    probe = self.run(["systemctl", "is-system-running"], check=False,
                                     timeout=min(10.0, max(1.0, deadline - time.monotonic())))
                    last_state = probe.stdout.strip() or probe.stderr.strip() or last_state
                except subprocess.TimeoutExpired:
                    last_state = "systemctl is-system-running timed out"
                if last_state in ("running", "degraded") and self.bus_socket.exists():
                    break
                if last_state in ("running", "degraded"):
                    last_state += f", but no bus socket at {self.bus_socket} yet"
            if time.monotonic() >= deadline:
                raise SandboxBootError(
                    f"sandbox {self.name} did not boot within {self.boot_timeout:g} s "
                    f"(last state: {last_state}){self._pending_jobs()}\n"
                    f"tail of the nspawn log:\n{self.log_tail()}")
            time.sleep(0.1)
        if last_state == "degraded":
            failed = self.run(["systemctl", "list-units", "--failed", "--plain",
                               "--no-legend", "--no-pager"], check=False).stdout
            self.failed_units = [line.split()[0] for line in failed.splitlines() if line.strip()]
            log.warning("Sandbox %s booted degraded; failed units: %s.",
                        self.name, ", ".join(self.failed_units) or "none listed")
        log.info("Sandbox %s is up (container PID 1 is host pid %d).", self.name, self._leader)

    def _pending_jobs(self) -> str:
        """What systemd inside is still waiting for, for a boot error message."""
        if self._leader is None:
            return ""
        try:
            jobs = self.run(["systemctl", "list-jobs", "--no-legend", "--no-pager"],
                            check=False, timeout=5).stdout.strip()
        except (subprocess.TimeoutExpired, SandboxError):
            return ""
        return f"\njobs still queued:\n{jobs}" if jobs else ""

    def _terminate(self) -> None:
        """Stop nspawn and the container it started, escalating step by step.

        1. SIGTERM to nspawn: it asks the container's systemd to power off
           and waits for it.
        2. A second SIGTERM: nspawn kills the container at once.
        3. SIGKILL to the container's PID 1, then to nspawn. Both, and in this
           order: a SIGKILLed nspawn leaves its container running, orphaned.
        Each step waits up to ``stop_timeout`` for nspawn to exit.
        """
        proc, self._proc = self._proc, None
        self._leader = None
        if proc is None:
            return
        steps = [
            ("asking it to power off", self.stop_timeout, lambda: proc.send_signal(signal.SIGTERM)),
            ("a second SIGTERM", self.stop_timeout, lambda: proc.send_signal(signal.SIGTERM)),
            ("SIGKILL", self.stop_timeout, lambda: _kill_container(proc, self.stop_timeout)),
        ]
        for number, (action, timeout, step) in enumerate(steps):
            if proc.poll() is not None:
                break
            if number:
                log.warning("Sandbox %s still runs after %s; trying %s.",
                            self.name, steps[number - 1][0], action)
            step()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=timeout)
        if proc.poll() is None:
            raise SandboxError(f"sandbox {self.name}: nspawn pid {proc.pid} survived SIGKILL")
        log.info("Sandbox %s stopped (nspawn exit status %s).", self.name, proc.returncode)

    def _remove_state_dir(self) -> None:
        cgroups, self._cgroups = self._cgroups, []
        for cgroup in cgroups:
            _remove_cgroup(Path(cgroup))
        state_dir, self._state_dir = self._state_dir, None
        if state_dir is not None:
            _remove_state_dir(state_dir)

    # -- where things are --------------------------------------------------

    @property
    def state_dir(self) -> Path:
        if self._state_dir is None:
            raise SandboxError(f"sandbox {self.name} is not started")
        return self._state_dir

    @property
    def root_dir(self) -> Path:
        """The (empty on the host) mount point of the bind mount of ``/``."""
        return self.state_dir / "root"

    @property
    def bus_dir(self) -> Path:
        """Host directory bound over the container's ``/run/dbus``."""
        return self.state_dir / "bus"

    @property
    def bus_socket(self) -> Path:
        return self.bus_dir / "system_bus_socket"

    @property
    def bus_address(self) -> str:
        """D-Bus address of the container's system bus, usable from the host.

        For pystemd: ``DBusAddress(sbx.bus_address.encode())``.
        """
        return f"unix:path={self.bus_socket}"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "nspawn.log"

    @property
    def leader(self) -> int:
        """Host pid of the container's PID 1 (its systemd)."""
        if self._leader is None:
            raise SandboxError(f"sandbox {self.name} is not running")
        return self._leader

    @property
    def nspawn_pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of nspawn's output (the container's console)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except (OSError, SandboxError) as exc:
            return f"(no nspawn log: {exc})"
        # The console's output comes as \r\n plus colour codes: keep the words.
        text = "\n".join(line for line in _ANSI.sub("", text).splitlines() if line.strip())
        return _tail(text, lines) or "(nspawn log is empty)"

    # -- running things inside ---------------------------------------------

    def run(self, cmd: Sequence[str] | str, *, check: bool = True, timeout: float = 60.0,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run a command inside the container and capture its output (text).

        A string is run with ``bash -c``. Blocking; on timeout the command's
        whole process group is killed and ``subprocess.TimeoutExpired`` is
        raised. With ``check``, a non-zero exit raises SandboxCommandError.
        """
        self._ensure_alive()
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        full = ["nsenter", "-t", str(self.leader), "-a", "--", *argv]
        proc = subprocess.Popen(
            full, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_INSIDE_ENV,
            cwd="/", start_new_session=True,
        )
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_nsenter_group(proc)
            stdout, stderr = proc.communicate()
            raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr) from None
        except BaseException:
            _kill_nsenter_group(proc)
            raise
        result = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
        if check and proc.returncode != 0:
            raise SandboxCommandError(proc.returncode, argv, stdout, stderr)
        return result

    def script(self, text: str, *, check: bool = True,
               timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run a bash script inside, fed on stdin (``/tmp`` inside is not the host's).

        The script runs with ``set -euo pipefail``: the first failing command
        fails it.
        """
        return self.run(["bash", "-euo", "pipefail", "-s"], check=check, timeout=timeout,
                        input=text)

    def write_file(self, path: str, text: str, mode: int = 0o644) -> None:
        """Create or replace a file inside the container (parents are created).

        The content is written to a temporary name and renamed into place, so
        systemd never reads a half-written unit.
        """
        if not path.startswith("/"):
            raise ValueError(f"path inside the container must be absolute: {path!r}")
        self.run(["sh", "-c",
                  'set -e; mkdir -p "$(dirname "$1")"; cat > "$1.tmp.$$"; '
                  'chmod "$2" "$1.tmp.$$"; mv -f "$1.tmp.$$" "$1"',
                  "sh", path, format(mode, "o")], input=text)

    def systemctl(self, *args: str, check: bool = True,
                  timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """``systemctl ARGS`` inside the container (blocking, like systemctl)."""
        return self.run(["systemctl", "--no-pager", *args], check=check, timeout=timeout)

    def install_unit(self, name: str, text: str) -> None:
        """Write a unit into the container's /etc/systemd/system and daemon-reload."""
        if "/" in name:
            raise ValueError(f"unit name must not contain '/': {name!r}")
        self.write_file(f"/etc/systemd/system/{name}", text)
        self.systemctl("daemon-reload")

    def unit_properties(self, unit: str, *props: str) -> dict[str, str]:
        """Several properties of one unit, read in one ``systemctl show``."""
        args = [arg for prop in props for arg in ("-p", prop)]
        out = self.systemctl("show", *args, unit).stdout
        values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        return {prop: values.get(prop, "") for prop in props}

    def unit_property(self, unit: str, prop: str) -> str:
        """One property as ``systemctl show -p PROP --value UNIT`` prints it."""
        return self.systemctl("show", "-p", prop, "--value", unit).stdout.strip()

    def journal(self, unit: str) -> str:
        """The unit's journal since boot. journald may lag: poll with wait_for."""
        return self.run(["journalctl", "--no-pager", "-o", "short-precise", "-u", unit]).stdout

    def wait_for(self, predicate: Callable[[], T], timeout: float = 10.0,
                 interval: float = 0.1, *, what: str) -> T:
        """Poll ``predicate`` until it returns something truthy, and return that.

        Raises SandboxTimeout naming ``what`` and the last value seen after
        ``timeout`` seconds, or SandboxError at once if the container died.
        Exceptions from ``predicate`` propagate.
        """
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            self._ensure_alive()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxTimeout(f"timed out after {timeout:g} s waiting for {what} "
                                     f"(last value: {value!r})")
            time.sleep(min(interval, remaining))

    def _ensure_alive(self) -> None:
        if self._proc is None:
            raise SandboxError(f"sandbox {self.name} is not running")
        status = self._proc.poll()
        if status is not None:
            raise SandboxError(f"sandbox {self.name}: systemd-nspawn exited with status "
                               f"{status}; tail of its log:\n{self.log_tail()}")


def start_all(sandboxes: Sequence[Sandbox]) -> None:
    """Boot several sandboxes side by side: each launched, then each waited for.

    A boot is mostly waiting for the units inside to start, so a few boot in little
    more than the time of one.  Blocking; on any failure (including KeyboardInterrupt)
    every one of them is torn down before the exception propagates.
    """
    for sbx in sandboxes:
        if sbx._proc is not None:
            raise SandboxError(f"sandbox {sbx.name} was already started")
    try:
        for sbx in sandboxes:
            sbx._launch()
        for sbx in sandboxes:
            sbx._wait_until_booted()
    except BaseException:
        for sbx in sandboxes:
            sbx.stop()
        raise


def remove_stale_state_dirs() -> None:
    """Remove what earlier runs that were killed outright left in the temp dir.

    A run killed by SIGKILL or an unhandled SIGTERM runs no cleanup: nspawn
    still shuts down (parent-death signal) and the bind mount goes with its
    namespace, but the state directory stays. Only directories named like a
    default sandbox's, whose test process is gone and which no live process
    mentions on its command line, are removed.
    """
    for state_dir in Path(tempfile.gettempdir()).glob("flexiq-sbx-*"):
        match = _STATE_DIR_NAME.fullmatch(state_dir.name)
        if match is None or not state_dir.is_dir() or _pid_alive(int(match.group(1))):
            continue
        if _mentioned_by_a_process(str(state_dir)):
            continue  # its nspawn is still shutting down
        try:
            _remove_state_dir(state_dir)
            log.info("Removed %s, left by a sandbox whose test run was killed.", state_dir)
        except (OSError, SandboxError) as exc:
            log.warning("Could not remove stale sandbox directory %s: %s", state_dir, exc)


def own_cgroup_dirs(name: str) -> list[str]:
    """A cgroup named ``name`` below this process's own, in each hierarchy nspawn uses."""
    mounts = {"name=systemd": Path("/sys/fs/cgroup/systemd"),
              "": Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified").is_dir()
              else Path("/sys/fs/cgroup")}
    dirs = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        mount = mounts.get(controllers)
        if mount is not None and (mount / "cgroup.procs").exists() and os.access(mount, os.W_OK):
            dirs.append(str(mount / path.lstrip("/") / name))
    return dirs


def _remove_cgroup(path: Path) -> None:
    """rmdir a cgroup and what nspawn made below it (empty once its processes are gone)."""
    if not path.is_dir():
        return
    for folder, subfolders, _ in os.walk(path, topdown=False):
        for sub in subfolders:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(folder, sub))
    with contextlib.suppress(OSError):
        os.rmdir(path)


def _remove_state_dir(state_dir: Path) -> None:
    root = state_dir / "root"
    if _is_mount_point(root):
        # Only reachable if the mount escaped unshare's namespace; never
        # delete below a live bind mount of "/".
        subprocess.run(["umount", str(root)], check=False)
        if _is_mount_point(root):
            subprocess.run(["umount", "--lazy", str(root)], check=False)
        if _is_mount_point(root):
            raise SandboxError(f"{root} is still a mount point; left {state_dir} in place")
    if root.exists():
        root.rmdir()  # rmdir, not rmtree: it must be empty once unmounted
    for child in state_dir.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    state_dir.rmdir()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: an existence check, nothing is sent
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mentioned_by_a_process(text: str) -> bool:
    needle = text.encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if needle in cmdline.read_bytes():
                return True
        except OSError:
            continue  # gone while we looked
    return False


def _kill_container(nspawn: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGKILL the container's PID 1 (ending its pid namespace), then nspawn.

    Waits up to ``timeout`` for PID 1 to be dead: the kernel kills the rest
    of the namespace first, so then nothing of the container runs any more.
    """
    leader = _find_container_init(nspawn.pid)  # nspawn's own child, nothing else
    started = _start_time(leader) if leader is not None else None
    if leader is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(leader, signal.SIGKILL)
    nspawn.kill()
    deadline = time.monotonic() + timeout
    while leader is not None and time.monotonic() < deadline:
        state = _stat_fields(leader)
        # Gone, dead (a zombie until reaped), or the pid already reused.
        if state is None or state[0] in "ZX" or state[19] != started:
            return
        time.sleep(0.05)
    if leader is not None:
        log.warning("Container PID 1 (host pid %d) still runs after SIGKILL.", leader)


def _start_time(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[19] if fields is not None else None


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from the state field on (so index 0 is the state)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after it.
    return stat.rsplit(")", 1)[1].split()


def _die_with_parent(parent: int) -> None:
    """In the child before exec: get SIGTERM when the test process dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _kill_nsenter_group(proc: subprocess.Popen[str]) -> None:
    """Kill a command started by run(), and whatever it started, and reap nsenter.

    The command's own process (nsenter's child) goes first, so that nsenter
    reaps it. Killed together, the command would be orphaned to the host's
    PID 1 rather than the container's, and the container's shutdown would
    wait ~10 s for that unreaped zombie inside its pid namespace. What the
    command started is orphaned to the container's systemd, which reaps it.
    """
    for pid in _children_of(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    # The group this run() created; it only exists while members are left.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _children_of(parent: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _ppid(entry) == parent:
            children.append(int(entry.name))
    return children


def _ppid(proc_dir: Path) -> int | None:
    fields = _stat_fields(int(proc_dir.name))
    return int(fields[1]) if fields is not None else None


def _find_container_init(nspawn_pid: int) -> int | None:
    """Host pid of the child of nspawn that is PID 1 of a new pid namespace."""
    for pid in _children_of(nspawn_pid):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:"):
                ids = line.split()[1:]
                if len(ids) > 1 and ids[-1] == "1":
                    return pid
    return None


def _is_mount_point(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mountinfo") as mountinfo:
        # Field 5 is the mount point, with spaces etc. octal-escaped.
        return any(_unescape(line.split()[4]) == target for line in mountinfo)


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])
