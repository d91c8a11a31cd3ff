"""Running one job's task: sync tasks on a thread, async ones on the loop, both under a timeout.

Everything a task can do wrong ends here as an ``Outcome``: an exception is a
failure (retried), a timeout is a failure, an unknown task or a malformed payload
or result is dead on arrival (retrying cannot help).  Nothing escapes to the
worker's other jobs.
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import dataclasses
import json
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..queue.tasks import Task
from ..queue.types import Job, Outcome

current_job_var: contextvars.ContextVar[Job | None] = contextvars.ContextVar("flexiqd_job", default=None)


def current_job() -> Job | None:
    """The job the calling task is running for (None outside a task)."""
    return current_job_var.get()


class TaskTimeout(Exception):
    """Raised inside a task that ran past its timeout."""


@dataclasses.dataclass
class SyncRun:
    """Where a sync task runs, so a timeout can interrupt that very thread."""

    thread_id: int | None = None
    finished: bool = False
    timed_out: bool = False


def _interrupt_thread(thread_id: int) -> bool:
    # The only way to stop a Python thread from outside: an asynchronous
    # exception, delivered at its next bytecode.  A thread blocked in C stays
    # blocked until that call returns; the worker counts it as stuck.
    hit = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(TaskTimeout))
    return hit == 1


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


class Executor:
    """Runs jobs' tasks.  ``run`` never raises for anything the task does."""

    def __init__(self, tasks: dict[str, Task], threads: int) -> None:
        self.tasks = tasks
        self._threads = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="flexiq-task")
        self.sync_runs: dict[int, SyncRun] = {}  # job id -> its sync run, until its thread returns

    def shutdown(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def run(self, job: Job) -> Outcome:
        task = self.tasks.get(job.task)
        if task is None:
            return Outcome.dead(job.id, f"unknown task {job.task!r}: this worker's app does not register it")
        arguments = _arguments(job)
        if arguments is None:
            return Outcome.dead(job.id, f"the payload of job {job.id} is not "
                                        f'{{"args": [...], "kwargs": {{...}}}}: {job.payload!r:.200}')
        args, kwargs = arguments
        try:
            if task.is_async:
                return await self._run_async(job, task, args, kwargs)
            return await self._run_sync(job, task, args, kwargs)
        except asyncio.CancelledError:
            raise
        except TaskTimeout:
            limit = f" after {job.timeout:g}s" if job.timeout else ""
            return Outcome.fail(job.id, f"task {job.task} timed out{limit}")
        except Exception as exc:  # noqa: BLE001 - a task's failure is data, not a crash
            return Outcome.fail(job.id, _error_text(exc))

    async def _run_async(self, job: Job, task: Task, args: list, kwargs: dict) -> Outcome:
        token = current_job_var.set(job)
        try:
            coroutine = task.fn(*args, **kwargs)
            if job.timeout:
                try:
                    result = await asyncio.wait_for(coroutine, job.timeout)
                except asyncio.TimeoutError:
                    raise TaskTimeout() from None
            else:
                result = await coroutine
        finally:
            current_job_var.reset(token)
        return _result_outcome(job, result)

    async def _run_sync(self, job: Job, task: Task, args: list, kwargs: dict) -> Outcome:
        run = SyncRun()

        def call() -> Any:
            run.thread_id = threading.get_ident()
            try:
                current_job_var.set(job)
                return task.fn(*args, **kwargs)
            finally:
                run.finished = True
                self.sync_runs.pop(job.id, None)

        self.sync_runs[job.id] = run
        future = asyncio.get_running_loop().run_in_executor(self._threads, call)
        try:
            result = await asyncio.wait_for(asyncio.shield(future), job.timeout) if job.timeout else await future
        except asyncio.TimeoutError:
            run.timed_out = True
            self._interrupt(run)
            raise TaskTimeout() from None
        return _result_outcome(job, result)

    @staticmethod
    def _interrupt(run: SyncRun) -> None:
        if run.thread_id is not None and not run.finished:
            _interrupt_thread(run.thread_id)

    def stuck(self) -> int:
        """Threads still inside a task that already timed out (they hold a slot)."""
        return sum(1 for run in list(self.sync_runs.values()) if run.timed_out)

    def interrupt_all(self) -> None:
        """Raise TaskTimeout in every thread still running a task (end of a drain)."""
        for run in list(self.sync_runs.values()):
            self._interrupt(run)
