"""Running one job's task: sync tasks on a thread, async ones on the loop, both under a timeout.

Everything a task can do wrong ends here as an ``Outcome``: an exception is a
failure (retried), a timeout is a failure, an unknown task or a malformed payload
or result is dead on arrival (retrying cannot help).  Nothing escapes to the
worker's other jobs.

A run is *done* only when nothing runs its job any more: the thread returned
(or the coroutine ended).  A task past its timeout, or one the worker gave up
on at the end of a drain, is interrupted -- an asynchronous exception, which a
thread blocked in C only sees when that call returns -- and keeps its slot until
it is done; a worker that must exit first gives its job up with
``Backend.abandon`` (see runtime.py).

An interrupt can only hit the run it was meant for: it is sent under the run's
lock and only while the run has not finished; a finishing thread marks the run
finished and drops any interrupt not yet delivered under that same lock, and
its epilogue catches one that lands there.  Each run is interrupted at most once.
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import json
import queue as queue_module
import threading
import time
import traceback
from typing import Any, Callable

from ..queue.tasks import Task
from ..queue.types import Job, Outcome
from ..settings_schema import INTERRUPT_GRACE

current_job_var: contextvars.ContextVar[Job | None] = contextvars.ContextVar("flexiqd_job", default=None)

# INTERRUPT_GRACE: how long an interrupted task has to unwind before the worker counts it as
# stuck -- a part of the stop grace (flexiqd.settings_schema), since a drain ends with it.

_SET_ASYNC_EXC = ctypes.pythonapi.PyThreadState_SetAsyncExc


def current_job() -> Job | None:
    """The job the calling task is running for (None outside a task)."""
    return current_job_var.get()


class TaskInterrupted(BaseException):
    """Raised inside a sync task its worker stopped waiting for (the end of a drain).

    A ``BaseException``, like ``KeyboardInterrupt``: ``except Exception`` in a task
    does not swallow it.
    """


class TaskTimeout(TaskInterrupted):
    """Raised inside a sync task that ran past its job's timeout."""


def _raise_in(thread_id: int, kind: type[BaseException]) -> None:
    # The only way to stop a Python thread from outside: an asynchronous exception,
    # raised at its next bytecode.  A thread blocked in C sees it when that call returns.
    _SET_ASYNC_EXC(ctypes.c_ulong(thread_id), ctypes.py_object(kind))


def _drop_pending(thread_id: int) -> None:
    _SET_ASYNC_EXC(ctypes.c_ulong(thread_id), None)  # NULL: clear what is pending, if anything


def _error_text(exc: BaseException) -> str:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-6)
    return "".join(lines).strip()[-4000:]


def _arguments(job: Job) -> tuple[list, dict] | None:
    payload = job.payload
    if payload is None:
        return [], {}
    if not isinstance(payload, dict) or set(payload) - {"args", "kwargs"}:
        return None
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return None
    return args, kwargs


def _result_outcome(job: Job, result: Any) -> Outcome:
    try:
        json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return Outcome.dead(job.id, f"the result of task {job.task} is not JSON: {exc}")
    return Outcome.ack(job.id, result)


def timed_out_outcome(job: Job) -> Outcome:
    limit = f" after {job.timeout:g}s" if job.timeout else ""
    return Outcome.fail(job.id, f"task {job.task} timed out{limit}")


def decide_outcome(job: Job, *, returned: bool, value: Any, error: BaseException | None,
                   timed_out: bool, given_up: bool) -> Outcome:
    """What becomes of a job whose run has ended (pure).

    Past its timeout the attempt fails whatever the task did next; a task that
    ended by raising after the worker gave up on it (end of a drain) is released
    -- its exception, whatever it is, came from the interrupt -- and one that
    returned is acknowledged.
    """
    if timed_out:
        return timed_out_outcome(job)
    if returned:
        return _result_outcome(job, value)
    if given_up:
        return Outcome.release(job.id)
    return Outcome.fail(job.id, _error_text(error) if error is not None else f"task {job.task} ended")


class Run:
    """One job's execution.  ``done`` resolves to its outcome once nothing runs the job.

    Loop-side methods (``on_timeout``, ``give_up``) run on the event loop's thread.
    """

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop) -> None:
        self.job = job
        self.began = time.monotonic()
        self.done: asyncio.Future[Outcome] = loop.create_future()
        self.timed_out = False
        self.given_up = False
        self.stuck = False  # interrupted, and still running after INTERRUPT_GRACE

    @property
    def finished(self) -> bool:
        return self.done.done()

    def interrupt(self, kind: type[TaskInterrupted]) -> None:
        raise NotImplementedError

    def on_timeout(self) -> None:
        if self.finished:
            return
        self.timed_out = True
        self.interrupt(TaskTimeout)

    def give_up(self) -> None:
        """Stop waiting for it (end of a drain): interrupt it; a timed-out run stays failed."""
        if self.finished:
            return
        self.given_up = True
        self.interrupt(TaskInterrupted)

    def _resolve(self, outcome: Outcome) -> None:
        if not self.done.done():
            self.done.set_result(outcome)


class _ThreadRun(Run):
    """A sync task on a pool thread.  ``lock`` orders interrupts against the thread's finish."""

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any],
                 args: list, kwargs: dict) -> None:
        super().__init__(job, loop)
        self._fn, self._args, self._kwargs = fn, args, kwargs
        self.lock = threading.RLock()
        self.thread_id: int | None = None
        self.thread_finished = False
        self.interrupt_sent: type[TaskInterrupted] | None = None
        self.returned = False
        self.value: Any = None
        self.error: BaseException | None = None

    def interrupt(self, kind: type[TaskInterrupted]) -> None:
        with self.lock:
            if self.thread_finished or self.interrupt_sent is not None:
                return  # finished (an interrupt now would hit the thread's next job), or sent once
            self.interrupt_sent = kind
            if self.thread_id is not None:
                _raise_in(self.thread_id, kind)
            # Not started yet: the thread sees interrupt_sent and never calls the task.

    # -- on the pool thread -----------------------------------------------------------------

    def execute(self) -> None:
        """Call the task; record how it ended.  An interrupt may land anywhere in here."""
        try:
            with self.lock:
                if self.interrupt_sent is not None:
                    raise self.interrupt_sent()
                self.thread_id = threading.get_ident()
            current_job_var.set(self.job)
            self.value = self._fn(*self._args, **self._kwargs)
            self.returned = True
        except BaseException as exc:  # noqa: BLE001 - a task's failure is data, not a crash
            self.error = exc

    def outcome(self) -> Outcome:
        return decide_outcome(self.job, returned=self.returned, value=self.value, error=self.error,
                              timed_out=self.timed_out, given_up=self.given_up)


class _Reports:
    """Hands finished runs to the loop: one wake-up of the loop for all the runs that finish
    before it gets round to them (a wake-up costs more than a short job)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._ready: list[tuple[Run, Outcome]] = []

    def put(self, run: Run, outcome: Outcome) -> None:
        with self._lock:
            self._ready.append((run, outcome))
            if len(self._ready) > 1:
                return  # a delivery is already on its way
        try:
            self._loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:
            pass  # the loop is closed: the process is exiting

    def _deliver(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
        for run, outcome in ready:
            run._resolve(outcome)


class TaskThreads:
    """Daemon threads for sync tasks: at least one per run not yet finished.

    Daemon threads, so nothing at exit waits for a task stuck in C.  Thread-safe.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str = "flexiq-task") -> None:
        self._name = name
        self._reports = _Reports(loop)
        self._work: queue_module.SimpleQueue[_ThreadRun] = queue_module.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._unfinished = 0

    def submit(self, run: _ThreadRun) -> None:
        with self._lock:
            self._unfinished += 1
            if self._unfinished > self._threads:
                self._threads += 1
                threading.Thread(target=self._serve, name=f"{self._name}-{self._threads}", daemon=True).start()
        self._work.put(run)

    def _serve(self) -> None:
        ident = threading.get_ident()
        while True:
            run = self._work.get()
            try:
                run.execute()
            except TaskInterrupted:
                pass  # landed after execute() recorded how the task ended
            # The epilogue: finished, and no interrupt for this run outlives it.  The one
            # interrupt a run can get may land in here too; then the loop goes round once more.
            while True:
                try:
                    with run.lock:
                        run.thread_finished = True
                        _drop_pending(ident)
                    break
                except TaskInterrupted:
                    pass
            current_job_var.set(None)
            with self._lock:
                self._unfinished -= 1
            self._reports.put(run, run.outcome())


class _AsyncRun(Run):
    """An async task on the loop; an interrupt is a cancellation."""

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop, coroutine_fn: Callable[..., Any],
                 args: list, kwargs: dict) -> None:
        super().__init__(job, loop)
        context = contextvars.copy_context()
        context.run(current_job_var.set, job)
        self._task = loop.create_task(self._main(coroutine_fn, args, kwargs), name=f"job-{job.id}",
                                      context=context)

    async def _main(self, coroutine_fn: Callable[..., Any], args: list, kwargs: dict) -> None:
        returned, value, error = False, None, None
        try:
            value = await coroutine_fn(*args, **kwargs)
            returned = True
        except BaseException as exc:  # noqa: BLE001 - cancellation included: that is how it ends
            error = exc
        self._resolve(decide_outcome(self.job, returned=returned, value=value, error=error,
                                     timed_out=self.timed_out, given_up=self.given_up))

    def interrupt(self, kind: type[TaskInterrupted]) -> None:
        self._task.cancel()


class _EndedRun(Run):
    """A job that cannot run at all (unknown task, malformed payload): done at once."""

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop, outcome: Outcome) -> None:
        super().__init__(job, loop)
        self._resolve(outcome)

    def interrupt(self, kind: type[TaskInterrupted]) -> None:
        pass


class Executor:
    """Starts runs; ``start`` never raises for anything the task does.  Loop thread only."""

    def __init__(self, tasks: dict[str, Task], *, on_timeout: Callable[[Run], None] | None = None,
                 on_stuck: Callable[[Run], None] | None = None) -> None:
        self.tasks = tasks
        self._threads: TaskThreads | None = None  # made on the loop's first sync task
        self._on_timeout = on_timeout
        self._on_stuck = on_stuck

    def start(self, job: Job) -> Run:
        loop = asyncio.get_running_loop()
        task = self.tasks.get(job.task)
        if task is None:
            return _EndedRun(job, loop, Outcome.dead(
                job.id, f"unknown task {job.task!r}: this worker's app does not register it"))
        arguments = _arguments(job)
        if arguments is None:
            return _EndedRun(job, loop, Outcome.dead(
                job.id, f'the payload of job {job.id} is not {{"args": [...], "kwargs": {{...}}}}: '
                        f"{job.payload!r:.200}"))
        args, kwargs = arguments
        run: Run
        if task.is_async:
            run = _AsyncRun(job, loop, task.fn, args, kwargs)
        else:
            run = _ThreadRun(job, loop, task.fn, args, kwargs)
            if self._threads is None:
                self._threads = TaskThreads(loop)
            self._threads.submit(run)
        if job.timeout:
            timer = loop.call_later(job.timeout, self._time_out, run)
            run.done.add_done_callback(lambda _: timer.cancel())
        return run

    def _time_out(self, run: Run) -> None:
        if run.finished:
            return
        run.on_timeout()
        if self._on_timeout is not None:
            self._on_timeout(run)
        asyncio.get_running_loop().call_later(INTERRUPT_GRACE, self._check_stuck, run)

    def _check_stuck(self, run: Run) -> None:
        if not run.finished:
            run.stuck = True
            if self._on_stuck is not None:
                self._on_stuck(run)
