"""The KEDA answer: ``/api/scaler``, compatible with flexiq's and telling more.  Pure.

flexiq answers ``{"metricValue": <runnable>, "targetValue": t, "queueName": q}``;
KEDA's ``metrics-api`` trigger reads ``metricValue`` and sizes to
ceil(value / target).  Here ``metricValue`` counts the running jobs too, so a
queue with work in flight is never "inactive" and never scaled to zero under it.
``timeToDrainSeconds`` is runnable / completion rate; while nothing completes it
is the oldest runnable job's age, which keeps growing as long as nothing drains
(``timeToDrainKnown`` says which).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from ..queue.types import Stats
from .server import HttpError


def scaler_answer(stats: Sequence[Stats], *, target: int, name: str, pool: str | None = None) -> dict[str, Any]:
    """The answer for the queues in ``stats`` taken together, named ``name`` (``*`` for all)."""
    runnable = sum(s.runnable for s in stats)
    running = sum(s.running for s in stats)
    delayed = sum(s.delayed for s in stats)
    completion_rate = sum(s.completion_rate for s in stats)
    oldest = max((s.oldest_runnable_age for s in stats), default=0.0)
    known = runnable == 0 or completion_rate > 0
    drain = 0.0 if runnable == 0 else (runnable / completion_rate if completion_rate > 0 else oldest)
    answer: dict[str, Any] = {
        "metricValue": runnable + running,
        "targetValue": target,
        "queueName": name,
        "runnable": runnable,
        "running": running,
        "delayed": delayed,
        "oldestRunnableAgeSeconds": round(oldest, 3),
        "timeToDrainSeconds": round(drain, 3),
        "timeToDrainKnown": known,
        "completionRate": round(completion_rate, 6),
    }
    if pool is not None:
        answer["poolName"] = pool
    return answer


def scaler_selection(query: Mapping[str, str], *, pool_queues: Callable[[str], Sequence[str] | None],
                     all_queues: Sequence[str], known_queue: Callable[[str], bool]) -> tuple[list[str], str, str | None]:
    """Which queues ``?queue=`` / ``?pool=`` ask for: (queues, name, pool); ``HttpError`` when bad."""
    unknown = sorted(set(query) - {"queue", "pool"})
    if unknown:
        raise HttpError(400, f"unknown query parameter {unknown[0]!r} (known: queue, pool)")
    if "queue" in query and "pool" in query:
        raise HttpError(400, "give queue or pool, not both")
    if "pool" in query:
        queues = pool_queues(query["pool"])
        if queues is None:
            raise HttpError(404, f"no pool named {query['pool']!r}")
        return list(queues), ",".join(queues), query["pool"]
    if "queue" in query:
        name = query["queue"]
        if not name or not known_queue(name):
            raise HttpError(404, f"no queue named {name!r} here")
        return [name], name, None
    return list(all_queues), "*", None
