"""What the daemon's faces need from it -- the D-Bus API and the HTTP endpoint -- and the
daemon's side of it.

Both faces (flexiqd/dbus, flexiqd/http/daemon.py) see the daemon only through ``ApiPort``: the
documents it publishes, the queues' stats and counters, the operators' requests, and a
stream of changes.  They never reach into the controller, its thread or its options,
so each can be tested with a fake port and no daemon at all.  ``DaemonPort`` itself reads
the controller's last published snapshot (``published.Published``), never its attributes;
only the operators' requests go to the controller, on the daemon's I/O thread.

Changes a subscriber hears (always on the daemon's event loop):

    ("tick", seconds)           a tick finished (it took that long): the documents may have changed
    ("scale", ScaleEvent)       a pool's desired count changed (the recorded event, with its seq)
    ("reload", (ok, message))   a reload finished, accepted or rejected
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Protocol

from ..errors import ControlError, FlexiqdError, JobNotFound
from ..queue.types import JobState, Stats
from .documents import event_document, hosts_document, schedules_document, status_document
from .job_queries import JobQuery, job_document, page_document
from .samples import STEP

if TYPE_CHECKING:
    from ..http.counters import Counters
    from .published import Published
    from .service import Daemon

Listener = Callable[[str, Any], None]


class ApiPort(Protocol):
    """The daemon as its API sees it.  Used from the daemon's event loop only."""

    @property
    def config_path(self) -> str:
        """The config file the daemon reads (does not change while it runs)."""

    def config_error(self) -> str | None:
        """Why the last reload was rejected; None when the running config is the file's."""

    def pool_names(self) -> list[str]:
        """The configured pools, sorted."""

    async def status(self) -> dict[str, Any]:
        """The Status document (documents.status_document) as of the last tick."""

    async def queue_stats(self) -> dict[str, Stats]:
        """Each served queue's stats as the last tick read them (a queue whose read failed: absent)."""

    async def count(self, counters: Counters) -> None:
        """Bring ``counters`` up to date with the store, for the served queues (QueueError when it
        cannot be read; the next call catches up)."""

    async def events_since(self, seq: int) -> list[dict[str, Any]]:
        """Event documents with a sequence number above ``seq``, oldest first."""

    async def history(self, pool: str, since: float) -> dict[str, Any]:
        """The pool's samples and scale events at or after ``since`` (docs/dbus-api.md, History)."""

    # The jobs' own data (arguments, results, errors): for root and the steering group only, which
    # the API checks before it asks.  ControlError for a bad query or an unknown job.

    async def jobs(self, query: JobQuery) -> dict[str, Any]:
        """A page of jobs, newest first (job_queries.page_document)."""

    async def job(self, job_id: int) -> dict[str, Any]:
        """One job whole, with its attempts (job_queries.job_document)."""

    async def retry_dead(self, queue: str | None, job_ids: list[int] | None) -> int:
        """Revive dead letters (of ``queue``; only ``job_ids`` when given); how many."""

    async def purge_dead(self, queue: str | None, job_ids: list[int] | None) -> int:
        """Delete dead letters (of ``queue``; only ``job_ids`` when given); how many."""

    # The requests below raise ControlError for a request that is wrong (an unknown pool,
    # a count out of range) and FlexiqdError for one that could not be done.  Each takes
    # effect at the next tick, which it brings forward.

    async def pin(self, pool: str, workers: int, seconds: float | None) -> None:
        """Hold ``pool`` at ``workers`` for ``seconds`` (None: until unpinned)."""

    async def unpin(self, pool: str) -> None: ...

    async def pause(self, pool: str) -> None: ...

    async def resume(self, pool: str) -> None: ...

    async def drain(self, pool: str) -> None: ...

    async def clear_ceiling(self, pool: str) -> None:
        """Forget the pool's measured ceiling: it is measured again."""

    async def restart(self, pool: str) -> int:
        """Replace every worker of ``pool`` started before now, in steps (daemon.restarts); the
        request's id, as the Status document's ``restart.id`` shows it."""

    # The schedules (flexiqd.daemon.schedules): read by everyone, run/paused/resumed by root
    # and the steering group.  ControlError for a schedule not configured.

    async def schedules(self) -> dict[str, Any]:
        """The Schedules document (documents.schedules_document)."""

    async def run_schedule(self, name: str) -> int:
        """Enqueue the schedule's job now, outside its slots; the job's id."""

    async def pause_schedule(self, name: str, paused: bool) -> bool:
        """Pause (True) or resume the schedule on every host; whether that changed it."""

    def request_reload(self) -> None:
        """Reload the config file soon; the outcome comes as a ("reload", ...) change."""

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(kind, payload)`` for every change (see the module docstring)."""

    def unsubscribe(self, listener: Listener) -> None:
        """Stop calling ``listener``; idempotent."""


class DaemonPort:
    """``ApiPort`` on a running ``Daemon``: controller work runs on the daemon's I/O thread."""

    def __init__(self, daemon: "Daemon") -> None:
        self._daemon = daemon

    @property
    def config_path(self) -> str:
        return self._daemon.options.config_path

    def config_error(self) -> str | None:
        return self._daemon.config_error

    def pool_names(self) -> list[str]:
        config = self._daemon.config
        return sorted(config.pools) if config is not None else []

    async def status(self) -> dict[str, Any]:
        daemon = self._daemon
        config_path, config_error = daemon.options.config_path, daemon.config_error

        def build() -> dict[str, Any]:
            published = self._published()
            if published is None or daemon.backend is None:
                return status_document(daemon.config, config_path, config_error, {}, {}, time.time())
            now = daemon.backend.clock()  # the store's time: the hosts' beats are in it
            hosts = (hosts_document(daemon.hosts, published.global_caps, now)
                     if daemon.hosts is not None else None)
            firer = daemon.schedules
            return status_document(published.config, config_path, config_error, published.views,
                                   published.overrides, now, hosts, published.dependency_stats,
                                   firer.views() if firer is not None else None,
                                   firer.counters if firer is not None else None,
                                   store_problem=published.store_problem,
                                   fleet_problem=published.fleet_problem)

        return await daemon.io(build)

    async def queue_stats(self) -> dict[str, Stats]:
        published = self._published()
        return published.queue_stats() if published is not None else {}

    async def count(self, counters: "Counters") -> None:
        daemon = self._daemon
        backend = daemon.backend
        if self._published() is None or backend is None or daemon.config is None:
            return
        queues = sorted({q for pool in daemon.config.pools.values() for q in pool.queues})
        await daemon.io(counters.read, backend, queues, backend.clock(), what="reading the queue counters")

    async def events_since(self, seq: int) -> list[dict[str, Any]]:
        published = self._published()
        return [event_document(e) for e in published.events_since(seq)] if published is not None else []

    async def history(self, pool: str, since: float) -> dict[str, Any]:
        published = self._published()
        if published is None:
            raise FlexiqdError("flexiqd is still starting")
        pools = published.config.pools
        if pool not in pools:
            raise ControlError(f"no pool {pool!r} (pools: {', '.join(sorted(pools)) or 'none'})")
        events = [event_document(e) for e in published.events_since(0) if e.pool == pool and e.at >= since]
        return {"pool": pool, "target_age": pools[pool].policy.targets.age, "step": STEP,
                "samples": published.samples.since(pool, since), "events": events}

    async def jobs(self, query: JobQuery) -> dict[str, Any]:
        backend = self._backend()
        found = await self._daemon.io(lambda: backend.list_jobs(
            queue=query.queue, state=query.state, task=query.task, tenant=query.tenant, before=query.before,
            limit=query.limit), what="looking up jobs")
        return page_document(found, query)

    async def job(self, job_id: int) -> dict[str, Any]:
        backend = self._backend()

        def read() -> dict[str, Any]:
            try:
                return job_document(backend.get(job_id), backend.executions(job_id=job_id))
            except JobNotFound:
                raise ControlError(f"no job with id {job_id}") from None

        return await self._daemon.io(read, what="reading a job")

    async def retry_dead(self, queue: str | None, job_ids: list[int] | None) -> int:
        backend = self._backend()
        return await self._daemon.io(lambda: backend.retry_dead(queue=queue, job_ids=job_ids, now=backend.clock()),
                                     what="retrying dead letters")

    async def purge_dead(self, queue: str | None, job_ids: list[int] | None) -> int:
        backend = self._backend()
        return await self._daemon.io(lambda: backend.purge(states=[JobState.DEAD], finished_before=backend.clock() + 1,
                                                           queue=queue, job_ids=job_ids),
                                     what="purging dead letters")

    def _published(self) -> "Published | None":
        """The controller's last snapshot (None: no controller yet)."""
        controller = self._daemon.controller
        return controller.published if controller is not None else None

    def _controller(self):
        controller = self._daemon.controller
        if controller is None:
            raise FlexiqdError("flexiqd is still starting")
        return controller

    def _backend(self):
        backend = self._daemon.backend
        if backend is None or self._daemon.controller is None:
            raise FlexiqdError("flexiqd is still starting")
        return backend

    async def _control(self, name: str, *args: Any) -> None:
        controller = self._controller()

        def request() -> None:
            getattr(controller.operators, name)(*args)
            controller.publish()  # the Status document shows the override before the tick it wakes

        await self._daemon.io(request)
        self._daemon.wake()  # apply it now, not at the next tick

    async def pin(self, pool: str, workers: int, seconds: float | None) -> None:
        await self._control("pin", pool, workers, seconds)

    async def unpin(self, pool: str) -> None:
        await self._control("unpin", pool)

    async def pause(self, pool: str) -> None:
        await self._control("pause", pool)

    async def resume(self, pool: str) -> None:
        await self._control("resume", pool)

    async def drain(self, pool: str) -> None:
        await self._control("drain", pool)

    async def clear_ceiling(self, pool: str) -> None:
        await self._control("clear_ceiling", pool)

    async def restart(self, pool: str) -> int:
        controller = self._controller()
        ident = await self._daemon.io(controller.restarts.request, pool, what=f"restarting pool {pool}")
        self._daemon.wake()  # the first step now, not at the next tick
        return ident

    async def schedules(self) -> dict[str, Any]:
        firer = self._daemon.schedules
        views = firer.views() if firer is not None else {}
        return schedules_document(views, self._daemon.config, firer.counters if firer is not None else None)

    def _firer(self, name: str):
        firer = self._daemon.schedules
        if firer is None:
            raise FlexiqdError("flexiqd is still starting")
        config = self._daemon.config
        if config is None or name not in config.schedules:
            known = ", ".join(sorted(config.schedules)) if config is not None else ""
            raise ControlError(f"no schedule {name!r} (schedules: {known or 'none'})")
        return firer

    async def run_schedule(self, name: str) -> int:
        firer = self._firer(name)
        return await self._daemon.io(firer.run_now, name, what=f"running schedule {name}")

    async def pause_schedule(self, name: str, paused: bool) -> bool:
        firer = self._firer(name)
        return await self._daemon.io(firer.pause, name, paused, what=f"pausing schedule {name}")

    def request_reload(self) -> None:
        self._daemon.request_reload()

    def subscribe(self, listener: Listener) -> None:
        self._daemon.listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        if listener in self._daemon.listeners:
            self._daemon.listeners.remove(listener)
