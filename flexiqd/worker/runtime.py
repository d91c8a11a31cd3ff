"""The worker: claim, run up to N jobs at once, keep their leases, drain on stop.

One asyncio loop drives everything.  Store calls run on a single dedicated
thread (one SQLite connection, never shared), sync tasks on daemon threads,
async tasks on the loop.  Finished jobs are settled in the same transaction as
the next claim, so a busy worker pays one commit per exchange, not two per job.

A job is handed back only when nothing can still be running it.  Drain order on
stop (SIGTERM): stop claiming at once and release the jobs claimed but never
started; keep settling what finishes and keep leases alive; tell systemd we are
making progress (EXTEND_TIMEOUT_USEC) until the drain budget is spent; then
interrupt what still runs and give it INTERRUPT_GRACE to stop.  A job whose
task ended is settled; one whose thread still runs (blocked in C, or deaf to
interrupts) is *abandoned*: it stays leased to this worker, marked to be
released (or failed, if it had timed out) once the worker is gone -- and the
process then exits for real, so that happens within moments.

Dependency limits: a job of a task that ``uses`` a limited dependency starts
only once it is admitted, when it is about to start -- never while it waits in
the prefetch buffer.  Within this worker's share of each limit that takes no
store call (``Backend.admit_locally``; the hold is stored with the next
exchange); otherwise the next exchange admits it, in its own transaction, and
defers it there if the dependency is full (``Outcome.defer``), so the slot it
would have taken stays free for the next job.

Stores shared by hosts (PostgreSQL): another host may take a job once its lease
expired and its host stopped beating, so leases follow the heartbeat
(``queue.hosts.shared_store_timing``: 2 x heartbeat, renewed every heartbeat / 3)
and a ``LeaseFence`` ends the process -- tasks' processes killed -- once a job's
lease has gone a heartbeat unconfirmed (the store unreachable or hung).

Crash duplicates: a SIGKILLed worker's jobs run again, but only those it had
started and not yet settled -- the ones running, plus the finished ones whose
results were not committed yet.  ``_free_slots`` keeps both together at most
``concurrency + UNSETTLED_MAX`` at every instant.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping

from ..errors import QueueError, StoreDamaged
from ..logs import MessageId, journal
from ..notify import Notifier, watchdog_interval
from ..queue.api import Queue
from ..queue.store.backend import Backend
from ..queue.hosts import LeaseTiming, shared_store_timing
from ..queue.limits import DependencyLimit, TenantCaps, limits_for
from ..queue.url import safe_url
from ..queue.types import ClaimRequest, Deferral, Exchanged, Job, Outcome, OutcomeKind
from ..settings_schema import EXIT_TIME, FINAL_SETTLE_TIME, LAST_FLUSH_TIME, PROGRESS_PROMISE
from .execution import INTERRUPT_GRACE, Executor, Run, timed_out_outcome
from .exit import exit_now, kill_descendants
from .fence import LeaseFence
from .settings import WorkerConfig

__all__ = ["EXIT_DAMAGED", "EXIT_FENCED", "EXIT_OK", "EXIT_STUCK", "EXIT_UNAVAILABLE", "Worker", "WorkerConfig"]

log = logging.getLogger(__name__)

# Exit codes (sysexits.h), each a reason systemd's Restart=on-failure may act on.
EXIT_OK = 0
EXIT_STUCK = 70       # every slot is held by a task that ignored its timeout: restart clean
EXIT_UNAVAILABLE = 69  # the store could not be opened
EXIT_DAMAGED = 65      # the store is damaged: no job is run from it (the unit does not restart)
EXIT_APP = 78          # the pool's app cannot be loaded: the unit does not restart, flexiqd backs off
EXIT_FENCED = 75      # leases unconfirmed too long on a store shared by hosts: ended before another host may take them

# Prefetch: claim ahead only about this much work, so a worker never sits on a
# backlog another worker could start (and depth and age stay honest for the
# autoscaler); with jobs of a second or more it claims no more than it can run.
PREFETCH_SECONDS = 0.05
PREFETCH_MAX = 32
# The longest a finished job waits to be settled together with others.
SETTLE_DELAY = 0.02
# Most finished jobs whose results are not committed yet (with the running ones, what a
# SIGKILL can make run again): at this many, no new job starts until a commit goes through.
UNSETTLED_MAX = 16
# FINAL_SETTLE_TIME (flexiqd.settings_schema): at exit, how long to keep trying to commit the last
# results -- one of the parts of the stop grace beyond the drain budget.
# After a fence's breach, the process ends within this even if logging blocks.
FENCE_EXIT_GRACE = 0.2
# How often the dependency limits are looked at again (a reload may have changed them).
LIMITS_CHECK = 2.0
# A failed exchange is tried again after a pause that doubles up to this: a store back from a
# restart sees its workers claim again within it (issue 24 asks for 2 s), and a refused
# connection a second costs a down server nothing.
STORE_RETRY_MAX = 1.0
# While the store fails, the worker's warning is repeated this often (and when the reason changes).
STORE_LOG_EVERY = 30.0
# Jobs the store could not be asked to admit (it failed): released with the next exchange.
HANDED_BACK = Deferral("", 0.0)


class Wakeup:
    """What the claim loop sleeps on: set by a finished job, new work or a stop; cleared by the
    wait it ends.  On the loop's thread only.  (An asyncio.Event waited on beside the stop
    costs two tasks per wait; this, one future.)"""

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future | None = None

    def set(self) -> None:
        self._set = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self, timeout: float | None) -> None:
        """Until set (at once if it is), or ``timeout`` seconds; then cleared."""
        if not self._set:
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            timer = loop.call_later(timeout, _settle, waiter) if timeout is not None else None
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        self._set = False


def _settle(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


@dataclasses.dataclass
class Counters:
    done: int = 0
    failed: int = 0
    released: int = 0
    timed_out: int = 0
    abandoned: int = 0
    deferred: int = 0


class Worker:
    """One worker process's claim loop.  Not thread-safe except ``request_stop``/``pause``/``resume``.

    ``drain_budget`` is asked for the drain budget when a drain begins (a reload may have
    changed it since the worker started); without it, ``config.drain_timeout`` holds.
    ``dependency_limits`` is asked for the limits at most every LIMITS_CHECK seconds, on
    the store thread; without it, ``config.dependency_limits`` hold.  ``tenant_caps``
    likewise, for the caps every claim carries (``config.tenant_caps`` without it).
    """

    def __init__(self, app: Queue, backend: Backend, config: WorkerConfig, *,
                 notifier: Notifier | None = None, clock: Callable[[], float] | None = None,
                 drain_budget: Callable[[], float] | None = None,
                 dependency_limits: Callable[[], Mapping[str, DependencyLimit]] | None = None,
                 tenant_caps: Callable[[], TenantCaps | None] | None = None,
                 on_fence: Callable[[list[int]], None] | None = None) -> None:
        self.app = app
        self.backend = backend
        self.config = config
        self.notifier = notifier or Notifier()
        self.clock = clock or backend.clock  # the store's time, not this host's wall clock
        self.counters = Counters()
        self.left_running: list[int] = []  # jobs still running when it gave up on them (abandoned)
        self._drain_budget = drain_budget or (lambda: config.drain_timeout)
        self._limits_source = dependency_limits or (lambda: config.dependency_limits)
        self._limits = config.dependency_limits
        self._limits_checked = time.monotonic()
        self._caps_source = tenant_caps or (lambda: config.tenant_caps)
        self._caps = config.tenant_caps
        self._inflight: dict[int, Run] = {}
        self._outcomes: list[Outcome] = []
        self._settling = 0  # results in the store call under way
        self._first_outcome_at: float | None = None
        self._buffer: collections.deque[Job] = collections.deque()  # claimed, not started yet
        self._admitted: set[int] = set()  # buffered jobs the store admitted to their dependencies
        self._needs_store: set[int] = set()  # buffered jobs to admit with the next exchange
        self._admitted_since: float | None = None  # first admission in memory not stored yet
        self._mean_run: float | None = None  # moving average of a job's run time
        self._executor = Executor(app.tasks, on_timeout=self._on_timeout, on_stuck=self._on_stuck)
        self._store_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flexiq-store")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: Wakeup | None = None
        self._stop: asyncio.Event | None = None
        self._stop_before_start = False
        self._paused = False
        self._last_status = 0.0
        self._store_error: str | None = None  # why the last exchange failed; None once one went through
        self._store_down: float | None = None  # since when exchanges fail
        self._store_logged = 0.0
        # On a store shared by hosts the leases follow the heartbeat, and a fence guards them.
        self.timing = (shared_store_timing(config.heartbeat) if backend.shared_by_hosts else
                       LeaseTiming(lease=config.lease_seconds, renew_every=config.lease_seconds / 3,
                                   fence_after=0.0))
        self.fence = (LeaseFence(self.timing.fence_after, on_fence or self._fenced)
                      if backend.shared_by_hosts else None)

    # -- control, safe from signal handlers and other threads -------------------------------

    def request_stop(self) -> None:
        """Stop claiming now and drain.  Idempotent; before ``run`` it makes ``run`` drain at once."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop_requested)
        else:
            self._stop_before_start = True

    def pause(self) -> None:
        """Stop claiming new jobs; running ones go on.  Nothing is killed."""
        self._paused = True
        log.info("Worker %s paused: claiming no new jobs.", self.config.name)
        self._last_status = 0.0  # STATUS= says "paused" at the loop's next turn, not a second later
        self._poke()

    def resume(self) -> None:
        self._paused = False
        log.info("Worker %s resumed claiming.", self.config.name)
        self._last_status = 0.0
        self._poke()

    def _stop_requested(self) -> None:
        assert self._stop is not None and self._wake is not None
        self._stop.set()
        self._wake.set()

    def _poke(self) -> None:
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    @property
    def paused(self) -> bool:
        return self._paused

    def running_jobs(self) -> list[int]:
        """Ids of the jobs something still runs (timed-out ones included)."""
        return list(self._inflight)

    # -- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> int:
        """Claim and run jobs until ``request_stop``; then drain.  Returns the exit code.

        When it returns, ``left_running`` lists the jobs a thread may still be running:
        the caller must end the process rather than wait for them.
        """
        self._loop = asyncio.get_running_loop()
        self._wake = Wakeup()
        self._stop = asyncio.Event()
        if self._stop_before_start:
            self._stop.set()
        helpers = [asyncio.create_task(self._renew_leases())]
        if self.fence is not None:
            self.fence.start()
        # New jobs wake an idle worker at once where the store can say so; polling stays.
        unsubscribe = self.backend.subscribe(self.config.queues, self._poke)
        interval = watchdog_interval()
        if interval:
            helpers.append(asyncio.create_task(self._watchdog(interval)))
        self.notifier.ready(self._status_line())
        log.info("Worker %s ready%s: queues %s, concurrency %d.", self.config.name,
                 " (paused)" if self._paused else "", ",".join(self.config.queues), self.config.concurrency)
        try:
            code = await self._claim_loop()
            if code == EXIT_STUCK:
                await self._stop_now()
            else:
                await self._drain()
        finally:
            unsubscribe()
            for helper in helpers:
                helper.cancel()
            if self.fence is not None and not self.left_running:
                self.fence.stop()  # nothing left that another host could take from under us
            self._store_thread.shutdown(wait=True)
        log.info("Worker %s stopped: %d done, %d failed, %d released, %d given up while running, "
                 "%d deferred for a dependency.", self.config.name, self.counters.done, self.counters.failed,
                 self.counters.released, self.counters.abandoned, self.counters.deferred)
        return code

    async def _store(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(
            self._store_thread, lambda: fn(*args, **kwargs))

    def _stuck(self) -> int:
        return sum(1 for run in self._inflight.values() if run.stuck)

    def _free_slots(self) -> int:
        """Jobs that may start now: free slots, within the crash-duplicate bound."""
        running = len(self._inflight)
        unsettled = len(self._outcomes) + self._settling
        return max(0, min(self.config.concurrency - running,
                          self.config.concurrency + UNSETTLED_MAX - running - unsettled))

    async def _claim_loop(self) -> int:
        assert self._wake is not None and self._stop is not None
        idle = self.config.idle_poll_min
        while not self._stop.is_set():
            if self._stuck() >= self.config.concurrency:
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
                                       self.timing.lease) if want > 0 else None
                admit = [(job.id, self._limits_of(job)) for job in self._buffer if job.id in self._needs_store]
                self._settling = len(outcomes)
                self._admitted_since = None
                try:
                    done = await self._store(self._exchange, outcomes, request, admit)
                except StoreDamaged as exc:
                    # Nothing more is claimed or started from a store read in part; the jobs
                    # running finish (or are released) in the drain.
                    self._outcomes = outcomes + self._outcomes
                    log.error("Worker %s stops: %s", self.config.name, exc,
                              extra=journal(MessageId.STORE_DAMAGED, STORE=safe_url(self.backend.url),
                                            PROBLEM=exc))
                    return EXIT_DAMAGED
                except QueueError as exc:
                    self._outcomes = outcomes + self._outcomes  # keep them; settle on the next try
                    self._store_failed(exc, idle)
                    await self._wait(idle)
                    idle = min(idle * 2, STORE_RETRY_MAX)
                    continue
                finally:
                    self._settling = 0
                self._store_back()
                self._first_outcome_at = time.monotonic() if self._outcomes else None
                self._admissions_done(admit, done.refused)
                self._buffer.extend(done.claimed)
                self._fill_slots()
                starved = want > 0 and len(done.claimed) < want and self._free_slots() > 0
            self._report_status()
            if starved:
                await self._wait(idle)  # the queue is empty: poll less and less often
                idle = min(idle * 2, self.config.idle_poll_max)
                continue
            idle = self.config.idle_poll_min
            if self._outcomes or self._admitted_since is not None:
                since = min(t for t in (self._first_outcome_at, self._admitted_since) if t is not None)
                await self._wait(max(0.0, SETTLE_DELAY - (time.monotonic() - since)))
            elif self._free_slots() > 0 and not self._paused:
                await self._wait(idle)
            else:
                await self._wait(None if not self._paused else self.config.idle_poll_max)
        return EXIT_OK

    def _store_failed(self, exc: QueueError, retry: float) -> None:
        """An exchange failed: say so when it starts, when the reason changes and every
        STORE_LOG_EVERY seconds -- not at every retry of an outage -- and in STATUS=."""
        text, now = str(exc), time.monotonic()
        if self._store_down is None:
            self._store_down = now
        if text != self._store_error or now - self._store_logged >= STORE_LOG_EVERY:
            log.warning("Worker %s claims nothing while the store fails (%.0fs so far), keeping its %d "
                        "running jobs and %d results: %s; retrying every %.1fs at most.", self.config.name,
                        now - self._store_down, len(self._inflight), len(self._outcomes), exc, STORE_RETRY_MAX)
            self._store_logged = now
        self._store_error = text
        self._last_status = 0.0  # the status says so at once
        self._report_status()

    def _store_back(self) -> None:
        if self._store_down is not None:
            log.info("Worker %s reached the store again after %.1fs.", self.config.name,
                     time.monotonic() - self._store_down)
            self._store_down = self._store_error = None
            self._last_status = 0.0

    # -- on the store thread: the exchange ------------------------------------------------------

    def _exchange(self, outcomes: list[Outcome], request: ClaimRequest | None,
                  admit: list[tuple[int, tuple[DependencyLimit, ...]]]) -> Exchanged:
        """Settle, admit the buffered jobs that wait for the store, and claim: one transaction."""
        if time.monotonic() - self._limits_checked >= LIMITS_CHECK:
            self._limits_checked = time.monotonic()
            try:
                self._limits = self._limits_source()
                self._caps = self._caps_source()
            except Exception as exc:  # noqa: BLE001 - a bad re-read must not stop the worker
                log.warning("Worker %s keeps its dependency limits and tenant caps: %s", self.config.name, exc)
        if request is not None and self._caps is not None:
            request = dataclasses.replace(request, tenant_caps=self._caps)
        sent = time.monotonic()
        try:
            done = self.backend.exchange(self.config.name, outcomes, request, admit=admit, now=self.clock())
        except QueueError as exc:
            if not admit:
                raise
            names = sorted({limit.name for _, limits in admit for limit in limits})
            log.warning("Worker %s could not admit %d jobs to %s (%s); handing them back.",
                        self.config.name, len(admit), ", ".join(names), exc)
            done = self.backend.exchange(self.config.name, outcomes, request, now=self.clock())
            done = dataclasses.replace(done, refused={job_id: HANDED_BACK for job_id, _ in admit})
        if self.fence is not None:
            self.fence.claimed([job.id for job in done.claimed], sent)
        return done

    # -- admission, on the loop ------------------------------------------------------------------

    def _may_start(self, job: Job) -> bool:
        """Whether ``job`` is admitted to its dependencies: by the store, or now within this
        worker's share; if not, the next exchange asks the store (``_needs_store``)."""
        limits = self._limits_of(job)
        if not limits or job.id in self._admitted:
            return True
        if self.backend.admit_locally(self.config.name, job.id, limits, now=self.clock()):
            if self._admitted_since is None:
                self._admitted_since = time.monotonic()
            return True
        self._needs_store.add(job.id)
        return False

    def _admissions_done(self, admit: list[tuple[int, tuple[DependencyLimit, ...]]],
                         refused: Mapping[int, Deferral]) -> None:
        """After an exchange: the jobs it admitted may start; the ones refused were deferred
        in it and leave the buffer."""
        for job_id, _ in admit:
            self._needs_store.discard(job_id)
            if job_id not in refused:
                self._admitted.add(job_id)
        if not refused:
            return
        for job in [job for job in self._buffer if job.id in refused]:
            refusal = refused[job.id]
            self._buffer.remove(job)
            if refusal is HANDED_BACK:
                self._add_outcomes([Outcome.release(job.id)])
                continue
            log.debug("Job %d (%s) waits %.3fs for %s.", job.id, job.task, refusal.wait, refusal.dependency)
            self.counters.deferred += 1
        if self.fence is not None:
            self.fence.drop([job_id for job_id, refusal in refused.items() if refusal is not HANDED_BACK])

    def _limits_of(self, job: Job) -> tuple[DependencyLimit, ...]:
        task = self.app.tasks.get(job.task)
        if task is None:
            return ()  # an unknown task is dead-lettered as always: nothing to admit
        return limits_for(task.options.uses, self._limits)

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
        if self._needs_store:
            return True  # a job waits for the store's admission to start
        if self._admitted_since is not None and time.monotonic() - self._admitted_since >= SETTLE_DELAY:
            return True  # holds admitted in memory go to the store soon
        if want > 0 and self._free_slots() > 0:
            return True  # idle slots and nothing buffered: fetch work now
        allowance = self._prefetch_allowance()
        if want > 0 and len(self._buffer) < allowance // 2:
            return True  # the buffer runs low: refill before the slots go idle
        if not self._outcomes:
            return False
        if len(self._outcomes) >= max(1, min(UNSETTLED_MAX, allowance // 2)):
            return True
        return time.monotonic() - (self._first_outcome_at or 0.0) >= SETTLE_DELAY

    def _fill_slots(self) -> None:
        # In claim order: a job waiting for the store's admission holds back the ones after it.
        while self._buffer and self._free_slots() > 0 and self._may_start(self._buffer[0]):
            job = self._buffer.popleft()
            self._admitted.discard(job.id)
            self._start(job)

    def _release_buffer(self) -> None:
        released = [Outcome.release(job.id) for job in self._buffer]
        self._buffer.clear()
        self._admitted.clear()
        self._needs_store.clear()
        if self.fence is not None:
            self.fence.drop([outcome.job_id for outcome in released])
        self.counters.released += len(released)
        self._add_outcomes(released)

    def _add_outcomes(self, outcomes: list[Outcome]) -> None:
        if outcomes and not self._outcomes:
            self._first_outcome_at = time.monotonic()
        self._outcomes.extend(outcomes)

    async def _wait(self, timeout: float | None) -> None:
        """Until a job finishes, a stop is requested, or ``timeout`` passes."""
        assert self._wake is not None
        await self._wake.wait(timeout)  # a stop sets it too

    def _start(self, job: Job) -> None:
        run = self._executor.start(job)
        self._inflight[job.id] = run
        run.done.add_done_callback(functools.partial(self._finished, run))

    def _finished(self, run: Run, done: asyncio.Future) -> None:
        """Nothing runs ``run``'s job any more: settle it with the next exchange."""
        outcome = done.result()
        ran = time.monotonic() - run.began
        self._mean_run = ran if self._mean_run is None else 0.8 * self._mean_run + 0.2 * ran
        self._inflight.pop(run.job.id, None)
        if self.fence is not None:
            self.fence.drop([run.job.id])  # its thread is done: nothing here runs it any more
        self._count(run.job, outcome)
        self._add_outcomes([outcome])
        assert self._wake is not None
        self._wake.set()

    def _on_timeout(self, run: Run) -> None:
        self.counters.timed_out += 1
        log.warning("Job %d (%s) ran past its %gs timeout: interrupting it; it keeps its slot and "
                    "lease until its task returns.", run.job.id, run.job.task, run.job.timeout or 0)

    def _on_stuck(self, run: Run) -> None:
        log.warning("Job %d (%s) did not stop within %gs of its interrupt (blocked in C, or deaf "
                    "to interrupts).", run.job.id, run.job.task, INTERRUPT_GRACE)
        if self._wake is not None:
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
        while True:
            await asyncio.sleep(self.timing.renew_every)
            ids = list(self._inflight) + [job.id for job in self._buffer]
            if not ids:
                continue
            sent = time.monotonic()
            try:
                held = await self._store(self.backend.renew, self.config.name, ids,
                                         self.timing.lease, now=self.clock())
            except QueueError as exc:
                log.warning("Worker %s could not renew %d leases: %s", self.config.name, len(ids), exc)
                continue
            if self.fence is not None:
                self.fence.confirm(held, sent)
            for lost in set(ids) - set(held):
                if lost in self._inflight or any(job.id == lost for job in self._buffer):
                    log.warning("Worker %s lost the lease of job %d (cancelled or expired); "
                                "its result will be dropped.", self.config.name, lost)

    def _fenced(self, job_ids: list[int]) -> None:
        """The fence's breach (on its thread): end everything before another host takes the jobs.

        The processes first, and the exit bounded: a log handler blocked on a full pipe must
        not keep this process (and its task threads) alive past the fence's margin.
        """
        kill_descendants()
        threading.Timer(FENCE_EXIT_GRACE, os._exit, (EXIT_FENCED,)).start()
        log.error("Worker %s could not renew the leases of jobs %s for %gs: the store may hand them "
                  "to another host, so it kills its tasks and exits.", self.config.name,
                  ", ".join(map(str, job_ids)), self.timing.fence_after)
        exit_now(EXIT_FENCED)

    async def _watchdog(self, interval: float) -> None:
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)

    def _status_line(self) -> str:
        state = "paused" if self._paused else ("draining" if self._stop and self._stop.is_set() else "claiming")
        stuck = self._stuck()
        return (f"{state}: {len(self._inflight)}/{self.config.concurrency} running"
                f"{f' ({stuck} stuck past their timeout)' if stuck else ''}, "
                f"{self.counters.done} done, {self.counters.failed} failed"
                f"{f'; not claiming, the store fails: {self._store_error}' if self._store_error else ''}")

    def _report_status(self) -> None:
        now = time.monotonic()
        if now - self._last_status >= 1.0:
            self._last_status = now
            self.notifier.status(self._status_line())

    # -- drain --------------------------------------------------------------------------------

    def _current_drain_budget(self) -> float:
        try:
            return max(0.0, float(self._drain_budget()))
        except Exception as exc:  # noqa: BLE001 - a bad re-read must not stop the drain
            log.warning("Worker %s could not read its drain budget (%s); using %gs.",
                        self.config.name, exc, self.config.drain_timeout)
            return self.config.drain_timeout

    async def _drain(self) -> None:
        budget = self._current_drain_budget()
        deadline = time.monotonic() + budget
        self._release_buffer()  # claimed but never started: back to the queue at once
        self.notifier.stopping(f"draining {len(self._inflight)} jobs")
        log.info("Worker %s draining %d running jobs (budget %gs).", self.config.name,
                 len(self._inflight), budget)
        while self._inflight and time.monotonic() < deadline:
            remaining = deadline - time.monotonic()
            # Ask systemd for a little beyond the next check, never past our own budget plus the
            # grace's first part, the last flush below: a hung worker stops asking and is killed on time.
            self.notifier.extend_timeout(min(remaining, PROGRESS_PROMISE) + LAST_FLUSH_TIME)
            await self._flush()
            await self._wait(min(remaining, 1.0))
        await self._flush()
        if self._inflight:
            await self._give_up_running(interrupt=True)
        await self._final_flush()

    async def _stop_now(self) -> None:
        """Exit without draining: every slot is stuck, nothing would finish."""
        self._release_buffer()
        self.notifier.stopping("every slot stuck past its timeout: exiting")
        await self._flush()
        await self._give_up_running(interrupt=False)
        await self._final_flush()

    async def _give_up_running(self, *, interrupt: bool) -> None:
        """Interrupt what still runs; settle what stops within the grace; abandon the rest.

        Order matters: a job is handed back only once nothing can still be running it, so
        what is still running is not released here but abandoned -- marked, still leased
        to this worker -- and its release (or, after a timeout, its failure) takes effect
        once this process is gone.
        """
        if interrupt:
            log.warning("Worker %s drain budget spent: interrupting %d running jobs (%s); they have "
                        "%gs to stop.", self.config.name, len(self._inflight),
                        ", ".join(map(str, self._inflight)), INTERRUPT_GRACE)
            # What the grace has left after the last flush, but its margin: interrupt, settle, exit.
            self.notifier.extend_timeout(INTERRUPT_GRACE + FINAL_SETTLE_TIME + EXIT_TIME)
            runs = list(self._inflight.values())
            for run in runs:
                run.give_up()
            await asyncio.wait([run.done for run in runs], timeout=INTERRUPT_GRACE)
            await asyncio.sleep(0)  # let the finished runs' callbacks record their outcomes
        left = list(self._inflight.values())
        if not left:
            return
        marks = [timed_out_outcome(run.job) if run.timed_out else Outcome.release(run.job.id) for run in left]
        try:
            await self._store(self.backend.abandon, self.config.name, marks, now=self.clock())
        except QueueError as exc:
            log.error("Worker %s could not mark the jobs it gives up (%s): they count as lost once "
                      "it has exited.", self.config.name, exc)
        self.left_running = [run.job.id for run in left]
        self.counters.abandoned += len(left)
        log.warning("Worker %s gives up %d jobs still running (%s): they stay leased to it and run "
                    "again once it has exited.", self.config.name, len(left),
                    ", ".join(map(str, self.left_running)))

    async def _flush(self) -> bool:
        """Settle the results gathered so far; False if the store refused (they are kept)."""
        outcomes, self._outcomes = self._outcomes, []
        self._first_outcome_at = None
        if not outcomes:
            return True
        self._settling = len(outcomes)
        try:
            await self._store(self.backend.settle, self.config.name, outcomes, now=self.clock())
        except QueueError as exc:
            self._outcomes = outcomes + self._outcomes
            self._first_outcome_at = time.monotonic()
            log.warning("Worker %s could not settle %d jobs while draining: %s",
                        self.config.name, len(outcomes), exc)
            return False
        finally:
            self._settling = 0
        return True

    async def _final_flush(self) -> None:
        deadline = time.monotonic() + FINAL_SETTLE_TIME
        while not await self._flush():
            if time.monotonic() >= deadline:
                log.error("Worker %s exits with %d results not settled: those jobs run again.",
                          self.config.name, len(self._outcomes))
                return
            await asyncio.sleep(0.2)
