"""Which path answers what: the daemon's (from its latest snapshot) and ``flexiq scaler``'s
(from the store).  ``/health`` is public; the others need the token when one is set."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..errors import QueueError
from ..queue.store.backend import Backend
from .counters import Counters
from .scaler import scaler_answer, scaler_selection
from .server import HttpError, Request, Response, Route, json_response
from .snapshot import Snapshot

HEALTH = Route(lambda request: json_response({"status": "ok"}), public=True)


def daemon_routes(latest: Callable[[], Snapshot], target: int) -> dict[str, Route]:
    """Routes answered from ``latest()``, the snapshot the daemon published last: no I/O.

    /metrics renders on a thread of its own (a snapshot is immutable), so a large
    exposition -- hundreds of queue and task series -- never holds up the event loop,
    and renders each snapshot once however many scrapers ask for it.
    """
    renderer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flexiqd-metrics")
    rendered: list = [None, b""]  # [snapshot, its exposition]

    async def metrics(request: Request) -> Response:
        from .metrics import render

        if request.query:
            raise HttpError(400, "/metrics takes no query parameters")
        snapshot = latest()
        if rendered[0] is snapshot:
            body = rendered[1]
        else:
            body = await asyncio.get_running_loop().run_in_executor(renderer, render, snapshot)
            rendered[:] = [snapshot, body]
        return Response(200, body, CONTENT_TYPE_LATEST)

    def scaler(request: Request) -> Response:
        snapshot = latest()
        queues, name, pool = scaler_selection(
            request.query, pool_queues=snapshot.pool_queues, all_queues=snapshot.served_queues(),
            known_queue=lambda queue: queue in snapshot.queue_stats)
        missing = [queue for queue in queues if queue not in snapshot.queue_stats]
        if missing:  # the last read failed: no answer (KEDA holds) beats a wrong one
            return json_response({"error": f"no current stats for queue {missing[0]!r}: "
                                           f"the daemon's last read of it failed"}, 503)
        return json_response(scaler_answer([snapshot.queue_stats[q] for q in queues], target=target,
                                           name=name, pool=pool))

    return {"/metrics": Route(metrics), "/api/scaler": Route(scaler), "/health": HEALTH}


def store_routes(backend: Backend, target: int, queues: Sequence[str] | None,
                 clock: Callable[[], float] | None = None) -> dict[str, Route]:
    """``flexiq scaler``'s routes: each answer read from the store on a thread of its own, so the
    server keeps answering (and timing out slow clients) while a read waits on a lock.

    /metrics has the daemon's queue-level families (same names, docs/metrics.md) for the
    queues served -- ``queues``, or every queue the store has -- read at each scrape; its
    counters start at zero when the scaler starts, as the daemon's do.
    """
    clock = clock or backend.clock
    reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flexiq-scaler")
    counters = Counters()

    def read(names: list[str]) -> list:
        now = clock()
        return [backend.stats(name, now=now) for name in names]

    def exposition_now() -> bytes:
        from .metrics import exposition, queue_families

        served = list(queues) if queues is not None else backend.queues()
        now = clock()
        stats = {name: backend.stats(name, now=now) for name in served}
        counters.read(backend, served, now)
        return exposition(queue_families(served, stats, counters.frozen()))

    async def metrics(request: Request) -> Response:
        if request.query:
            raise HttpError(400, "/metrics takes no query parameters")
        try:
            body = await asyncio.get_running_loop().run_in_executor(reader, exposition_now)
        except QueueError as exc:  # no answer beats a wrong one: the scrape fails, Prometheus says so
            return json_response({"error": f"cannot read the queue stats: {exc}"}, 503)
        return Response(200, body, CONTENT_TYPE_LATEST)

    async def scaler(request: Request) -> Response:
        loop = asyncio.get_running_loop()
        try:
            if queues is not None:
                served = list(queues)
                known = served.__contains__
            else:
                served = await loop.run_in_executor(reader, backend.queues)
                known = bool  # any queue name: an unknown one is empty
            chosen, name, pool = scaler_selection(request.query, pool_queues=lambda _: None,
                                                  all_queues=served, known_queue=known)
            stats = await loop.run_in_executor(reader, read, chosen)
        except QueueError as exc:
            return json_response({"error": f"cannot read the queue stats: {exc}"}, 503)
        return json_response(scaler_answer(stats, target=target, name=name, pool=pool))

    return {"/metrics": Route(metrics), "/api/scaler": Route(scaler), "/health": HEALTH}
