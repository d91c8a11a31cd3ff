"""A clean Debian bookworm booted under systemd, and the packages built for it.

The package tests install flexiqd's .deb into a system that has never seen the
project: a minimal Debian made with ``mmdebstrap`` from the Debian mirror this
machine's apt uses.

1. ``cached_rootfs()`` makes that tree once and keeps it under the checkout's
   git-ignored ``.cache/``; it is made again when its recipe changes or it is
   older than ``ROOTFS_MAX_AGE`` (its packages would lag the mirror's). The
   tree is built beside its final place and renamed into it, so a run that is
   killed half-way leaves no half-made tree to boot; a lock file serialises
   concurrent runs.
2. ``DebianMachine`` boots it with ``systemd-nspawn --volatile=overlay``: every
   write goes to a tmpfs overlay, so the cached tree stays pristine and each
   boot starts from the same clean system. It is a ``Sandbox`` (the same
   flags, the same teardown by pid, ``run``/``script``/``wait_for``) that boots
   that tree instead of this machine's own ``/``. It shares the host's network
   (apt inside fetches the dependencies from the mirror); a minimal Debian
   starts no service that listens on a port.
3. ``build_deb()`` and ``build_rpm()`` build the packages exactly as ``make deb``
   and ``make rpm`` do (the same scripts under ``packaging/``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator, Sequence

from .sandbox import Sandbox, _die_with_parent, remove_stale_state_dirs

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "debian-rootfs"
SUITE = "bookworm"
INCLUDE = ("systemd", "systemd-sysv", "dbus", "python3")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
ROOTFS_MAX_AGE = 7 * 24 * 3600.0
MMDEBSTRAP_TIMEOUT = 900.0
BUILD_TIMEOUT = 600.0
# Where the packages appear inside the machine (bound read-only).
PACKAGES_INSIDE = "/srv/flexiq-packages"


def unavailable_reason() -> str | None:
    """Why the package tests cannot run here, or None.  Only prerequisites."""
    if os.geteuid() != 0:
        return "the package tests need root (mmdebstrap, systemd-nspawn, nsenter)"
    tools = {"systemd-nspawn": "systemd-container", "nsenter": "util-linux", "mmdebstrap": "mmdebstrap",
             "dpkg-buildpackage": "dpkg-dev", "dh": "debhelper", "rpmbuild": "rpm", "lintian": "lintian"}
    for tool, package in tools.items():
        if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
            return f"{tool} is not installed (apt-get install {package}; `make test` does)"
    return None


# -- the Debian mirror -----------------------------------------------------------------------------

def debian_mirror(sources: Sequence[Path] | None = None) -> str:
    """The URI this machine's apt fetches Debian's ``bookworm main`` from.

    Reads deb822 ``*.sources`` and one-line ``*.list`` files; falls back to
    ``DEFAULT_MIRROR`` when neither names one.
    """
    if sources is None:
        sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*.list")),
                   *sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        for uri, suites, components in _entries(text, deb822=path.suffix == ".sources"):
            if SUITE in suites and "main" in components and not uri.rstrip("/").endswith("-security"):
                return uri.rstrip("/")
    return DEFAULT_MIRROR


def _entries(text: str, *, deb822: bool) -> Iterator[tuple[str, list[str], list[str]]]:
    if not deb822:
        for line in text.splitlines():
            # deb [options] uri suite component...
            match = re.match(r"^\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)\s+(.*)$", line)
            if match:
                yield match[1], [match[2]], match[3].split()
        return
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            name, value = line.split(":", 1)
            fields[name.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes") == "no":
            continue
        for uri in fields.get("uris", "").split():
            yield uri, fields.get("suites", "").split(), fields.get("components", "").split()


# -- the cached root file system -------------------------------------------------------------------

def rootfs_command(target: Path, mirror: str) -> list[str]:
    return ["mmdebstrap", "--variant=minbase", f"--include={','.join(INCLUDE)}", SUITE, str(target), mirror]


def cached_rootfs(cache: Path = CACHE, *, mirror: str | None = None, max_age: float = ROOTFS_MAX_AGE) -> Path:
    """A minimal Debian bookworm tree with systemd, dbus and python3; built if missing or stale.

    Blocking: about 30 s when it has to be built, nothing otherwise. Returns a
    tree that must not be written to (boot it with DebianMachine, which
    overlays it).
    """
    mirror = mirror or debian_mirror()
    recipe = " ".join(rootfs_command(Path("TARGET"), mirror))
    key = hashlib.sha256(recipe.encode()).hexdigest()[:10]
    final = cache / f"{SUITE}-{key}"
    stamp = final / ".flexiq-rootfs"
    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache / "lock"):
        if stamp.exists() and time.time() - stamp.stat().st_mtime < max_age:
            return final
        for old in cache.iterdir():
            if old.is_dir() and old.name != "lock":
                log.info("Removing the old root file system %s.", old)
                shutil.rmtree(old)
        building = Path(tempfile.mkdtemp(prefix=".building-", dir=cache))
        building.rmdir()  # mmdebstrap wants to create it
        log.info("Making a Debian %s root file system from %s (about 30 s).", SUITE, mirror)
        started = time.monotonic()
        try:
            done = subprocess.run(rootfs_command(building, mirror), capture_output=True, text=True,
                                  timeout=MMDEBSTRAP_TIMEOUT, env=_system_env())
            if done.returncode != 0:
                raise RuntimeError(f"mmdebstrap failed ({done.returncode}):\n{_tail(done.stderr, 30)}")
            (building / stamp.name).write_text(f"{recipe}\nbuilt in {time.monotonic() - started:.0f} s\n")
            building.rename(final)
        finally:
            if building.exists():
                shutil.rmtree(building)
    return final


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# -- booting it ------------------------------------------------------------------------------------

class DebianMachine(Sandbox):
    """The cached Debian tree booted under systemd, with a tmpfs overlay over it.

    ``binds`` are (host directory, path inside) pairs, bound read-only. Start,
    stop, run commands and wait exactly as with ``Sandbox``; teardown is its
    (SIGTERM to the nspawn process we started, by pid, then escalation).
    """

    def __init__(self, rootfs: Path, *, binds: Sequence[tuple[Path, str]] = (),
                 boot_timeout: float = 60.0, stop_timeout: float = 30.0) -> None:
        super().__init__(boot_timeout=boot_timeout, stop_timeout=stop_timeout)
        self.rootfs = rootfs
        self.binds = list(binds)

    def _launch(self) -> None:
        remove_stale_state_dirs()
        self._state_dir = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
        self._state_dir.chmod(0o755)
        self.bus_dir.mkdir()
        nspawn = [
            "systemd-nspawn", "-D", str(self.rootfs),
            # Every write to a tmpfs overlay: the cached tree stays as mmdebstrap made it.
            "--volatile=overlay",
            # No host systemd or machined to register with.
            "--register=no", "--keep-unit",
            "-M", self.name,
            f"--bind={self.bus_dir}:/run/dbus",
            *(f"--bind-ro={host}:{inside}" for host, inside in self.binds),
            "--console=read-only",
            "-b", "--", "systemd.firstboot=off",
        ]
        parent = os.getpid()
        with open(self.log_path, "wb") as log_file:
            self._proc = subprocess.Popen(
                nspawn, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True, cwd="/", preexec_fn=lambda: _die_with_parent(parent),
            )
        import atexit

        atexit.register(self.stop)
        self._atexit_registered = True
        log.info("Booting Debian %s as %s (nspawn pid %d).", self.rootfs, self.name, self._proc.pid)

    def apt(self, *args: str, timeout: float = 300.0):
        """``apt-get -y ARGS`` inside, non-interactive; raises with apt's output on failure."""
        return self.run(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-y", "-o", "Dpkg::Use-Pty=0",
                         *args], timeout=timeout)


# -- building the packages -------------------------------------------------------------------------

def _system_env() -> dict[str, str]:
    # The system PATH: a virtual environment's python first on PATH breaks pybuild.
    env = {name: value for name, value in os.environ.items() if not name.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
    return env


def build_deb(out: Path, *, version: str | None = None, check: bool = True) -> Path:
    """Build the .deb into ``out`` as ``make deb`` does; return its path.

    ``version``: build it as that Debian version (a changelog entry is added to
    a copy of the tree), for upgrade tests. ``check=False`` skips the build-time
    unit tests (DEB_BUILD_OPTIONS=nocheck).
    """
    env = _system_env()
    if not check:
        # The option skips the tests, the profile their build dependencies (<!nocheck>).
        env["DEB_BUILD_OPTIONS"] = " ".join(filter(None, [env.get("DEB_BUILD_OPTIONS", ""), "nocheck"]))
        env["DEB_BUILD_PROFILES"] = " ".join(filter(None, [env.get("DEB_BUILD_PROFILES", ""), "nocheck"]))
    args = [str(REPO / "packaging" / "build-deb"), str(out)] + ([version] if version else [])
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=BUILD_TIMEOUT, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"building the .deb failed ({done.returncode}):\n{_tail(done.stdout + done.stderr, 60)}")
    debs = sorted(out.glob("flexiqd_*.deb"))
    if len(debs) != 1 or len(list(out.glob("flexiqd-cockpit_*.deb"))) != 1:
        raise RuntimeError(f"expected a flexiqd and a flexiqd-cockpit .deb in {out}, found {sorted(out.glob('*.deb'))}")
    return debs[0]


def cockpit_deb(deb: Path) -> Path:
    """The flexiqd-cockpit .deb built beside ``deb`` (build_deb's)."""
    return next(deb.parent.glob("flexiqd-cockpit_*.deb"))


def build_rpm(out: Path) -> Path:
    """Build the .rpm into ``out`` as ``make rpm`` does; return its path."""
    done = subprocess.run([str(REPO / "packaging" / "build-rpm"), str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=BUILD_TIMEOUT, env=_system_env())
    if done.returncode != 0:
        raise RuntimeError(f"building the .rpm failed ({done.returncode}):\n{_tail(done.stdout + done.stderr, 60)}")
    rpms = sorted(out.glob("flexiqd-[0-9]*.noarch.rpm"))   # not flexiqd-cockpit-*
    if len(rpms) != 1:
        raise RuntimeError(f"expected one flexiqd .rpm in {out}, found {rpms}")
    return rpms[0]


def lintian(changes_or_deb: Path) -> subprocess.CompletedProcess[str]:
    """``lintian --pedantic`` with info and experimental tags, as ``make deb`` runs it."""
    return subprocess.run(["lintian", "--pedantic", "--display-info", "--display-experimental",
                           str(changes_or_deb)], capture_output=True, text=True, timeout=BUILD_TIMEOUT,
                          env=_system_env())


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])
