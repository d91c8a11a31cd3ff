"""The daemon's HTTP endpoint: publishes a snapshot after each tick and serves it.

Requests never wait on the daemon: they read the last published snapshot on the
event loop.  After each tick the endpoint asks the daemon's port (the one the D-Bus
API uses) for its Status document and the queues' stats, and has it bring the
counters up to date from the store on the daemon's I/O thread.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..errors import ConfigError, QueueError
from .counters import Counters, Histogram
from .routes import daemon_routes
from .server import HttpServer
from .snapshot import DaemonFigures, Snapshot, build_snapshot

if TYPE_CHECKING:
    from ..config.model import HttpConfig
    from ..daemon.api_port import ApiPort

log = logging.getLogger(__name__)

TICK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def read_token(path: str | None) -> bytes | None:
    """The bearer token in ``path`` (surrounding whitespace dropped); ConfigError names the key."""
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            token = handle.read().strip()
    except OSError as exc:
        raise ConfigError(f"http.token_file: cannot read {path}: {exc.strerror}") from None
    if not token:
        raise ConfigError(f"http.token_file: {path} is empty")
    if os.stat(path).st_mode & 0o004:
        log.warning("The bearer token file %s is readable by every local user; chmod o-r it.", path)
    return token


class HttpEndpoint:
    """``/metrics``, ``/api/scaler`` and ``/health`` of one daemon, which it sees through its
    ``ApiPort`` as the D-Bus API does.  Runs on the daemon's loop."""

    def __init__(self, port: "ApiPort", config: "HttpConfig", token: bytes | None) -> None:
        self.port = port
        self.counters = Counters()
        self.scale_events: collections.Counter = collections.Counter()
        self.figures = DaemonFigures(version=__version__, tick_durations=Histogram(TICK_BUCKETS))
        self.snapshot: Snapshot | None = None
        self.server = HttpServer(config.host, config.port,
                                 daemon_routes(lambda: self.snapshot, config.scaler_target), token=token)
        self._refresh: asyncio.Task | None = None
        self._pending: list[float] = []  # durations of the ticks not published yet

    @classmethod
    async def start(cls, port: "ApiPort", config: "HttpConfig") -> "HttpEndpoint":
        """Listen (``FlexiqdError`` when it cannot), with a first snapshot and the counters' baseline."""
        endpoint = cls(port, config, read_token(config.token_file))
        await endpoint._read_counters()
        await endpoint.publish()
        await endpoint.server.start()
        port.subscribe(endpoint.on_event)
        log.info("Serving /metrics and /api/scaler on %s:%d.", config.host, endpoint.server.port)
        return endpoint

    async def close(self) -> None:
        self.port.unsubscribe(self.on_event)
        if self._refresh is not None:
            self._refresh.cancel()
        await self.server.close()

    def on_event(self, kind: str, payload: Any) -> None:
        """The port's listener (called on the loop): count scale events and reloads, and after a
        tick catch up the counters and publish a new snapshot (one refresh at a time)."""
        if kind == "scale":
            direction = "up" if payload.desired > payload.previous else "down"
            self.scale_events[(payload.pool, direction, payload.reason)] += 1
        elif kind == "reload":
            applied = payload[0]
            self.figures = dataclasses.replace(self.figures, last_reload_ok=applied,
                                               config_generation=self.figures.config_generation + applied)
        elif kind == "tick":
            self._pending.append(float(payload or 0.0))
            if self._refresh is None or self._refresh.done():
                self._refresh = asyncio.get_running_loop().create_task(self._after_ticks())

    async def _after_ticks(self) -> None:
        while self._pending:
            durations = self.figures.tick_durations.copy()
            for seconds in self._pending:
                durations.observe(seconds)
            ticks, self._pending = len(self._pending), []
            self.figures = dataclasses.replace(self.figures, ticks=self.figures.ticks + ticks,
                                               last_tick_at=time.time(), tick_durations=durations)
            await self._read_counters()
            await self.publish(ticked=True)

    async def _read_counters(self) -> None:
        try:
            await self.port.count(self.counters)
        except QueueError as exc:
            log.warning("Cannot read the queue counters for /metrics (retried next tick): %s", exc)

    async def publish(self, ticked: bool = False) -> None:
        status = await self.port.status()
        if ticked:
            # A tick that read every pool's stats has metrics for each.
            read_ok = all(pool["metrics"] is not None for pool in status["pools"].values())
            now = time.time()
            self.figures = dataclasses.replace(
                self.figures, last_stats_read_at=now if read_ok else self.figures.last_stats_read_at,
                stats_read_failures=self.figures.stats_read_failures + (0 if read_ok else 1))
        self.snapshot = build_snapshot(status, await self.port.queue_stats(), counters=self.counters.frozen(),
                                       scale_events=self.scale_events, daemon=self.figures, now=time.time())
