"""Fleets of ceiling_app workers against a dependency, and what they achieve.

- ``Store``: flexiqd's job store, a fresh schema on a PostgreSQL server (one per run).
- ``WorkerSampler``: counts the live worker processes under a root pid every 0.2 s.
- Fleets, each a context manager with ``root_pid`` and ``ready()``: ``FixedFleet`` (K
  workers on flexiqd's own ``ProcessFleet``), ``KedaFleet`` (KEDA's depth rule on the same
  fleet), ``AutoscalerFleet`` (``flexiq autoscale --policy flexiqd|flexiq``, a process
  that runs its own workers).
- ``knee_sweep``: fixed fleets of growing size on a steady backlog, throughput per size.
- ``flash_crowd``: M jobs enqueued at once onto a fleet; drain time, worker counts,
  request-path latency, duplicates, lost jobs.  The fleet may also be flexiqd under a real
  systemd (``SystemdDaemonFleet``, systemd_fleet.py).

Every process started here is stopped by its pid (drain-stop, then SIGKILL of the group
it leads) when its context exits, errors included; the sampler remembers every worker
pid it saw, with its start time, and ``kill_leftovers`` ends any still running.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import glob
import json
import math
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable, Iterable
from urllib.parse import quote

import psutil

from flexiqd import Queue
from flexiqd.fleet.base import WorkerSpec, WorkerState
from flexiqd.fleet.process import ProcessFleet

from .deps import CODE, Dependency
from .prober import Prober

APP = "ceiling_app:queue"
TASK = "ceiling_op"
Log = Callable[[str], None]


def _quiet(message: str) -> None:
    pass


# ---------------------------------------------------------------------------------------------
# The store
# ---------------------------------------------------------------------------------------------

class Store:
    """flexiqd's queue in a fresh schema of ``server``, dropped on close."""

    def __init__(self, server) -> None:
        self.server = server
        self.schema = server.fresh_schema()
        self.url = server.socket_url(schema=self.schema)
        self.queue = Queue(self.url)
        self.queue.stats("default")   # creates the tables before any worker starts
        import ceiling_app

        self._task = ceiling_app.ceiling_op
        self._next = 0

    def enqueue(self, n: int) -> None:
        """``n`` jobs of the ceiling task in one transaction (all or none)."""
        jobs = [self._task.new_job((self._next + i,), None) for i in range(n)]
        self._next += n
        self.queue.enqueue_many(jobs)

    def counts(self) -> dict:
        """Jobs by state, and the last finish time (epoch) of a done job."""
        rows = self.server.admin(
            f"SELECT state, count(*), max(finished_at) FROM {self.schema}.flexiq_jobs GROUP BY state",
            database="flexiq")
        out: dict = {"queued": 0, "running": 0, "done": 0, "dead": 0, "cancelled": 0, "last_done": None}
        for state, count, last in rows:
            out[state] = count
            if state == "done":
                out["last_done"] = last
        return out

    def close(self) -> None:
        self.queue.close()
        with contextlib.suppress(Exception):
            self.server.admin(f"DROP SCHEMA {self.schema} CASCADE", database="flexiq")


# ---------------------------------------------------------------------------------------------
# Counting and ending worker processes
# ---------------------------------------------------------------------------------------------

def _is_worker(proc: psutil.Process) -> bool:
    """``python -m flexiqd.cli.flexiq worker ...`` (the process fleet) or ``.../flexiq worker ...`` (a unit)."""
    try:
        cmdline = proc.cmdline()
        program = any(part == "flexiqd.cli.flexiq" or part.endswith("/flexiq") for part in cmdline[:3])
        return proc.status() != psutil.STATUS_ZOMBIE and program and "worker" in cmdline
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


class WorkerSampler:
    """Every ``interval`` s, the live worker processes that are children of ``root_pid``."""

    def __init__(self, root_pid: int, interval: float = 0.2) -> None:
        self.root_pid = root_pid
        self.interval = interval
        self.samples: list[tuple[float, int]] = []   # (epoch, live workers)
        self.seen: dict[int, float] = {}             # pid -> create_time
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-sampler", daemon=True)

    def count(self) -> int:
        try:
            children = psutil.Process(self.root_pid).children()
        except psutil.NoSuchProcess:
            return 0
        live = 0
        for child in children:
            if _is_worker(child):
                live += 1
                if child.pid not in self.seen:
                    with contextlib.suppress(psutil.Error):
                        self.seen[child.pid] = child.create_time()
        return live

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), self.count()))
            self._stop.wait(self.interval)

    def __enter__(self) -> "WorkerSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> list[int]:
        return [n for at, n in self.samples if t0 <= at <= t1]


def kill_leftovers(seen: dict[int, float]) -> int:
    """SIGKILL (by pid, and the group each leads) every remembered worker still running."""
    killed = 0
    for pid, created in seen.items():
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - created) > 0.01 or proc.status() == psutil.STATUS_ZOMBIE:
                continue  # gone, and the pid reused or only a zombie left
        except psutil.NoSuchProcess:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # each worker leads its own session
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        killed += 1
    return killed


def _ready_logs(folder: pathlib.Path) -> int:
    """How many worker logs in ``folder`` say the worker is ready."""
    ready = 0
    for path in glob.glob(str(folder / "*.log")):
        with contextlib.suppress(OSError), open(path, "rb") as handle:
            if b" ready: queues" in handle.read():
                ready += 1
    return ready


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------------
# Fleets
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Settings:
    concurrency: int = 2
    min_workers: int = 1
    max_workers: int = 30
    target_age: float = 10.0
    poll_interval: float = 1.0
    drain_timeout: float = 30.0
    keda_target: int = 5          # KEDA's targetValue: (runnable + running) jobs per worker


def worker_spec(pool: str, store: Store, dependency: Dependency, marks: pathlib.Path,
                settings: Settings) -> WorkerSpec:
    return WorkerSpec(pool=pool, app=APP, queues=("default",), concurrency=settings.concurrency,
                      drain_timeout=settings.drain_timeout, lease_seconds=30.0, store_url=store.url,
                      environment=dependency.environment(marks))


class FixedFleet:
    """K workers on flexiqd's ProcessFleet; ``resize`` grows or drain-stops to a new K."""

    def __init__(self, spec: WorkerSpec, logs: pathlib.Path, workers: int = 0) -> None:
        self.spec = spec
        self.logs = logs
        self.fleet = ProcessFleet(log_dir=str(logs))
        self.root_pid = os.getpid()
        self._initial = workers
        self._started = 0

    def __enter__(self) -> "FixedFleet":
        try:
            self.resize(self._initial)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def active(self) -> list:
        return [w for w in self.fleet.list() if w.pool == self.spec.pool and w.state is WorkerState.ACTIVE]

    def resize(self, workers: int) -> None:
        active = self.active()
        if workers > len(active):
            taken = {w.index for w in self.fleet.list() if w.pool == self.spec.pool}
            free = (i for i in range(1, 10_000) if i not in taken)
            indices = [next(free) for _ in range(workers - len(active))]
            self.fleet.start(self.spec, indices)
            self._started += len(indices)
        elif workers < len(active):
            self.fleet.stop(sorted(active, key=lambda w: w.index)[workers:])

    def ready(self) -> bool:
        """Every worker started so far has said it is ready."""
        return _ready_logs(self.logs) >= self._started

    def close(self) -> None:
        try:
            self.fleet.shutdown(timeout=30)
        finally:
            self.fleet.kill_all()


class KedaFleet:
    """KEDA's rule on the ProcessFleet: every ``poll`` s, desired = ceil((runnable + running) / target).

    Clamped to [min_workers, max_workers], applied at once both ways (no HPA stabilisation
    window or rate policy): the depth rule itself.  A scale-in drain-stops the highest
    indices.  The loop runs on its own thread, the only one touching the fleet until close.
    """

    def __init__(self, spec: WorkerSpec, logs: pathlib.Path, store: Store, settings: Settings) -> None:
        self.fixed = FixedFleet(spec, logs, 0)
        self.store = store
        self.settings = settings
        self.root_pid = os.getpid()
        self.decisions: list[tuple[float, int, int, int]] = []   # (epoch, metric, current, desired)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="keda-loop", daemon=True)

    def desired(self, runnable: int, running: int) -> int:
        s = self.settings
        return max(s.min_workers, min(s.max_workers, math.ceil((runnable + running) / s.keda_target)))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                stats = self.store.queue.stats("default")
                current = len(self.fixed.active())
                desired = self.desired(stats.runnable, stats.running)
                self.decisions.append((time.time(), stats.runnable + stats.running, current, desired))
                if desired != current:
                    self.fixed.resize(desired)
            except Exception as exc:  # a failed read is no information: try again next poll
                self.decisions.append((time.time(), -1, -1, -1))
                print(f"keda loop: {exc!r}", file=sys.stderr)
            self._stop.wait(self.settings.poll_interval)

    def __enter__(self) -> "KedaFleet":
        self.fixed.__enter__()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.fixed.close()

    def ready(self) -> bool:
        return self.fixed._started >= 1 and self.fixed.ready()


class AutoscalerFleet:
    """``flexiq autoscale --policy <policy>`` on the process fleet, as its own process."""

    def __init__(self, policy: str, store: Store, dependency: Dependency, marks: pathlib.Path,
                 logs: pathlib.Path, settings: Settings) -> None:
        self.policy = policy
        self.log_path = logs / "autoscaler.log"
        s = settings
        self.command = [sys.executable, "-m", "flexiqd.cli.flexiq", "--url", store.url, "autoscale",
                        "--policy", policy, "--app", APP, "--concurrency", str(s.concurrency),
                        "--min-workers", str(s.min_workers), "--max-workers", str(s.max_workers),
                        "--target-age", f"{s.target_age:g}s", "--poll-interval", f"{s.poll_interval:g}s",
                        "--drain-timeout", f"{s.drain_timeout:g}s"]
        self.env = dict(os.environ, **dependency.environment(marks))
        self.env.pop("NOTIFY_SOCKET", None)
        self.proc: subprocess.Popen | None = None
        self.root_pid = 0
        self.sampler: WorkerSampler | None = None   # set by the caller, for the leftovers

    def __enter__(self) -> "AutoscalerFleet":
        with open(self.log_path, "wb") as output:
            self.proc = subprocess.Popen(self.command, env=self.env, cwd=str(CODE), start_new_session=True,
                                         stdout=output, stderr=subprocess.STDOUT)
        self.root_pid = self.proc.pid
        return self

    def ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"flexiq autoscale exited ({self.proc.returncode}): {self.log_tail()}")
        with contextlib.suppress(OSError):
            return b" ready: queues" in self.log_path.read_bytes()
        return False

    def log_tail(self, chars: int = 1500) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def decisions(self, limit: int = 12) -> list[str]:
        """The autoscaler's decisions that changed the count (flexiq's log format), the first ``limit``."""
        out = []
        with contextlib.suppress(OSError):
            for line in self.log_path.read_text(errors="replace").splitlines():
                if "autoscale: pending=" in line:
                    text = line.split("autoscale: ", 1)[1]
                    head = text.split(" (", 1)[0]   # pending=P running=R workers=C -> D
                    try:
                        current = int(head.split("workers=")[1].split()[0])
                        desired = int(head.split("-> ")[1])
                    except (IndexError, ValueError):
                        continue
                    if current != desired:
                        out.append(line[11:19] + " " + text[:240])
                        if len(out) >= limit:
                            break
        return out

    def __exit__(self, *exc: object) -> None:
        proc = self.proc
        if proc is None:
            return
        try:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)   # it drains its workers, then exits
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            if proc.poll() is None:
                proc.wait()
            if self.sampler is not None:
                kill_leftovers(self.sampler.seen)


def probe_of(dependency: Dependency, *, inside: bool = False) -> dict:
    """``dependencies.<name>.probe`` timing the request path's own request on ``dependency``
    (``inside``: over its socket in the share folder, for a daemon in the systemd sandbox)."""
    target = dependency.inside_target if inside else dependency.target
    if dependency.kind == "threads":
        if inside:
            raise ValueError("the daemon's http probe has no unix sockets: no probe of the threads "
                             "ceiling from inside the systemd sandbox")
        return {"http": target.rstrip("/") + dependency.probe_op}
    fields = dict(part.split("=", 1) for part in target.split())
    url = (f"postgresql://{fields.get('user', 'postgres')}@/{fields['dbname']}"
           f"?host={quote(fields['host'], safe='')}&port={fields['port']}")
    return {"postgresql": url, "statement": dependency.probe_op}


class DaemonFleet:
    """flexiqd itself (``fleet: process``) with one pool of ceiling_app workers, as its own process.

    The dependency is declared with a capacity far above what it serves (nobody told flexiqd
    its ceiling) and, when ``probe`` is given, that probe; ``knee`` False turns the
    throughput knee off, so that what holds the pool is the probe alone."""

    def __init__(self, store: Store, dependency: Dependency, marks: pathlib.Path, logs: pathlib.Path,
                 settings: Settings, *, probe: dict | None = None, knee: bool = True) -> None:
        s = settings
        dep = {"capacity": 10_000}
        if probe is not None:
            dep["probe"] = probe
        pool = {"app": APP, "queues": ["default"], "concurrency": s.concurrency, "min_workers": s.min_workers,
                "max_workers": s.max_workers, "drain_timeout": f"{s.drain_timeout:g}s",
                "targets": {"age": f"{s.target_age:g}s"}, "uses": {"dep": {"per_worker": 1}}}
        if not knee:
            pool["knee"] = {"enabled": False}
        config = {"store": store.url, "tick": f"{s.poll_interval:g}s", "fleet": "process",
                  "dependencies": {"dep": dep}, "pools": {"crowd": pool}}
        self.config_path = logs / "flexiqd.yaml"
        self.config_path.write_text(json.dumps(config, indent=1) + "\n")   # JSON is YAML
        self.log_path = logs / "flexiqd.log"
        self.command = [sys.executable, "-m", "flexiqd.cli.daemon", "--config", str(self.config_path)]
        self.env = dict(os.environ, **dependency.environment(marks))
        for name in ("NOTIFY_SOCKET", "STATE_DIRECTORY", "RUNTIME_DIRECTORY"):
            self.env.pop(name, None)
        self.cwd = logs
        self.proc: subprocess.Popen | None = None
        self.root_pid = 0
        self.sampler: WorkerSampler | None = None

    def __enter__(self) -> "DaemonFleet":
        with open(self.log_path, "wb") as output:
            self.proc = subprocess.Popen(self.command, env=self.env, cwd=str(self.cwd), start_new_session=True,
                                         stdout=output, stderr=subprocess.STDOUT)
        self.root_pid = self.proc.pid
        return self

    def ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"flexiqd exited ({self.proc.returncode}): {self.log_tail()}")
        return _ready_logs(self.cwd) >= 1 or b" ready: queues" in self._log()

    def _log(self) -> bytes:
        with contextlib.suppress(OSError):
            return self.log_path.read_bytes()
        return b""

    def log_tail(self, chars: int = 1500) -> str:
        return self._log().decode(errors="replace")[-chars:]

    def binding_caps(self) -> list[str]:
        """The caps the daemon said bound the pool ("Pool crowd: bounded by cap probe:dep=2 ..."), in order."""
        return [line.split("bounded by cap ", 1)[1].split(" ", 1)[0]
                for line in self._log().decode(errors="replace").splitlines() if "bounded by cap " in line]

    def decisions(self, limit: int = 16) -> list[str]:
        """The daemon's lines that changed the pool's count (``crowd 2 -> 4: Reason: ...``)."""
        out = []
        for line in self._log().decode(errors="replace").splitlines():
            if " crowd " in f" {line}" and " -> " in line and ": " in line and "bounded" not in line:
                out.append(line[-300:])
                if len(out) >= limit:
                    break
        return out

    __exit__ = AutoscalerFleet.__exit__


# ---------------------------------------------------------------------------------------------
# Executions
# ---------------------------------------------------------------------------------------------

def read_marks(marks: pathlib.Path) -> tuple[collections.Counter, collections.Counter]:
    """(starts per job id, ends per job id) from ceiling_app's marks."""
    starts: collections.Counter = collections.Counter()
    ends: collections.Counter = collections.Counter()
    for path in marks.glob("*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2:
                (starts if parts[0] == "start" else ends)[int(parts[1])] += 1
    return starts, ends


# ---------------------------------------------------------------------------------------------
# The knee
# ---------------------------------------------------------------------------------------------

def sweep_counts(max_workers: int) -> list[int]:
    counts = [c for c in (1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 30, 40, 48, 64) if c < max_workers]
    return counts + [max_workers]


def knee_of(points: list[dict], within: float = 0.05) -> int:
    """The fewest workers whose throughput is within ``within`` of the best."""
    best = max(p["jobs_per_s"] for p in points)
    return min(p["workers"] for p in points if p["jobs_per_s"] >= (1 - within) * best)


def knee_sweep(dependency: Dependency, server, workdir: pathlib.Path, counts: Iterable[int], *,
               settings: Settings = Settings(), prober: Prober | None = None, warmup: float = 1.5,
               window: float = 4.0, min_jobs: int = 200, max_window: float = 12.0,
               log: Log = _quiet) -> dict:
    """Throughput of fixed fleets of ``counts`` workers on a steady backlog, and the knee.

    One store, one fleet grown from count to count (never shrunk): at each count, once
    every worker is ready and ``warmup`` s have passed, the jobs done over at least
    ``window`` s (longer, up to ``max_window``, until ``min_jobs`` are done) give the
    rate.  The backlog is topped up so it never runs dry.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    marks, logs = workdir / "marks", workdir / "logs"
    marks.mkdir(exist_ok=True)
    logs.mkdir(exist_ok=True)
    store = Store(server)
    points = []
    began = time.monotonic()
    try:
        spec = worker_spec("sweep", store, dependency, marks, settings)
        with FixedFleet(spec, logs) as fleet:
            for count in counts:
                fleet.resize(count)
                _wait(fleet.ready, 60, f"{count} workers to be ready")
                backlog = store.counts()["queued"]
                want = max(1000, 3 * count * settings.concurrency + 50 * count)
                if backlog < want:
                    store.enqueue(want - backlog + 1000)
                time.sleep(warmup)
                t1, done1 = time.time(), store.counts()["done"]
                time.sleep(window)
                t2, done2 = time.time(), store.counts()["done"]
                while done2 - done1 < min_jobs and t2 - t1 < max_window:
                    if store.counts()["queued"] < 2 * count * settings.concurrency + 100:
                        store.enqueue(1000)
                    time.sleep(0.5)
                    t2, done2 = time.time(), store.counts()["done"]
                point = {"workers": count, "jobs_per_s": round((done2 - done1) / (t2 - t1), 2),
                         "seconds": round(t2 - t1, 2), "jobs": done2 - done1}
                if prober is not None:
                    point["request"] = prober.summary(t1, t2)
                points.append(point)
                log(f"  sweep: {count:>2} workers -> {point['jobs_per_s']:7.1f} jobs/s"
                    + (f", request p95 {point['request']['p95_ms']} ms" if prober is not None else ""))
        starts, _ = read_marks(marks)
    finally:
        store.close()
    knee = knee_of(points)
    best = max(points, key=lambda p: p["jobs_per_s"])
    return {"points": points, "knee": knee, "best_jobs_per_s": best["jobs_per_s"], "best_workers": best["workers"],
            "expected_knee": dependency.expected_knee(settings.concurrency),
            "duplicates": sum(1 for n in starts.values() if n > 1), "seconds": round(time.monotonic() - began, 1)}


# ---------------------------------------------------------------------------------------------
# A flash crowd
# ---------------------------------------------------------------------------------------------

def _settle(samples: list[tuple[float, int]], t0: float, t1: float) -> float | None:
    second_half = [n for at, n in samples if (t0 + t1) / 2 <= at <= t1]
    return statistics.median(second_half) if second_half else None


def _timeline(samples: list[tuple[float, int]], t0: float, t1: float, step: float = 1.0) -> list[list]:
    """The worker count once per ``step`` s from t0 to t1 (the last sample at or before each)."""
    out, i, last = [], 0, None
    at = t0
    while at <= t1 + 1e-9:
        while i < len(samples) and samples[i][0] <= at:
            last = samples[i][1]
            i += 1
        out.append([round(at - t0, 1), last])
        at += step
    return out


def flash_crowd(policy: str, dependency: Dependency, server, workdir: pathlib.Path, jobs: int, *,
                settings: Settings = Settings(), prober: Prober, idle: float = 2.0, timeout: float = 600.0,
                log: Log = _quiet, probe: dict | None = None, knee: bool = True, sandbox=None,
                share: pathlib.Path | None = None) -> dict:
    """Enqueue ``jobs`` at once onto ``policy``'s fleet (at rest first); measure the drain.

    ``policy``: ``flexiqd`` or ``flexiq`` (``flexiq autoscale``), ``keda``, ``fixed-K``, or
    ``daemon`` (flexiqd itself on the process fleet, with ``probe`` declared on the dependency
    when given and its knee off when ``knee`` is False; its ``binding_caps`` are reported),
    ``daemon-probe`` (the same with ``probe_of(dependency)``), ``daemon-probe-only`` (that
    probe, the knee off); ``daemon-systemd`` (flexiqd.service and worker units under the real
    systemd of ``sandbox``, or of one booted for this crowd; the store and the dependency
    reached over unix sockets in ``share``, the folder ``server`` and ``dependency`` were
    given; ``probe`` and ``knee`` as for ``daemon``), ``daemon-systemd-probe`` (with the probe
    of the dependency's socket).  For the daemons, ``status_seen`` lists the reasons
    ``flexiqctl status``/the log gave while a cap held the pool.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    marks, logs = workdir / "marks", workdir / "logs"
    marks.mkdir(exist_ok=True)
    logs.mkdir(exist_ok=True)
    store = Store(server)
    result: dict = {"policy": policy, "jobs": jobs}
    try:
        spec = worker_spec("crowd", store, dependency, marks, settings)
        if policy.startswith("fixed-"):
            fleet = FixedFleet(spec, logs, int(policy.split("-", 1)[1]))
        elif policy == "keda":
            fleet = KedaFleet(spec, logs, store, settings)
        elif policy in ("flexiqd", "flexiq"):
            fleet = AutoscalerFleet(policy, store, dependency, marks, logs, settings)
        elif policy.startswith("daemon-systemd"):
            from .systemd_fleet import SystemdDaemonFleet

            if share is None:
                raise ValueError(f"{policy} needs the share folder the store and the dependency listen in")
            if probe is None and policy == "daemon-systemd-probe":
                probe = probe_of(dependency, inside=True)
            fleet = SystemdDaemonFleet(server.socket_url(schema=store.schema, directory=share), dependency, marks,
                                       logs, settings, sandbox=sandbox, probe=probe, knee=knee)
        elif policy.startswith("daemon"):
            # daemon: its knee, no probe; daemon-probe: both; daemon-probe-only: the probe, no knee.
            if probe is None and policy.startswith("daemon-probe"):
                probe = probe_of(dependency)
            fleet = DaemonFleet(store, dependency, marks, logs, settings, probe=probe,
                                knee=knee and policy != "daemon-probe-only")
        else:
            raise ValueError(f"unknown policy {policy!r}")
        with fleet:
            with WorkerSampler(fleet.root_pid) as sampler:
                if hasattr(fleet, "sampler"):
                    fleet.sampler = sampler
                _wait(fleet.ready, 90, f"{policy}'s workers to be ready")
                rest = time.time()
                time.sleep(idle)
                t0 = time.time()
                store.enqueue(jobs)
                enqueued = time.time()
                deadline = time.monotonic() + timeout
                while True:
                    counts = store.counts()
                    if counts["done"] + counts["dead"] + counts["cancelled"] >= jobs:
                        break
                    if time.monotonic() > deadline:
                        result["timed_out"] = True
                        break
                    time.sleep(0.25)
                ended = time.time()
            counts = store.counts()
            t_end = counts["last_done"] or ended
            if result.get("timed_out"):
                t_end = ended
        # After the fleet's exit: a daemon under systemd has its journal saved by then.
        if hasattr(fleet, "decisions") and not isinstance(fleet, KedaFleet):
            result["decisions"] = fleet.decisions()
        if hasattr(fleet, "binding_caps"):
            result["binding_caps"] = fleet.binding_caps()
        if hasattr(fleet, "held_by"):
            result["status_seen"] = fleet.held_by()
            result["statuses"] = [dict(status, t=round(status["t"] - t0, 1)) for status in fleet.statuses]
        if isinstance(fleet, KedaFleet):
            result["decisions"] = [f"+{at - t0:.1f}s metric={m} workers={c} -> {d}"
                                   for at, m, c, d in fleet.decisions if c != d and at >= t0][:12]
        starts, ends = read_marks(marks)
        drain = t_end - t0
        during = sampler.between(t0, t_end)
        result.update({
            "drain_s": round(drain, 2), "enqueue_s": round(enqueued - t0, 3),
            "done": counts["done"], "dead": counts["dead"],
            "jobs_per_s": round(counts["done"] / drain, 2) if drain > 0 else None,
            "settle_workers": _settle(sampler.samples, t0, t_end),
            "max_workers": max(during) if during else None,
            "mean_workers": round(statistics.fmean(during), 2) if during else None,
            "duplicates": sum(1 for n in starts.values() if n > 1),
            "executions": sum(starts.values()), "lost": jobs - counts["done"],
            "request": prober.summary(t0, t_end), "request_at_rest": prober.summary(rest, t0),
            "workers_timeline": _timeline(sampler.samples, t0, t_end),
        })
        leftovers = kill_leftovers(sampler.seen)
        if leftovers:
            result["leftover_workers_killed"] = leftovers
    finally:
        store.close()
    req = result.get("request", {})
    log(f"  {policy:>9}: drain {result.get('drain_s')} s, workers settle {result.get('settle_workers')} "
        f"max {result.get('max_workers')}, request p50/p95 {req.get('p50_ms')}/{req.get('p95_ms')} ms, "
        f"dup {result.get('duplicates')}, lost {result.get('lost')}")
    return result

