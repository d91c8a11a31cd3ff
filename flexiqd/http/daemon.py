"""The daemon's HTTP endpoint: publishes a snapshot after each tick and serves it.

Requests never wait on the daemon: they read the last published snapshot on the
event loop.  The counters are read from the store on the daemon's I/O thread,
after the tick, as part of the tick's own I/O.
"""

from __future__ import annotations

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
    from ..daemon.service import Daemon

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
    """``/metrics``, ``/api/scaler`` and ``/health`` of one daemon.  Runs on the daemon's loop."""

    def __init__(self, daemon: "Daemon", config: "HttpConfig", token: bytes | None) -> None:
        self.daemon = daemon
        self.counters = Counters()
        self.scale_events: collections.Counter = collections.Counter()
        self.figures = DaemonFigures(version=__version__, tick_durations=Histogram(TICK_BUCKETS))
        self._views_seen: Any = None
        self.snapshot: Snapshot | None = None
        self.server = HttpServer(config.host, config.port,
                                 daemon_routes(lambda: self.snapshot, config.scaler_target), token=token)

    @classmethod
    async def start(cls, daemon: "Daemon") -> "HttpEndpoint":
        """Listen (``FlexiqdError`` when it cannot), with a first snapshot and the counters' baseline."""
        config = daemon.config.http
        endpoint = cls(daemon, config, read_token(config.token_file))
        await endpoint._read_counters()
        endpoint.publish()
        await endpoint.server.start()
        daemon.listeners.append(endpoint.on_event)
        log.info("Serving /metrics and /api/scaler on %s:%d.", config.host, endpoint.server.port)
        return endpoint

    async def close(self) -> None:
        await self.server.close()

    def on_event(self, kind: str, payload: Any) -> None:
        """Count scale events and reloads (a daemon listener; called on the loop)."""
        if kind == "scale":
            direction = "up" if payload.desired > payload.previous else "down"
            self.scale_events[(payload.pool, direction, payload.reason)] += 1
        elif kind == "reload":
            applied = payload[0]
            self.figures = dataclasses.replace(self.figures, last_reload_ok=applied,
                                               config_generation=self.figures.config_generation + applied)

    async def ticked(self, seconds: float) -> None:
        """After each tick: catch up the counters, then publish a new snapshot."""
        controller = self.daemon.controller
        views = controller.views if controller is not None else {}
        # A new views mapping with every pool's stats means this tick read them all.
        read_ok = views is not self._views_seen and all(v.stats is not None for v in views.values())
        self._views_seen = views
        durations = self.figures.tick_durations.copy()
        durations.observe(seconds)
        now = time.time()
        self.figures = dataclasses.replace(
            self.figures, ticks=self.figures.ticks + 1, last_tick_at=now, tick_durations=durations,
            last_stats_read_at=now if read_ok else self.figures.last_stats_read_at,
            stats_read_failures=self.figures.stats_read_failures + (0 if read_ok else 1))
        await self._read_counters()
        self.publish()

    async def _read_counters(self) -> None:
        controller = self.daemon.controller
        if controller is None:
            return
        queues = sorted({q for pool in self.daemon.config.pools.values() for q in pool.queues})
        try:
            await self.daemon.io(self.counters.read, controller.backend, queues, time.time(),
                                 what="reading the queue counters")
        except QueueError as exc:
            log.warning("Cannot read the queue counters for /metrics (retried next tick): %s", exc)

    def publish(self) -> None:
        daemon, controller = self.daemon, self.daemon.controller
        self.snapshot = build_snapshot(
            daemon.config, daemon.options.config_path, daemon.config_error,
            controller.views if controller is not None else {},
            controller.operators.overrides if controller is not None else {},
            counters=self.counters.frozen(), scale_events=self.scale_events,
            daemon=self.figures, now=time.time())
