"""The application's view of the queue: ``Queue(url)``, ``@queue.task``, ``enqueue``, ``stats``."""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable

from ..errors import TaskError
from . import declarations
from .store.backend import Backend
from .tasks import Task, TaskOptions
from .types import Job, NewJob, Stats
from .url import default_url, open_backend


class Queue:
    """A job queue in a store named by URL, and the tasks an application registers on it.

    The store is opened on first use, so an application module can create its
    ``Queue`` at import time and a worker can still point it elsewhere
    (``url=None`` means ``$FLEXIQ_URL``, else the packaged default).
    Thread-safe.
    """

    def __init__(self, url: str | None = None, *, clock: Callable[[], float] | None = None) -> None:
        self._url = url
        #: The time jobs are enqueued at: the store's (``Backend.clock``), unless one is given.
        self.clock: Callable[[], float] = clock if clock is not None else self._store_clock
        self.tasks: dict[str, Task] = {}
        self._backend: Backend | None = None
        self._owns_backend = True
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self._url or default_url()

    @property
    def backend(self) -> Backend:
        with self._lock:
            if self._backend is None:
                self._backend = open_backend(self.url)
                self._owns_backend = True
            return self._backend

    def use(self, url: str, *, backend: Backend | None = None) -> None:
        """Point this queue at another store (closing the one it had open).

        ``backend``: that store already open, shared with its owner, who closes it (a
        worker hands its own, so a task's follow-up jobs go where the worker claims and
        take no connection of their own).
        """
        with self._lock:
            if self._backend is not None and self._owns_backend:
                self._backend.close()
            self._backend = backend
            self._owns_backend = backend is None
            self._url = url

    def close(self) -> None:
        with self._lock:
            if self._backend is not None and self._owns_backend:
                self._backend.close()
            self._backend = None
            self._owns_backend = True

    # -- tasks -----------------------------------------------------------------------------

    def task(self, name: str | None = None, *, queue: str = "default", priority: int = 0,
             max_attempts: int = 3, timeout: float | None = None,
             uses: Iterable[str] = ()) -> Callable[[Callable], Task]:
        """Register a function (sync or ``async def``) as a task, by default as ``module.function``.

        ``uses``: names of the shared dependencies it calls (``["partner_api"]``): a
        worker starts its jobs only within their configured limits.
        """
        if callable(name):  # used bare: @queue.task
            return self.task()(name)  # type: ignore[return-value]
        used = (uses,) if isinstance(uses, str) else tuple(uses)
        if not all(isinstance(dep, str) and dep for dep in used):
            raise TaskError(f"uses= must be dependency names, got {uses!r}")

        def register(fn: Callable[..., Any]) -> Task:
            task_name = name or f"{fn.__module__}.{fn.__qualname__}"
            if task_name in self.tasks and self.tasks[task_name].fn is not fn:
                raise TaskError(f"task name {task_name!r} is registered twice")
            options = TaskOptions(queue=queue, priority=priority, max_attempts=max_attempts,
                                  timeout=timeout, uses=tuple(dict.fromkeys(used)))
            registered = Task(self, fn, task_name, options)
            self.tasks[task_name] = registered
            return registered

        return register

    # -- jobs ------------------------------------------------------------------------------

    def enqueue(self, task: str, args: Iterable[Any] = (), kwargs: dict | None = None, *,
                connection: Any = None, **options: Any) -> int:
        """Add one job for the task named ``task``; options as in ``NewJob``.

        The name need not be registered here (a producer may not import the workers'
        code): then the options not given are the task's declaration, as its workers
        wrote it to the store (``declarations``), else ``NewJob``'s defaults; a worker
        dead-letters jobs of tasks it does not know.  ``connection``: the application's
        psycopg or sqlite3 connection, to enqueue in its transaction (``enqueue_many``).
        """
        registered = self.tasks.get(task)
        if registered is not None:
            job = registered.new_job(tuple(args), kwargs, **options)
        else:
            job = declarations.by_name(task, {"args": list(args), "kwargs": dict(kwargs or {})}, options)
        return self.enqueue_many([job], connection=connection)[0]

    def _store_clock(self) -> float:
        return self.backend.clock()

    def enqueue_many(self, jobs: Iterable[NewJob], *, connection: Any = None) -> list[int]:
        """Add jobs in one transaction (all or none); return their ids.

        ``connection``: the application's own connection to the queue's database -- a
        psycopg 3 connection on PostgreSQL, a sqlite3 connection to the store's file on
        SQLite -- so the jobs are written in its transaction and exist exactly when it
        commits (docs/transactional-enqueue.md).  Nothing is committed here, except in
        a connection in autocommit mode.
        """
        if connection is not None:
            # Loaded only here: a worker, and most applications, never pass a connection.
            from .in_transaction import enqueue_in

            return enqueue_in(connection, list(jobs), backend=self.backend, now=self.clock())
        return self.backend.enqueue(list(jobs), now=self.clock())

    def get(self, job_id: int) -> Job:
        return self.backend.get(job_id)

    def stats(self, queue: str = "default", *, window: float = 60.0, horizon: float = 0.0) -> Stats:
        """The queue's signals; ``horizon``: also count the delayed jobs coming due within it."""
        return self.backend.stats(queue, now=self.clock(), window=window, horizon=horizon)
