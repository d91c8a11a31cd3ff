"""Fakes for controller tests: a fleet that remembers what it was asked and changes state on request, a clock the test sets."""

from __future__ import annotations

from flexiqd.fleet.base import Fleet, WorkerInfo, WorkerState


class FakeFleet(Fleet):
    def __init__(self) -> None:
        super().__init__()
        self.workers: dict[tuple[str, int], WorkerInfo] = {}
        self.started: list[tuple[str, int]] = []
        self.stopped: list[tuple[str, int]] = []
        self.forgotten: list[tuple[str, int]] = []
        self.specs = {}
        self.next_pid = 1000

    def add(self, pool: str, index: int, state: WorkerState = WorkerState.ACTIVE,
            pid: int | None = None, started_at: float | None = None) -> WorkerInfo:
        self.next_pid += 1
        info = WorkerInfo(pool, index, state, pid or self.next_pid, started_at)
        self.workers[(pool, index)] = info
        return info

    def list(self):
        return list(self.workers.values())

    def configure(self, specs):
        self.specs = {spec.pool: spec for spec in specs}

    def start(self, spec, indices):
        for index in indices:
            self.started.append((spec.pool, index))
            self.add(spec.pool, index, WorkerState.STARTING)

    def stop(self, workers):
        for worker in workers:
            self.stopped.append((worker.pool, worker.index))
            self.workers[(worker.pool, worker.index)] = WorkerInfo(
                worker.pool, worker.index, WorkerState.DRAINING, worker.pid, worker.started_at)

    def _signal_pause(self, worker, paused):
        self.signalled = getattr(self, "signalled", [])
        self.signalled.append(((worker.pool, worker.index), paused))

    def leave(self):
        self.left = True

    def forget(self, worker):
        self.forgotten.append((worker.pool, worker.index))
        self.workers.pop((worker.pool, worker.index), None)


class Clock:
    """A clock the test sets: ``clock.now`` is what it returns."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
