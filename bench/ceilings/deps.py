"""A shared dependency with a real, fixed capacity: ``ceiling(kind, capacity)``.

Three kinds, each a real server on this machine that nobody tells flexiqd about:

- ``cpu``: a PostgreSQL 15 server of its own whose postmaster (and so every backend it
  forks) runs in a cgroup with ``capacity`` CPUs of quota (cgroup v2 ``cpu.max``, or
  cgroup v1's CFS quota where the cpu controller is only on v1).  A job runs a CPU-bound
  statement calibrated to ``job_ms`` unloaded (before the cap); the request path's is
  calibrated to ``probe_ms``.
- ``connections``: pgbouncer (transaction mode) in front of PostgreSQL with
  ``default_pool_size = max_db_connections = capacity`` server connections; a job's
  transaction is ``SELECT pg_sleep(job_ms)``: it holds a server connection that long and
  every other transaction queues in pgbouncer.  The server may be one the caller already
  runs (the tests' session server); otherwise one is started.
- ``threads``: an HTTP service with ``capacity`` handler threads (thread_service.py); a
  job's request blocks a thread ``job_ms`` in ``time.sleep``; other connections wait in
  the accept backlog.

``ceiling`` yields a ``Dependency``: its address, the operations, the environment the
workers of ``tests/apps/ceiling_app.py`` need, and ``client()`` for the harness's own
calls.  Given a ``share`` folder, each kind also listens on a unix socket there, and
``inside_target`` is that address: the systemd sandbox (tests/system/sandbox.py) has a
network of its own but sees the checkout, so a folder in it is how its workers reach a
dependency on this machine.  Everything it started is stopped by pid when the block exits, on errors too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import pathlib
import pwd
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterator

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
APPS = REPO / "tests" / "apps"
# Where the flexiqd package the workers and autoscalers run comes from: this checkout, or
# (``$FLEXIQ_CEILING_CODE``) a directory holding another copy of it, such as an export of a
# commit without the working tree's changes (bench/ceiling_bench.py --code-at).
CODE_ENV = "FLEXIQ_CEILING_CODE"
CODE = pathlib.Path(os.environ.get(CODE_ENV) or REPO)
for _path in (str(REPO / "tests"), str(APPS)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from ceiling_app import KIND_ENV, MARKS_ENV, OP_ENV, OUTSIDE_ENV, TARGET_ENV, DependencyClient  # noqa: E402
from pg_server import PostgresServer  # noqa: E402

from .cgroup import CpuCap, find_hierarchy  # noqa: E402

KINDS = ("cpu", "connections", "threads")
PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
# A statement that burns CPU without touching disk or memory much: generate_series in the
# target list streams its rows (ProjectSet); in FROM it would materialise them.
CPU_SQL = "SELECT sum(x) FROM (SELECT generate_series(1, {rows}) AS x) s"


@dataclasses.dataclass
class Dependency:
    kind: str
    capacity: float
    target: str            # libpq conninfo, or the service's base URL
    job_op: str            # what one job does (SQL, or a path and query)
    probe_op: str          # what one request of the request path does
    description: str
    details: dict = dataclasses.field(default_factory=dict)
    inside_target: str | None = None   # the same over a unix socket in the share folder, or None
    outside_ms: float = 0.0            # a job's own work before it calls the dependency (time.sleep)

    @property
    def slots(self) -> int:
        """Operations it can run at once: its connections or threads; for a CPU cap, its CPUs rounded up."""
        return max(1, math.ceil(self.capacity - 1e-9))

    def expected_knee(self, concurrency: int) -> int:
        """The fewest workers of ``concurrency`` slots that keep every one of its slots busy."""
        return max(1, math.ceil(self.slots / concurrency))

    def environment(self, marks: os.PathLike | str, *, inside: bool = False) -> dict[str, str]:
        """What a worker of ceiling_app needs: the dependency, the job's operation, where to mark.

        ``inside``: for a worker in the systemd sandbox, the address over the share folder."""
        if inside and self.inside_target is None:
            raise ValueError(f"the {self.kind} ceiling was set up without a share folder")
        target = self.inside_target if inside else self.target
        return {KIND_ENV: self.kind, TARGET_ENV: target, OP_ENV: self.job_op, MARKS_ENV: str(marks),
                OUTSIDE_ENV: f"{self.outside_ms:g}", "PYTHONPATH": os.pathsep.join([str(APPS), str(CODE)])}

    def client(self, op: str | None = None) -> DependencyClient:
        return DependencyClient(self.kind, self.target, op or self.job_op)

    def unloaded_ms(self, op: str, n: int = 15) -> float:
        """Median latency of ``op`` run alone, one after another (warm connection)."""
        client = self.client(op)
        try:
            client.call()
            times = []
            for _ in range(n):
                began = time.perf_counter()
                client.call()
                times.append(time.perf_counter() - began)
            return statistics.median(times) * 1000
        finally:
            client.close()


def unavailable_reason(kind: str) -> str | None:
    """Why this machine cannot set up ``kind``, or None when it can."""
    from pg_server import unavailable_reason as pg_reason

    if kind in ("cpu", "connections"):
        reason = pg_reason()
        if reason:
            return reason
    if kind == "connections" and not os.path.exists(PGBOUNCER):
        return "pgbouncer is not installed (apt-get install pgbouncer)"
    if kind == "cpu":
        version, why = find_hierarchy()
        if version is None:
            return f"cannot cap a process's CPU here: {why}"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


def _stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM the process (its own session) by pid, then SIGKILL its group if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group we made it lead: only what it forked
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait()


def _calibrate_cpu(conninfo: str, target_ms: float) -> int:
    """Rows of CPU_SQL that take ``target_ms`` on this (uncapped) server."""
    client = DependencyClient("cpu", conninfo, "")
    try:
        rows = 200_000
        for _ in range(6):
            client.call(CPU_SQL.format(rows=rows))
            times = []
            for _ in range(5):
                began = time.perf_counter()
                client.call(CPU_SQL.format(rows=rows))
                times.append(time.perf_counter() - began)
            took = statistics.median(times) * 1000
            scaled = max(1000, int(rows * target_ms / max(took, 0.05)))
            if abs(scaled - rows) / rows < 0.05:
                return scaled
            rows = scaled
        return rows
    finally:
        client.close()


@contextlib.contextmanager
def _cpu(capacity: float, job_ms: float, probe_ms: float, share: pathlib.Path | None,
         log: Callable[[str], None]) -> Iterator[Dependency]:
    server = PostgresServer(socket_dirs=(share,) if share else ())
    cap = None
    try:
        server.start()
        conninfo = f"host={server.directory} port={server.port} user=postgres dbname=flexiq"
        job_rows = _calibrate_cpu(conninfo, job_ms)
        probe_rows = max(1000, int(job_rows * probe_ms / job_ms))
        cap = CpuCap(capacity)
        import psutil

        cap.add(server.pid)  # first: whatever it forks from now on is born inside
        for child in psutil.Process(server.pid).children(recursive=True):
            with contextlib.suppress(OSError):
                cap.add(child.pid)
        dependency = Dependency(
            "cpu", capacity, conninfo, CPU_SQL.format(rows=job_rows), CPU_SQL.format(rows=probe_rows),
            f"PostgreSQL 15 (pid {server.pid}) capped at {capacity:g} CPU: {cap.describe()}; "
            f"a job sums {job_rows:,} integers ({job_ms:g} ms uncapped), a request {probe_rows:,}",
            {"server_pid": server.pid, "cgroup": str(cap.path), "cgroup_version": cap.version,
             "period_us": cap.period_us, "job_rows": job_rows, "probe_rows": probe_rows},
            f"host={share} port={server.port} user=postgres dbname=flexiq" if share else None)
        log(dependency.description)
        yield dependency
    finally:
        try:
            if cap is not None:
                cap.remove()
        finally:
            server.stop()


@contextlib.contextmanager
def _connections(capacity: float, job_ms: float, probe_ms: float, server: PostgresServer | None,
                 share: pathlib.Path | None, log: Callable[[str], None]) -> Iterator[Dependency]:
    slots = int(capacity)
    if slots != capacity or slots < 1:
        raise ValueError("the connections ceiling needs a whole number of connections")
    own = server is None
    folder = pathlib.Path(tempfile.mkdtemp(prefix="flexiq-pgbouncer-"))
    proc = None
    try:
        if own:
            server = PostgresServer()
            server.start()
        port = _free_port()
        config = folder / "pgbouncer.ini"
        config.write_text(
            "[databases]\n"
            f"dep = host={server.directory} port={server.port} dbname=flexiq user=postgres\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir = {share or ''}\n"
            "auth_type = any\npool_mode = transaction\n"
            f"default_pool_size = {slots}\nmax_db_connections = {slots}\n"
            "min_pool_size = 0\nreserve_pool_size = 0\nmax_client_conn = 2000\n"
            "ignore_startup_parameters = extra_float_digits,options,search_path\n"
            f"logfile = {folder / 'pgbouncer.log'}\nlog_connections = 0\nlog_disconnections = 0\n"
            "log_pooler_errors = 1\nserver_check_delay = 30\n")
        as_user: dict = {}
        if os.geteuid() == 0:  # pgbouncer refuses to run as root
            owner = pwd.getpwnam("postgres")
            os.chown(folder, owner.pw_uid, owner.pw_gid)
            os.chown(config, owner.pw_uid, owner.pw_gid)
            as_user = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}
        with open(folder / "stderr.log", "wb") as stderr:
            proc = subprocess.Popen([PGBOUNCER, str(config)], start_new_session=True, stdout=subprocess.DEVNULL,
                                    stderr=stderr, **as_user)
        conninfo = f"host=127.0.0.1 port={port} user=postgres dbname=dep"

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {(folder / 'stderr.log').read_text()[-2000:]}"
                                   f"{(folder / 'pgbouncer.log').read_text()[-2000:] if (folder / 'pgbouncer.log').exists() else ''}")
            try:
                DependencyClient("connections", conninfo, "SELECT 1").call()
                return True
            except Exception:
                return False

        _wait_until(up, 30, "pgbouncer to accept connections")
        dependency = Dependency(
            "connections", capacity, conninfo, f"SELECT pg_sleep({job_ms / 1000:g})",
            f"SELECT pg_sleep({probe_ms / 1000:g})",
            f"pgbouncer {pgbouncer_version()} (pid {proc.pid}, transaction mode, {slots} server connections) "
            f"in front of PostgreSQL 15 (pid {server.pid}); a job's transaction holds one {job_ms:g} ms "
            f"(pg_sleep), a request {probe_ms:g} ms",
            {"pgbouncer_pid": proc.pid, "server_pid": server.pid, "own_server": own},
            f"host={share} port={port} user=postgres dbname=dep" if share else None)
        log(dependency.description)
        yield dependency
    finally:
        try:
            if proc is not None:
                _stop_process(proc)
        finally:
            if own and server is not None and server.pid is not None:
                server.stop()
            shutil.rmtree(folder, ignore_errors=True)


def pgbouncer_version() -> str:
    try:
        out = subprocess.run([PGBOUNCER, "--version"], capture_output=True, text=True, timeout=10).stdout
        return out.split()[1] if out.startswith("PgBouncer") else "?"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "?"


@contextlib.contextmanager
def _threads(capacity: float, job_ms: float, probe_ms: float, share: pathlib.Path | None,
             log: Callable[[str], None]) -> Iterator[Dependency]:
    threads = int(capacity)
    if threads != capacity or threads < 1:
        raise ValueError("the threads ceiling needs a whole number of threads")
    unix = share / f"threads-{os.getpid()}.sock" if share else None
    proc = subprocess.Popen([sys.executable, str(HERE / "thread_service.py"), "--threads", str(threads),
                             *(["--unix", str(unix)] if unix else [])],
                            start_new_session=True, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line.startswith("port "):
            raise RuntimeError(f"the thread service did not start: {line!r}")
        base = f"http://127.0.0.1:{int(line.split()[1])}"
        dependency = Dependency(
            "threads", capacity, base, f"/work?ms={job_ms:g}", f"/work?ms={probe_ms:g}",
            f"an HTTP service (pid {proc.pid}) with {threads} handler threads, others wait in its accept "
            f"backlog; a job's request blocks a thread {job_ms:g} ms (time.sleep), a request {probe_ms:g} ms",
            {"service_pid": proc.pid}, f"unix:{unix}" if unix else None)
        log(dependency.description)
        yield dependency
    finally:
        _stop_process(proc)


@contextlib.contextmanager
def ceiling(kind: str, capacity: float, *, server: PostgresServer | None = None, job_ms: float = 50.0,
            probe_ms: float = 2.0, share: pathlib.Path | None = None,
            log: Callable[[str], None] = lambda message: None) -> Iterator[Dependency]:
    """Set up a dependency of ``kind`` with ``capacity`` (CPUs, connections or threads); yield it.

    ``server``: a running PostgresServer the ``connections`` kind may put pgbouncer in front
    of (else it starts its own); the ``cpu`` kind always starts its own, since it caps it.
    ``share``: a folder (``share_folder()``) where it also listens on a unix socket.
    """
    if kind == "cpu":
        context = _cpu(capacity, job_ms, probe_ms, share, log)
    elif kind == "connections":
        context = _connections(capacity, job_ms, probe_ms, server, share, log)
    elif kind == "threads":
        context = _threads(capacity, job_ms, probe_ms, share, log)
    else:
        raise ValueError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
    with context as dependency:
        dependency.details["job_unloaded_ms"] = round(dependency.unloaded_ms(dependency.job_op, 7), 2)
        dependency.details["probe_unloaded_ms"] = round(dependency.unloaded_ms(dependency.probe_op), 2)
        yield dependency


@contextlib.contextmanager
def share_folder() -> Iterator[pathlib.Path]:
    """A folder in the checkout that the systemd sandbox sees at the same path, for unix sockets.

    Writable by all with the sticky bit (the servers run as ``postgres``, the sandbox's
    workers as ``flexiq``); removed with what is in it when the block exits.  Short, since a
    unix socket's path is at most 107 bytes."""
    base = REPO / "bench" / ".work"
    base.mkdir(parents=True, exist_ok=True)
    folder = pathlib.Path(tempfile.mkdtemp(prefix="s-", dir=base))
    try:
        folder.chmod(0o1777)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
