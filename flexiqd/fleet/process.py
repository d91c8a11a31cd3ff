"""Workers as child processes, for machines without systemd (a laptop, a container).

Each worker runs in its own process group.  A drain-stop sends SIGUSR1 (stop
claiming) and SIGTERM to the worker itself -- like systemd's ``KillMode=mixed``
-- and SIGKILLs the whole group once its stop timeout has passed.  Workers
start with SIGUSR1/SIGUSR2 blocked (they unblock them once their handlers are
in), so a pause sent while one is starting waits for it instead of killing it.
Unlike the systemd fleet, this one's memory *is* the source of truth: its
workers die with it, so ``leave`` drains them all and waits.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Iterable, Mapping, Sequence

from ..queue.url import URL_ENV
from ..runtime_files import PAUSED_FILE_ENV
from .base import Fleet, WorkerInfo, WorkerSpec, WorkerState, instance_name, parse_instance
from .dropin import CONFIG_ENV

log = logging.getLogger(__name__)

# Held until the worker's handlers are in place: their default action would kill it.
BLOCKED_UNTIL_READY = {signal.SIGUSR1, signal.SIGUSR2}


@dataclasses.dataclass
class _Child:
    spec: WorkerSpec
    index: int
    proc: subprocess.Popen
    started_at: float
    launched: float | None = None        # time.monotonic() at the spawn
    stop_deadline: float | None = None   # monotonic; set once asked to stop
    killed: bool = False

    @property
    def draining(self) -> bool:
        return self.stop_deadline is not None


def worker_command(spec: WorkerSpec, index: int, config_path: str | None = None) -> list[str]:
    """The command line of worker ``<pool>-<index>``.

    With the daemon's published config the worker takes its pool's settings from
    there (and re-reads them on a reload); without one they are spelled out.
    """
    instance = instance_name(spec.pool, index)
    python = spec.python or sys.executable
    if config_path:
        return [python, "-m", "flexiqd.cli.flexiq", "worker", "--instance", instance,
                "--config", config_path]
    # The store's URL (it may hold a password) goes in the environment, which only the
    # worker's user can read, never on a command line that every user sees.
    return [python, "-m", "flexiqd.cli.flexiq", "worker",
            "--app", spec.app, "--queues", ",".join(spec.queues),
            "--concurrency", str(spec.concurrency), "--lease", f"{spec.lease_seconds:g}",
            "--drain-timeout", f"{spec.drain_timeout:g}", "--instance", instance,
            *(["--batch-size", str(spec.batch_size)] if spec.batch_size else [])]


def spawn_with_signals_blocked(command: Sequence[str], *, env: Mapping[str, str],
                               output=None) -> subprocess.Popen:
    """Popen ``command`` in a new session with SIGUSR1/SIGUSR2 blocked in the child.

    The mask is set on the calling thread around the fork (the child inherits it),
    not with ``preexec_fn``, which is unsafe in a process with threads.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED_UNTIL_READY)
    try:
        return subprocess.Popen(list(command), env=dict(env), start_new_session=True,
                                stdout=output, stderr=subprocess.STDOUT if output else None)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class ProcessFleet(Fleet):
    """Not thread-safe: one controller drives it."""

    def __init__(self, *, log_dir: str | None = None, config_path: str | None = None,
                 paused_path: str | None = None) -> None:
        super().__init__()
        self._children: dict[tuple[str, int], _Child] = {}
        self._failed: dict[tuple[str, int], WorkerInfo] = {}
        self._endings: dict[int, str] = {}  # pid -> how a failed worker's process ended
        self._specs: dict[str, WorkerSpec] = {}
        self._log_dir = log_dir
        self.config_path = config_path
        self.paused_path = paused_path

    def configure(self, specs: Iterable[WorkerSpec]) -> None:
        self._specs = {spec.pool: spec for spec in specs}
        for (pool, _), child in self._children.items():
            # A later stop of a running worker uses the new stop timeout; the worker
            # itself re-reads its drain budget from the published config.
            if pool in self._specs and not child.draining:
                child.spec = self._specs[pool]

    def start(self, spec: WorkerSpec, indices: Iterable[int]) -> None:
        for index in indices:
            self.spawn(spec, index)

    def spawn(self, spec: WorkerSpec, index: int) -> int:
        """Start worker ``<pool>-<index>`` now; return its pid."""
        key = (spec.pool, index)
        if key in self._children:
            raise ValueError(f"worker {instance_name(*key)} is already running")
        env = dict(os.environ, **spec.environment)
        env.pop("NOTIFY_SOCKET", None)  # our notify socket is not the worker's
        env.pop("WATCHDOG_USEC", None)
        if self.config_path:
            env[CONFIG_ENV] = self.config_path
        else:
            env[URL_ENV] = spec.store_url
        if self.paused_path:
            env[PAUSED_FILE_ENV] = self.paused_path
        output = None
        if self._log_dir:
            output = open(os.path.join(self._log_dir, f"{instance_name(*key)}.log"), "ab")
        try:
            proc = spawn_with_signals_blocked(worker_command(spec, index, self.config_path), env=env,
                                              output=output)
        finally:
            if output:
                output.close()
        self._children[key] = _Child(spec, index, proc, time.time(), time.monotonic())
        self._failed.pop(key, None)
        log.info("Started worker %s (pid %d).", instance_name(*key), proc.pid)
        return proc.pid

    def stop(self, workers: Iterable[WorkerInfo]) -> None:
        for worker in workers:
            child = self._children.get((worker.pool, worker.index))
            if child is not None:
                self._ask_to_stop(child)

    def _ask_to_stop(self, child: _Child) -> None:
        if child.draining or child.proc.poll() is not None:
            return
        child.stop_deadline = time.monotonic() + child.spec.stop_timeout
        try:
            # Stop claiming first, then drain: like KillMode=mixed, only the worker itself
            # gets SIGTERM; its process group is killed only when the stop timeout is spent.
            child.proc.send_signal(signal.SIGUSR1)
            child.proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        log.info("Draining worker %s (pid %d).", instance_name(child.spec.pool, child.index), child.proc.pid)

    def list(self) -> list[WorkerInfo]:
        self._enforce_deadlines()
        workers = []
        for key, child in list(self._children.items()):
            code = child.proc.poll()
            if code is None:
                state = WorkerState.DRAINING if child.draining else WorkerState.ACTIVE
                workers.append(WorkerInfo(key[0], key[1], state, child.proc.pid, child.started_at,
                                          launched=child.launched))
                continue
            del self._children[key]
            # SIGTERM before its handler was in (a worker stopped while starting) is a clean
            # stop, as systemd counts it too.
            clean = code == 0 or (child.draining and code == -signal.SIGTERM)
            if not clean or child.killed:
                log.warning("Worker %s (pid %d) exited with %s.", instance_name(*key), child.proc.pid,
                            f"signal {-code}" if code < 0 else f"code {code}")
                self._failed[key] = WorkerInfo(key[0], key[1], WorkerState.FAILED, child.proc.pid)
                self._endings[child.proc.pid] = _ending(code)
        self._forget_pids(w.pid for w in workers)
        return workers + list(self._failed.values())

    def _signal_pause(self, worker: WorkerInfo, paused: bool) -> None:
        child = self._children.get((worker.pool, worker.index))
        if child is not None and child.proc.poll() is None:
            child.proc.send_signal(signal.SIGUSR1 if paused else signal.SIGUSR2)

    def forget(self, worker: WorkerInfo) -> None:
        self._failed.pop((worker.pool, worker.index), None)
        if worker.pid is not None:
            self._endings.pop(worker.pid, None)

    def how_it_ended(self, instance: str, pid: int | None) -> str | None:
        if pid is not None:
            return self._endings.get(pid)
        parsed = parse_instance(instance)
        failed = self._failed.get(parsed) if parsed else None
        return self._endings.get(failed.pid) if failed is not None and failed.pid else None

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for child in self._children.values():
            if child.stop_deadline is not None and now > child.stop_deadline and child.proc.poll() is None:
                log.warning("Worker %s did not stop within %gs: killing it.",
                            instance_name(child.spec.pool, child.index), child.spec.stop_timeout)
                self._kill_group(child)

    @staticmethod
    def _kill_group(child: _Child) -> None:
        child.killed = True
        try:
            os.killpg(child.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    # -- whole-fleet operations -------------------------------------------------------------

    def pids(self, pool: str | None = None) -> list[int]:
        return [c.proc.pid for (p, _), c in sorted(self._children.items())
                if (pool is None or p == pool) and c.proc.poll() is None]

    def stop_pool(self, pool: str) -> None:
        """Drain-stop every worker of ``pool`` and wait until all have exited."""
        self.shutdown(pool)

    def leave(self) -> None:
        log.info("Draining every worker before exiting.")
        self.shutdown()

    def shutdown(self, pool: str | None = None, timeout: float | None = None) -> None:
        """Drain-stop every worker (of ``pool``) and wait until all have exited."""
        children = [c for (p, _), c in self._children.items() if pool is None or p == pool]
        for child in children:
            self._ask_to_stop(child)
        for child in children:
            if child.stop_deadline is None:
                continue  # it had exited already: nothing to wait for
            wait = timeout if timeout is not None else max(0.0, child.stop_deadline - time.monotonic())
            try:
                child.proc.wait(wait)
            except subprocess.TimeoutExpired:
                self._kill_group(child)
                child.proc.wait()
        self.list()  # reap, and record the killed ones as failed

    def kill_all(self) -> None:
        for child in self._children.values():
            if child.proc.poll() is None:
                self._kill_group(child)
        for child in self._children.values():
            child.proc.wait()
        self.list()

    def close(self) -> None:
        pass


def _ending(code: int) -> str:
    """A worker process's end in words, from its exit code (negative: the signal)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"
