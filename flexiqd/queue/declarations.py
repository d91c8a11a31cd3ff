"""What each task declares -- its queue, priority, attempts and timeout -- kept in the store.

A producer that enqueues by name (``queue.enqueue("mail.send", ...)``, ``flexiq
enqueue``, the SQL function ``flexiq_enqueue``) may not have the workers' code, so
it cannot know the options of ``@queue.task(...)``.  The workers write them to the
store when they start (``Backend.declare_tasks``); an enqueue by name takes the
options its producer did not give from there, else the defaults of ``NewJob``.

One row per task name, upserted: the declaration written last wins (during a rolling
deploy the new version's workers start after the old ones, so the new declarations
stand once the old workers are replaced).  A row is rewritten only when it changes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

from .types import NewJob

# The options a task declares that an enqueue by name takes from its declaration.
DECLARED_OPTIONS = ("queue", "priority", "max_attempts", "timeout")


@dataclasses.dataclass(frozen=True)
class TaskDeclaration:
    """One task's declared options; ``declared_at`` / ``declared_by``: when and by which
    worker the declaration as it stands was first written (None before it is stored)."""

    task: str
    queue: str
    priority: int
    max_attempts: int
    timeout: float | None
    declared_at: float | None = None
    declared_by: str | None = None

    def options(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in DECLARED_OPTIONS}


def declarations_of(tasks: Mapping[str, Any]) -> list[TaskDeclaration]:
    """The declarations of an application's registered tasks (``Queue.tasks``), by name."""
    return [TaskDeclaration(task=name, queue=task.options.queue, priority=task.options.priority,
                            max_attempts=task.options.max_attempts, timeout=task.options.timeout)
            for name, task in sorted(tasks.items())]


def by_name(task: str, payload: Any, options: Mapping[str, Any]) -> NewJob:
    """A job for a task known only by its name: the options given are kept, the declared
    ones not given are marked to be taken from the task's declaration in the store."""
    return NewJob(task=task, payload=payload, **options,
                  from_declaration=frozenset(name for name in DECLARED_OPTIONS if name not in options))


def resolve(row: Mapping[str, Any], job: NewJob, known: Mapping[str, TaskDeclaration]) -> dict[str, Any]:
    """``row`` (``rows.new_row`` of ``job``) with the options ``job`` takes from its task's
    declaration, where ``known`` has one."""
    declared = known.get(job.task)
    if declared is None or not job.from_declaration:
        return dict(row)
    return {**row, **{name: value for name, value in declared.options().items() if name in job.from_declaration}}


def undeclared(tasks: Iterable[str], known: Mapping[str, TaskDeclaration]) -> list[str]:
    """The names among ``tasks`` that no worker declared."""
    return sorted(set(tasks) - set(known))
