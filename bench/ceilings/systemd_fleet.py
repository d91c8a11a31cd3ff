"""flexiqd as the daemon under a real systemd, its workers ``flexiq-worker@crowd-<n>.service`` units.

The systemd is the sandbox's (tests/system/sandbox.py: this machine's root booted by
``systemd-nspawn``, a real systemd as its PID 1); flexiqd is installed there the way
tests/system/flexiqd_install.py installs it (the shipped units, the checkout's .venv).  The
sandbox has a network of its own, so the store and the dependency are reached over unix
sockets in a share folder of the checkout, which the sandbox sees at the same path
(``ceiling(..., share=...)``, ``PostgresServer(socket_dirs=...)``).

From outside: the worker processes are the sandbox's systemd's children (``root_pid`` is
its PID 1, so ``WorkerSampler`` counts them, a stopping one until it has exited); every
second a thread reads ``flexiqctl status --json`` for what held the pool; at the end the
daemon's journal is kept in ``logs/flexiqd.journal`` and the workers' execution marks are
copied out of the sandbox into ``marks``.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import shutil
import threading
import time

from .deps import CODE, REPO, Dependency  # first: it puts tests/ on the path, where system/ is

from system.flexiqd_install import BIN, DAEMON, install  # noqa: E402
from system.sandbox import Sandbox  # noqa: E402

POOL = "crowd"
INSIDE_MARKS = "/var/lib/flexiq/marks"   # made by install(), writable by the worker units


def daemon_config(store_url: str, dependency: Dependency, settings, *, probe: dict | None = None,
                  knee: bool = True) -> dict:
    """The daemon's config: one pool of ceiling_app workers, no ``dependencies:`` capacity.

    ``probe``: declared on the dependency (``dependencies.dep.probe``, with a capacity far
    above the ceiling, which nobody tells it); ``knee`` False turns the throughput knee off."""
    s = settings
    environment = dependency.environment(INSIDE_MARKS, inside=True)
    pool = {"app": "ceiling_app:queue", "queues": ["default"], "concurrency": s.concurrency,
            "min_workers": s.min_workers, "max_workers": s.max_workers, "drain_timeout": f"{s.drain_timeout:g}s",
            "targets": {"age": f"{s.target_age:g}s"}, "environment": environment}
    if not knee:
        pool["knee"] = {"enabled": False}
    config = {"store": store_url, "tick": f"{s.poll_interval:g}s", "pools": {POOL: pool}}
    if probe is not None:
        config["dependencies"] = {"dep": {"capacity": 10_000, "probe": probe}}
        pool["uses"] = {"dep": {"per_worker": 1}}
    return config


class SystemdDaemonFleet:
    """flexiqd.service in the sandbox (``sandbox``, or one booted for this fleet alone)."""

    def __init__(self, store_url: str, dependency: Dependency, marks: pathlib.Path, logs: pathlib.Path,
                 settings, *, sandbox: Sandbox | None = None, probe: dict | None = None, knee: bool = True) -> None:
        self.config = daemon_config(store_url, dependency, settings, probe=probe, knee=knee)
        self.marks = marks
        self.logs = logs
        self.sandbox = sandbox
        self._own_sandbox = sandbox is None
        self.root_pid = 0
        self.sampler = None
        self.statuses: list[dict] = []     # {"t", "workers", "desired", "reason", "binding_cap", ...}
        self._journal = ""
        self._invocation = ""   # the daemon's InvocationID: its journal lines of this start alone
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="status-reader", daemon=True)
        self._last_ready_check = 0.0

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> "SystemdDaemonFleet":
        try:
            if self.sandbox is None:
                self.sandbox = Sandbox()
                self.sandbox.start()
            self.root_pid = self.sandbox.leader
            text = json.dumps(self.config, indent=1) + "\n"   # JSON is YAML
            (self.logs / "flexiqd.yaml").write_text(text)
            dropin = None
            if CODE != REPO:   # --code-at: the daemon runs that commit's package too
                dropin = f"[Service]\nEnvironment=PYTHONPATH={CODE}\n"
            install(self.sandbox, text, daemon_dropin=dropin)
            self._invocation = self.sandbox.unit_property(DAEMON, "InvocationID")
            self._watcher.start()
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def _close(self) -> None:
        self._stop.set()
        if self._watcher.is_alive():
            self._watcher.join()
        sbx = self.sandbox
        try:
            if sbx is not None and sbx.nspawn_pid is not None:
                with contextlib.suppress(Exception):
                    self._journal = self._read_journal()
                    (self.logs / "flexiqd.journal").write_text(self._journal)
                    (self.logs / "statuses.json").write_text(json.dumps(self.statuses) + "\n")
                sbx.run(f"systemctl stop {DAEMON} 'flexiq-worker@*' 2>/dev/null; true", timeout=120, check=False)
                self._copy_marks()
        finally:
            if self._own_sandbox and sbx is not None:
                sbx.stop()
                self.sandbox = None

    def _copy_marks(self) -> None:
        """The marks the worker units wrote inside, into ``self.marks`` on this side."""
        inside = pathlib.Path(f"/proc/{self.sandbox.leader}/root") / INSIDE_MARKS.lstrip("/")
        self.marks.mkdir(parents=True, exist_ok=True)
        for path in inside.glob("*.log"):
            shutil.copyfile(path, self.marks / f"systemd-{path.name}")

    # -- what the harness reads ---------------------------------------------------------------

    def ready(self) -> bool:
        """The pool's first worker unit is active (Type=notify: its worker said it is ready)."""
        now = time.monotonic()
        if now - self._last_ready_check < 0.3:
            return False
        self._last_ready_check = now
        state = self.sandbox.run(["systemctl", "is-active", f"flexiq-worker@{POOL}-1.service"], check=False)
        if self.sandbox.run(["systemctl", "is-failed", "-q", DAEMON], check=False).returncode == 0:
            raise RuntimeError(f"flexiqd failed in the sandbox: {self.journal_tail()}")
        return state.stdout.strip() == "active"

    def status(self) -> dict:
        out = self.sandbox.run([str(BIN / "flexiqctl"), "status", "--json"], timeout=30)
        return json.loads(out.stdout)

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            try:
                pool = self.status()["pools"][POOL]
            except Exception:   # a read that fails (the daemon busy starting) is no information
                continue
            decision = pool.get("decision") or {}
            self.statuses.append({"t": round(time.time(), 2), "workers": pool.get("workers"),
                                  "desired": pool.get("desired"), "reason": decision.get("reason"),
                                  "rationale": decision.get("rationale"), "binding_cap": pool.get("binding_cap"),
                                  "binding_cap_workers": pool.get("binding_cap_workers"),
                                  "ceiling": pool.get("ceiling")})

    def _read_journal(self) -> str:
        """The daemon's lines since this fleet started it (the sandbox may have run others before)."""
        if not self._invocation:
            return ""
        return self.sandbox.run(["journalctl", "--no-pager", "-o", "short-precise",
                                 f"_SYSTEMD_INVOCATION_ID={self._invocation}"], check=False).stdout

    def journal(self) -> str:
        if self._journal or self.sandbox is None:
            return self._journal
        return self._read_journal()

    def journal_tail(self, lines: int = 30) -> str:
        return "\n".join(self.journal().splitlines()[-lines:])

    def log_tail(self, chars: int = 1500) -> str:
        return self.journal()[-chars:]

    def binding_caps(self) -> list[str]:
        """The caps the daemon's journal said bound the pool ("bounded by cap knee=2 ..."), in order."""
        return [line.split("bounded by cap ", 1)[1].split(" ", 1)[0]
                for line in self.journal().splitlines() if "bounded by cap " in line]

    def decisions(self, limit: int = 16) -> list[str]:
        """The journal's lines that changed the pool's count (``crowd 2 -> 4: Reason: ...``)."""
        out = []
        for line in self.journal().splitlines():
            text = line.split(": ", 1)[1] if ": " in line else line
            if f" {POOL} " in f" {text}" and " -> " in text and "bounded" not in text:
                out.append(text[-300:])
                if len(out) >= limit:
                    break
        return out

    def held_by(self) -> list[str]:
        """The reasons ``flexiqctl status`` gave while the pool was bound by a cap, in order, deduplicated."""
        seen: list[str] = []
        for status in self.statuses:
            if status["binding_cap"] and (not seen or seen[-1] != f"{status['reason']} {status['binding_cap']}"):
                seen.append(f"{status['reason']} {status['binding_cap']}")
        return seen

