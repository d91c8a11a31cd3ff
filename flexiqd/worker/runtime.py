"""The worker: claim, run up to N jobs at once, keep their leases, drain on stop.

One asyncio loop drives everything.  Store calls run on a single dedicated
thread (one SQLite connection, never shared), sync tasks on a thread pool,
async tasks on the loop.  Finished jobs are settled in the same transaction as
the next claim, so a busy worker pays one commit per exchange, not two per job.

Drain order on stop (SIGTERM): stop claiming at once; keep settling what
finishes and keep leases alive; tell systemd we are making progress
(EXTEND_TIMEOUT_USEC) until the drain budget is spent; then interrupt what is
still running and *release* it -- back to runnable, no attempt used -- before
exiting, so no job runs twice because of a scale-in.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from ..errors import QueueError
from ..notify import Notifier, watchdog_interval
from ..queue.api import Queue
from ..queue.backend import Backend
from ..queue.types import ClaimRequest, Job, Outcome, OutcomeKind
from .execution import Executor

log = logging.getLogger(__name__)

# Exit codes (sysexits.h), each a reason systemd's Restart=on-failure may act on.
EXIT_OK = 0
EXIT_STUCK = 70       # every slot is held by a task that ignored its timeout: restart clean
EXIT_UNAVAILABLE = 69  # the store could not be opened

# Prefetch: claim ahead only about this much work, so a worker never sits on a
# backlog another worker could start (and depth and age stay honest for the
# autoscaler); with jobs of a second or more it claims no more than it can run.
PREFETCH_SECONDS = 0.05
PREFETCH_MAX = 32
# The longest a finished job waits to be settled together with others.
SETTLE_DELAY = 0.02


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """How one worker claims and drains.  ``name`` identifies it in leases and executions."""

    queues: tuple[str, ...] = ("default",)
    concurrency: int = 4
    lease_seconds: float = 30.0
    drain_timeout: float = 30.0
    idle_poll_min: float = 0.05
    idle_poll_max: float = 0.5
    batch_size: int | None = None  # most jobs claimed at once (None: as many as free slots)
    name: str = dataclasses.field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be positive, got {self.lease_seconds}")
        if self.drain_timeout < 0:
            raise ValueError(f"drain_timeout must not be negative, got {self.drain_timeout}")


@dataclasses.dataclass
class Counters:
    done: int = 0
    failed: int = 0
    released: int = 0


class Worker:
    """One worker process's claim loop.  Not thread-safe except ``request_stop``/``pause``."""

    def __init__(self, app: Queue, backend: Backend, config: WorkerConfig, *,
                 notifier: Notifier | None = None, clock: Callable[[], float] = time.time) -> None:
        self.app = app
        self.backend = backend
        self.config = config
        self.notifier = notifier or Notifier()
        self.clock = clock
        self.counters = Counters()
        self._inflight: dict[int, asyncio.Task] = {}
        self._outcomes: list[Outcome] = []
        self._first_outcome_at: float | None = None
        self._buffer: collections.deque[Job] = collections.deque()  # claimed, not started yet
        self._mean_run: float | None = None  # moving average of a job's run time
        self._executor = Executor(app.tasks, threads=config.concurrency)
        self._store_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flexiq-store")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._paused = False
        self._last_status = 0.0

    # -- control, safe from signal handlers and other threads -------------------------------

    def request_stop(self) -> None:
        """Stop claiming now and drain.  Idempotent."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    def pause(self) -> None:
        """Stop claiming new jobs; running ones go on.  Nothing is killed."""
        self._paused = True
        log.info("Worker %s paused: claiming no new jobs.", self.config.name)

    def resume(self) -> None:
        self._paused = False
        log.info("Worker %s resumed claiming.", self.config.name)
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    # -- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> int:
        """Claim and run jobs until ``request_stop``; then drain.  Returns the exit code."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        helpers = [asyncio.create_task(self._renew_leases())]
        interval = watchdog_interval()
        if interval:
            helpers.append(asyncio.create_task(self._watchdog(interval)))
        self.notifier.ready(self._status_line())
        log.info("Worker %s ready: queues %s, concurrency %d.", self.config.name,
                 ",".join(self.config.queues), self.config.concurrency)
        try:
            code = await self._claim_loop()
            await self._drain()
        finally:
            for helper in helpers:
                helper.cancel()
            self._executor.shutdown()
            self._store_thread.shutdown(wait=True)
        log.info("Worker %s stopped: %d done, %d failed, %d released.", self.config.name,
                 self.counters.done, self.counters.failed, self.counters.released)
        return code

    async def _store(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(
            self._store_thread, lambda: fn(*args, **kwargs))

    def _free_slots(self) -> int:
        return self.config.concurrency - len(self._inflight) - self._executor.stuck()

    async def _claim_loop(self) -> int:
        assert self._wake is not None and self._stop is not None
        idle = self.config.idle_poll_min
        while not self._stop.is_set():
            if self._executor.stuck() >= self.config.concurrency:
                log.error("Worker %s: all %d slots are held by tasks that ran past their timeout "
                          "and ignore interruption; exiting so a fresh worker takes over.",
                          self.config.name, self.config.concurrency)
                return EXIT_STUCK
            if self._paused and self._buffer:
                self._release_buffer()  # not started: let other workers have them now
            self._fill_slots()
            want = self._claim_size()
            starved = False
            if self._exchange_due(want):
                outcomes, self._outcomes = self._outcomes, []
                request = ClaimRequest(self.config.name, self.config.queues, want,
                                       self.config.lease_seconds) if want > 0 else None
                try:
                    _, claimed = await self._store(self.backend.settle_and_claim, self.config.name,
                                                   outcomes, request, now=self.clock())
                except QueueError as exc:
                    self._outcomes = outcomes + self._outcomes  # keep them; settle on the next try
                    log.warning("Worker %s: %s; retrying in %.1fs.", self.config.name, exc, idle)
                    await self._wait(idle)
                    idle = min(idle * 2, 5.0)
                    continue
                self._first_outcome_at = time.monotonic() if self._outcomes else None
                self._buffer.extend(claimed)
                self._fill_slots()
                starved = want > 0 and len(claimed) < want and self._free_slots() > 0
            self._report_status()
            if starved:
                await self._wait(idle)  # the queue is empty: poll less and less often
                idle = min(idle * 2, self.config.idle_poll_max)
                continue
            idle = self.config.idle_poll_min
            if self._outcomes:
                await self._wait(max(0.0, SETTLE_DELAY - (time.monotonic() - self._first_outcome_at)))
            elif self._free_slots() > 0 and not self._paused:
                await self._wait(idle)
            else:
                await self._wait(None if not self._paused else self.config.idle_poll_max)
        return EXIT_OK

    # -- prefetch ------------------------------------------------------------------------------

    def _prefetch_allowance(self) -> int:
        """Jobs to hold beyond the free slots: about PREFETCH_SECONDS of work, none for long jobs."""
        if self._mean_run is None or self._paused:
            return 0
        return min(PREFETCH_MAX, int(self.config.concurrency * PREFETCH_SECONDS / max(self._mean_run, 1e-4)))

    def _claim_size(self) -> int:
        if self._paused:
            return 0
        room = self._free_slots() + self._prefetch_allowance() - len(self._buffer)
        if self.config.batch_size:
            room = min(room, self.config.batch_size)
        return max(0, room)

    def _exchange_due(self, want: int) -> bool:
        """Whether to go to the store now, or let more results (and room) accumulate first."""
        if want > 0 and self._free_slots() > 0:
            return True  # idle slots and nothing buffered: fetch work now
        allowance = self._prefetch_allowance()
        if want > 0 and len(self._buffer) < allowance // 2:
            return True  # the buffer runs low: refill before the slots go idle
        if not self._outcomes:
            return False
        if len(self._outcomes) >= max(1, allowance // 2):
            return True
        return time.monotonic() - (self._first_outcome_at or 0.0) >= SETTLE_DELAY

    def _fill_slots(self) -> None:
        while self._buffer and self._free_slots() > 0:
            self._start(self._buffer.popleft())

    def _release_buffer(self) -> None:
        released = [Outcome.release(job.id) for job in self._buffer]
        self._buffer.clear()
        self.counters.released += len(released)
        self._add_outcomes(released)

    def _add_outcomes(self, outcomes: list[Outcome]) -> None:
        if outcomes and not self._outcomes:
            self._first_outcome_at = time.monotonic()
        self._outcomes.extend(outcomes)

    async def _wait(self, timeout: float | None) -> None:
        """Until a job finishes, a stop is requested, or ``timeout`` passes."""
        assert self._wake is not None and self._stop is not None
        waiters = [asyncio.create_task(self._wake.wait()), asyncio.create_task(self._stop.wait())]
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        self._wake.clear()

    def _start(self, job: Job) -> None:
        task = asyncio.create_task(self._execute(job), name=f"job-{job.id}")
        self._inflight[job.id] = task

    async def _execute(self, job: Job) -> None:
        began = time.monotonic()
        try:
            outcome = await self._executor.run(job)
        except asyncio.CancelledError:
            return  # the drain gave up on it; it is released there
        ran = time.monotonic() - began
        self._mean_run = ran if self._mean_run is None else 0.8 * self._mean_run + 0.2 * ran
        self._inflight.pop(job.id, None)
        self._count(job, outcome)
        self._add_outcomes([outcome])
        assert self._wake is not None
        self._wake.set()

    def _count(self, job: Job, outcome: Outcome) -> None:
        if outcome.kind is OutcomeKind.ACK:
            self.counters.done += 1
            log.debug("Job %d (%s) done.", job.id, job.task)
        elif outcome.kind is OutcomeKind.RELEASE:
            self.counters.released += 1
        else:
            self.counters.failed += 1
            last_line = (outcome.error or "").strip().splitlines()[-1:] or [""]
            will = "dead-lettered" if outcome.kind is OutcomeKind.DEAD or job.attempts >= job.max_attempts \
                else "will retry"
            log.warning("Job %d (%s) attempt %d/%d failed, %s: %s", job.id, job.task, job.attempts,
                        job.max_attempts, will, last_line[0])

    # -- leases, watchdog, status -------------------------------------------------------------

    async def _renew_leases(self) -> None:
        period = self.config.lease_seconds / 3
        while True:
            await asyncio.sleep(period)
            ids = list(self._inflight) + [job.id for job in self._buffer]
            if not ids:
                continue
            try:
                held = await self._store(self.backend.renew, self.config.name, ids,
                                         self.config.lease_seconds, now=self.clock())
            except QueueError as exc:
                log.warning("Worker %s could not renew %d leases: %s", self.config.name, len(ids), exc)
                continue
            for lost in set(ids) - set(held):
                if lost in self._inflight or any(job.id == lost for job in self._buffer):
                    log.warning("Worker %s lost the lease of job %d (cancelled or expired); "
                                "its result will be dropped.", self.config.name, lost)

    async def _watchdog(self, interval: float) -> None:
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)

    def _status_line(self) -> str:
        state = "paused" if self._paused else ("draining" if self._stop and self._stop.is_set() else "claiming")
        return (f"{state}: {len(self._inflight)}/{self.config.concurrency} running, "
                f"{self.counters.done} done, {self.counters.failed} failed")

    def _report_status(self) -> None:
        now = time.monotonic()
        if now - self._last_status >= 1.0:
            self._last_status = now
            self.notifier.status(self._status_line())

    # -- drain --------------------------------------------------------------------------------

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.config.drain_timeout
        self._release_buffer()  # claimed but never started: back to the queue at once
        self.notifier.stopping(f"draining {len(self._inflight)} jobs")
        log.info("Worker %s draining %d running jobs (budget %.0fs).", self.config.name,
                 len(self._inflight), self.config.drain_timeout)
        while self._inflight and time.monotonic() < deadline:
            remaining = deadline - time.monotonic()
            # Ask systemd for a little beyond the next check, never past our own budget (+ a
            # grace for the release below): a hung worker stops asking and is killed on time.
            self.notifier.extend_timeout(min(remaining, 2.0) + 3.0)
            await self._flush()
            await self._wait(min(remaining, 1.0))
        await self._flush()
        if self._inflight:
            await self._release_unfinished()

    async def _flush(self) -> None:
        outcomes, self._outcomes = self._outcomes, []
        self._first_outcome_at = None
        if not outcomes:
            return
        try:
            await self._store(self.backend.settle, self.config.name, outcomes, now=self.clock())
        except QueueError as exc:
            self._outcomes = outcomes + self._outcomes
            self._first_outcome_at = time.monotonic()
            log.warning("Worker %s could not settle %d jobs while draining: %s",
                        self.config.name, len(outcomes), exc)

    async def _release_unfinished(self) -> None:
        unfinished = dict(self._inflight)
        log.warning("Worker %s drain budget spent: interrupting and releasing %d unfinished jobs "
                    "(%s).", self.config.name, len(unfinished), ", ".join(map(str, unfinished)))
        # Stop the code first, then release: a released job may start elsewhere at once.
        self._executor.interrupt_all()
        for task in unfinished.values():
            task.cancel()
        await asyncio.wait(list(unfinished.values()), timeout=1.0)
        await self._flush()  # whatever finished during the interruption is acked, not released
        releases = [Outcome.release(job_id) for job_id in unfinished if job_id in self._inflight]
        self.counters.released += len(releases)
        try:
            await self._store(self.backend.settle, self.config.name, releases, now=self.clock())
        except QueueError as exc:
            log.error("Worker %s could not release %d jobs (%s); they run again when their "
                      "leases expire.", self.config.name, len(releases), exc)
        self._inflight.clear()
