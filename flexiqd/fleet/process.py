"""Workers as child processes, for machines without systemd (a laptop, a container).

Each worker runs in its own process group.  A drain-stop sends SIGUSR1 (stop
claiming) and SIGTERM to the worker itself -- like systemd's ``KillMode=mixed``
-- and SIGKILLs the whole group once its drain budget plus a grace period has
passed.  Unlike the systemd fleet, this one's memory *is* the source of truth:
its workers die with it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Iterable

from .base import Fleet, WorkerInfo, WorkerSpec, WorkerState, instance_name

log = logging.getLogger(__name__)

KILL_GRACE = 5.0  # seconds past the drain budget before SIGKILL


@dataclasses.dataclass
class _Child:
    spec: WorkerSpec
    index: int
    proc: subprocess.Popen
    started_at: float
    stop_deadline: float | None = None   # monotonic; set once asked to stop
    killed: bool = False

    @property
    def draining(self) -> bool:
        return self.stop_deadline is not None


def worker_command(spec: WorkerSpec, index: int) -> list[str]:
    """The command line of worker ``<pool>-<index>``."""
    return [sys.executable, "-m", "flexiqd.cli.flexiq", "--url", spec.store_url, "worker",
            "--app", spec.app, "--queues", ",".join(spec.queues),
            "--concurrency", str(spec.concurrency), "--lease", f"{spec.lease_seconds:g}",
            "--drain-timeout", f"{spec.drain_timeout:g}", "--instance", instance_name(spec.pool, index),
            *(["--batch-size", str(spec.batch_size)] if spec.batch_size else [])]


class ProcessFleet(Fleet):
    """Not thread-safe: one controller drives it."""

    def __init__(self, *, log_dir: str | None = None) -> None:
        self._children: dict[tuple[str, int], _Child] = {}
        self._failed: dict[tuple[str, int], WorkerInfo] = {}
        self._log_dir = log_dir

    def configure(self, specs: Iterable[WorkerSpec]) -> None:
        pass  # nothing to prepare: each start carries its whole spec

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
        output = None
        if self._log_dir:
            output = open(os.path.join(self._log_dir, f"{instance_name(*key)}.log"), "ab")
        proc = subprocess.Popen(worker_command(spec, index), env=env, start_new_session=True,
                                stdout=output, stderr=subprocess.STDOUT if output else None)
        if output:
            output.close()
        self._children[key] = _Child(spec, index, proc, time.time())
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
        child.stop_deadline = time.monotonic() + child.spec.drain_timeout + KILL_GRACE
        try:
            # Stop claiming first, then drain: like KillMode=mixed, only the worker itself
            # gets SIGTERM; its process group is killed only when the budget is spent.
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
                workers.append(WorkerInfo(key[0], key[1], state, child.proc.pid, child.started_at))
                continue
            del self._children[key]
            if code != 0 or child.killed:
                log.warning("Worker %s (pid %d) exited with %s.", instance_name(*key), child.proc.pid,
                            f"signal {-code}" if code < 0 else f"code {code}")
                self._failed[key] = WorkerInfo(key[0], key[1], WorkerState.FAILED, child.proc.pid)
        return workers + list(self._failed.values())

    def pause(self, workers: Iterable[WorkerInfo], paused: bool) -> None:
        for worker in workers:
            child = self._children.get((worker.pool, worker.index))
            if child is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGUSR1 if paused else signal.SIGUSR2)

    def forget(self, worker: WorkerInfo) -> None:
        self._failed.pop((worker.pool, worker.index), None)

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for child in self._children.values():
            if child.stop_deadline is not None and now > child.stop_deadline and child.proc.poll() is None:
                log.warning("Worker %s did not drain within %.0fs: killing it.",
                            instance_name(child.spec.pool, child.index), child.spec.drain_timeout + KILL_GRACE)
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
