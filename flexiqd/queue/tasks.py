"""Tasks: functions registered under a name so a worker can run them by that name."""

from __future__ import annotations

import dataclasses
import inspect
from typing import TYPE_CHECKING, Any, Callable

from .types import NewJob

if TYPE_CHECKING:
    from .api import Queue


@dataclasses.dataclass(frozen=True)
class TaskOptions:
    """Defaults for jobs of one task; each enqueue may override them.

    ``uses``: the shared dependencies the task calls (``dependencies.<name>`` in the
    daemon's config); a worker starts its jobs only within those dependencies'
    limits.  Not a job option: it belongs to the task's code.
    """

    queue: str = "default"
    priority: int = 0
    max_attempts: int = 3
    timeout: float | None = None
    uses: tuple[str, ...] = ()


class Task:
    """A registered function.  Calling it runs it here; ``enqueue`` runs it on a worker."""

    def __init__(self, owner: "Queue", fn: Callable[..., Any], name: str, options: TaskOptions) -> None:
        self.queue = owner
        self.fn = fn
        self.name = name
        self.options = options
        self.is_async = inspect.iscoroutinefunction(fn)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name} on queue {self.options.queue}>"

    def job(self, *args: Any, **kwargs: Any) -> NewJob:
        """A job for this task with its default options (see ``Queue.enqueue_many``)."""
        return self.new_job(args, kwargs)

    def new_job(self, args: tuple | list = (), kwargs: dict | None = None, **options: Any) -> NewJob:
        """A job with per-job options: queue, priority, delay, run_at, max_attempts,
        timeout, idempotency_key, tenant."""
        fields = dataclasses.asdict(self.options)
        del fields["uses"]
        fields.update(options)
        return NewJob(task=self.name, payload={"args": list(args), "kwargs": dict(kwargs or {})},
                      **fields)

    def enqueue(self, *args: Any, connection: Any = None, **kwargs: Any) -> int:
        """Add one job calling this task with these arguments; return its id.

        ``connection``: the application's psycopg or sqlite3 connection, to enqueue in its
        transaction (``Queue.enqueue_many``).  A task with an argument of its own named
        ``connection`` is given it through ``schedule(kwargs=...)``.
        """
        return self.queue.enqueue_many([self.new_job(args, kwargs)], connection=connection)[0]

    def schedule(self, args: tuple | list = (), kwargs: dict | None = None, *, connection: Any = None,
                 **options: Any) -> int:
        """Add one job with per-job options (delay=, run_at=, priority=, idempotency_key=, ...)."""
        return self.queue.enqueue_many([self.new_job(args, kwargs, **options)], connection=connection)[0]

    def map(self, argument_lists: Any, *, connection: Any = None) -> list[int]:
        """Add one job per item (a tuple of positional arguments, or one argument) in one transaction."""
        jobs = [self.new_job(a if isinstance(a, (tuple, list)) else (a,)) for a in argument_lists]
        return self.queue.enqueue_many(jobs, connection=connection)
