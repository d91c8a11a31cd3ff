"""flexiq's autoscaler interface, kept so its users move over unchanged.

``Autoscaler(queue, app=..., max_workers=...)`` runs one pool of workers on
this machine -- child processes by default, systemd units with
``fleet="systemd"`` -- sized by the flexiq formula (``policy="flexiq"``, the
default here: same options, same rationale strings, without its defects) or by
flexiqd's own policy (``policy="flexiqd"``).  It is the daemon's controller
underneath, so both behave alike.

flexiq 2.1's Python names work too: ``AutoscaleConfig(app_path=...,
threads_per_worker=..., scale_down_window_sec=...)`` (and the same names read
back as attributes), ``AutoscaleController(queue, config)`` with ``tick`` and
``serve_forever``, ``compute_desired_workers(pending=..., running=...,
current_workers=..., config=...)``, and ``flexiq autoscale --threads-per-worker``.
Each decision is logged as flexiq logs it
(``autoscale: pending=P running=R workers=C -> D (rationale)``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import tempfile
import threading
import time
from typing import Any

import yaml

from .config import DaemonConfig, parse_config
from .daemon import pacing
from .daemon.compose import build_controller
from .daemon.controller import Controller
from .errors import ConfigError
from .fleet.base import Fleet, WorkerState
from .fleet.process import ProcessFleet
from .policy.flexiq_compat import LOG_FORMAT
from .policy.flexiq_compat import compute_desired_workers as _flexiq_formula
from .queue.api import Queue
from .settings_schema import autoscale_default

log = logging.getLogger(__name__)

# flexiq 2.1's AutoscaleConfig field names -> ours (flexiq/autoscale/config.py).
FLEXIQ_NAMES = {
    "app_path": "app",
    "scale_up_window_sec": "scale_up_window",
    "scale_down_window_sec": "scale_down_window",
    "poll_interval_sec": "poll_interval",
    "drain_timeout_sec": "drain_timeout",
    "threads_per_worker": "concurrency",
}


@dataclasses.dataclass(frozen=True)
class AutoscaleConfig:
    """Every option of flexiq's autoscaler, and flexiqd's policy options beside them.

    Each is a pool's setting or one of its own (``flexiqd.settings_schema.AUTOSCALE_FIELDS``),
    with flexiq's defaults where they differ from a pool's.
    """

    app: str
    min_workers: int = autoscale_default("min_workers")
    max_workers: int = autoscale_default("max_workers")
    target_queue_depth_per_worker: int = autoscale_default("target_queue_depth_per_worker")
    target_utilisation: float = autoscale_default("target_utilisation")
    scale_up_window: float = autoscale_default("scale_up_window")
    scale_down_window: float = autoscale_default("scale_down_window")
    tolerance: float = autoscale_default("tolerance")
    poll_interval: float = autoscale_default("poll_interval")
    drain_timeout: float = autoscale_default("drain_timeout")
    concurrency: int = autoscale_default("concurrency")
    queues: tuple[str, ...] = autoscale_default("queues")
    batch_size: int | None = autoscale_default("batch_size")
    # flexiqd's own
    policy: str = autoscale_default("policy")
    target_age: float = autoscale_default("target_age")
    target_drain_time: float | None = autoscale_default("target_drain_time")
    scale_to_zero: bool = autoscale_default("scale_to_zero")
    cpu_bound: bool = autoscale_default("cpu_bound")
    fleet: str = autoscale_default("fleet")
    pool: str = autoscale_default("pool")

    # flexiq 2.1's names for the same values, read-only.
    app_path = property(lambda self: self.app)
    scale_up_window_sec = property(lambda self: self.scale_up_window)
    scale_down_window_sec = property(lambda self: self.scale_down_window)
    poll_interval_sec = property(lambda self: self.poll_interval)
    drain_timeout_sec = property(lambda self: self.drain_timeout)
    threads_per_worker = property(lambda self: self.concurrency)


def _accept_flexiq_names(cls):
    """Let ``cls(...)`` take flexiq's field names as well as ours (not both for one field)."""
    generated = cls.__init__

    def __init__(self, *args: Any, **options: Any) -> None:
        for theirs, ours in FLEXIQ_NAMES.items():
            if theirs in options:
                if ours in options:
                    raise ConfigError(f"AutoscaleConfig: give {ours}= or flexiq's {theirs}=, not both")
                options[ours] = options.pop(theirs)
        generated(self, *args, **options)

    __init__.__doc__ = generated.__doc__
    cls.__init__ = __init__
    return cls


AutoscaleConfig = _accept_flexiq_names(AutoscaleConfig)


@dataclasses.dataclass(frozen=True)
class ScaleDecision:
    """One tick, as flexiq reports it."""

    pending: int
    running: int
    current_workers: int
    desired_workers: int
    rationale: str


def daemon_config(config: AutoscaleConfig, store: str) -> DaemonConfig:
    """The daemon's config for this one pool (validated like a config file)."""
    pool: dict[str, Any] = {
        "app": config.app, "queues": list(config.queues), "concurrency": config.concurrency,
        "drain_timeout": config.drain_timeout, "policy": config.policy,
        "min_workers": config.min_workers, "max_workers": config.max_workers,
        "scale_to_zero": config.scale_to_zero, "cpu_bound": config.cpu_bound,
        "targets": {"age": config.target_age, "utilisation": config.target_utilisation,
                    "lead_time": min(10.0, config.target_age / 2),
                    **({"drain_time": config.target_drain_time} if config.target_drain_time else {})},
        "behavior": {"up_window": config.scale_up_window, "down_window": config.scale_down_window,
                     "tolerance": config.tolerance},
        "flexiq": {"target_queue_depth_per_worker": config.target_queue_depth_per_worker,
                   "target_utilisation": config.target_utilisation, "tolerance": config.tolerance,
                   "scale_up_window": config.scale_up_window,
                   "scale_down_window": config.scale_down_window},
    }
    if config.batch_size is not None:
        pool["batch_size"] = config.batch_size
    if config.fleet == "systemd":
        # Child processes inherit where the app is importable from; units do not: carry it over.
        paths = [os.getcwd(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        pool["environment"] = {"PYTHONPATH": os.pathsep.join(paths)}
    text = yaml.safe_dump({"store": store, "tick": config.poll_interval, "fleet": config.fleet,
                           "pools": {config.pool: pool}})
    try:
        return parse_config(text, "autoscale options")
    except ConfigError as exc:
        # Name the option as the caller spelled it, not as the generated file does.
        raise ConfigError(str(exc).replace(f"autoscale options: pools.{config.pool}.", "option ")
                          .replace("autoscale options: ", "option ")) from None


class ProcessManager:
    """flexiq's process manager, over one pool of the process fleet."""

    def __init__(self, fleet: ProcessFleet, controller: Controller, pool: str) -> None:
        self._fleet = fleet
        self._controller = controller
        self._pool = pool
        self._known: set[int] = set()

    def _spec(self):
        config = self._controller.config
        return config.pools[self._pool].worker_spec(config.store)

    def spawn_worker(self) -> int:
        taken = {w.index for w in self._fleet.list() if w.pool == self._pool}
        index = next(i for i in range(1, len(taken) + 2) if i not in taken)
        pid = self._fleet.spawn(self._spec(), index)
        self._known.add(pid)
        return pid

    def terminate_worker(self, pid: int, timeout: float | None = None) -> None:
        """Drain-stop the worker with this pid and wait until it exited."""
        for worker in self._fleet.list():
            if worker.pid == pid and worker.state is WorkerState.ACTIVE:
                self._fleet.stop([worker])
        deadline = time.monotonic() + (timeout if timeout is not None else self._spec().stop_timeout)
        while pid in self.live_pids() and time.monotonic() < deadline:
            time.sleep(0.05)

    def reap_dead(self) -> list[int]:
        """Pids of this pool's workers that exited since the last call."""
        live = set(self.live_pids())
        dead = sorted(self._known - live)
        self._known = live
        return dead

    def count_live(self) -> int:
        return len(self.live_pids())

    def live_pids(self) -> list[int]:
        workers = [w for w in self._fleet.list() if w.pool == self._pool and w.state is not WorkerState.FAILED]
        pids = [w.pid for w in workers if w.pid]
        self._known |= set(pids)
        return pids

    def shutdown(self) -> None:
        """Drain every worker of the pool and wait for all of them."""
        self._fleet.shutdown(self._pool)

    def kill_all(self) -> None:
        self._fleet.kill_all()


class Autoscaler:
    """Sizes one pool of workers for ``queue``.  ``tick`` may be called by hand or by ``start``."""

    def __init__(self, queue: Queue, config: AutoscaleConfig | None = None, **options: Any) -> None:
        if config is None:
            if "app" not in options and "app_path" not in options:
                raise ConfigError("Autoscaler needs app='module:attribute' (the workers' Queue)")
            config = AutoscaleConfig(**{k: tuple(v) if k == "queues" else v for k, v in options.items()})
        self.config = config
        self.queue = queue
        self._daemon_config = daemon_config(config, queue.url)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._woken = threading.Event()  # new work, or a stop: decide now
        self._thread: threading.Thread | None = None
        self._fleet: Fleet
        self.process_manager: ProcessManager | None = None
        # Wired as the daemon's controller is (daemon.compose); without a state folder, what it
        # learns (histories, the knee's measurements, start costs) is kept in memory only.
        self._fleet = self._systemd_fleet() if config.fleet == "systemd" else ProcessFleet()
        self.controller = build_controller(self._daemon_config, queue.backend, self._fleet)
        if isinstance(self._fleet, ProcessFleet):
            self.process_manager = ProcessManager(self._fleet, self.controller, config.pool)

    def _systemd_fleet(self):
        from .fleet.systemd import Systemd, SystemdFleet, open_bus

        # Worker units read their pool from a config file: write this pool's where they can.
        folder = "/run/flexiqd" if os.access("/run", os.W_OK) else tempfile.gettempdir()
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"autoscale-{self.config.pool}.yaml")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(self._daemon_config.source)  # the validated config this autoscaler runs
        return SystemdFleet(Systemd(open_bus()), config_path=path)

    def tick(self) -> ScaleDecision:
        """One decision, applied; returns what was decided."""
        with self._lock:
            decision = self.controller.tick().get(self.config.pool)
        if decision is None:  # the fleet could not be listed: nothing was decided
            current = self.current_workers()
            return ScaleDecision(0, 0, current, current, "stable: fleet unavailable, holding")
        view = self.controller.published.views.get(self.config.pool)
        rationale = decision.message
        metrics = view.metrics if view is not None else None
        return ScaleDecision(pending=metrics.runnable_depth if metrics else 0,
                             running=metrics.running if metrics else 0,
                             current_workers=decision.current, desired_workers=decision.desired,
                             rationale=rationale)

    def current_workers(self) -> int:
        return sum(1 for w in self._fleet.list()
                   if w.pool == self.config.pool and w.state in (WorkerState.ACTIVE, WorkerState.STARTING))

    def start(self) -> None:
        """Tick every ``poll_interval`` on a background thread until ``stop``."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="flexiq-autoscaler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # New work on the pool's queues wakes the loop (the daemon's pacing): a burst is
        # answered at once, not at the next poll.
        queues = self._daemon_config.pools[self.config.pool].queues
        unsubscribe = self.queue.backend.subscribe(queues, self._woken.set)
        last_new_work = -math.inf
        follow_up: float | None = None
        try:
            while not self._stop.is_set():
                last_tick = time.monotonic()
                try:
                    decision = self.tick()
                    log.info(LOG_FORMAT, decision.pending, decision.running, decision.current_workers,
                             decision.desired_workers, decision.rationale)
                except Exception:  # a bad tick must not end autoscaling; the next one retries
                    log.exception("autoscale: tick failed")
                if follow_up is not None and follow_up <= last_tick:
                    follow_up = None
                due = pacing.due_at(self.controller.next_due, self.controller.clock(), time.monotonic())
                soon = follow_up
                if self.controller.waits_on_stopping:
                    # Growth waits for stopping workers to exit: look again soon, not a poll later.
                    soon = pacing.stopping_follow_up(last_tick, follow_up)
                deadline = pacing.next_tick(last_tick, self.config.poll_interval, due, soon)
                if self._woken.wait(max(0.0, deadline - time.monotonic())) and not self._stop.is_set():
                    self._woken.clear()
                    at, follow_up = pacing.after_new_work(time.monotonic(), last_new_work)
                    last_new_work = at
                    self._stop.wait(max(0.0, at - time.monotonic()))
        finally:
            unsubscribe()

    def stop(self) -> None:
        """Stop ticking, then drain every worker (they finish or release their jobs) and wait."""
        self._stop.set()
        self._woken.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            self.controller.close()
            # Child processes are drained and waited for; units are asked to drain.
            self._fleet.stop_pool(self.config.pool)


class AutoscaleController(Autoscaler):
    """flexiq 2.1's name for the autoscaler: ``AutoscaleController(queue, config)``."""

    def serve_forever(self) -> None:
        """Run until SIGTERM/SIGINT, then drain every worker (flexiq's ``serve_forever``)."""
        _serve(self)


def compute_desired_workers(*, pending: int, running: int, current_workers: int,
                            config: AutoscaleConfig) -> ScaleDecision:
    """flexiq 2.1's pure decision, with its keyword signature: one poll, no windows."""
    result = _flexiq_formula(
        pending, running, current_workers, min_workers=config.min_workers, max_workers=config.max_workers,
        target_queue_depth_per_worker=config.target_queue_depth_per_worker,
        target_utilisation=config.target_utilisation, concurrency_per_worker=config.concurrency,
        tolerance=config.tolerance)
    return ScaleDecision(pending=pending, running=running, current_workers=max(0, current_workers),
                         desired_workers=result.desired_workers, rationale=result.rationale)


def serve_autoscaler(queue: Queue, config: AutoscaleConfig | None = None, **options: Any) -> None:
    """Run the autoscaler in the foreground; return once SIGTERM/SIGINT arrived and every worker drained."""
    _serve(Autoscaler(queue, config, **options))


def _serve(autoscaler: Autoscaler) -> None:
    stop = threading.Event()
    previous = {signum: signal.signal(signum, lambda *_: stop.set()) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        autoscaler.start()
        while not stop.wait(0.5):
            pass
    finally:
        autoscaler.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
