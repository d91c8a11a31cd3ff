"""The flexiqd process: startup -> control loop -> shutdown, speaking sd_notify throughout.

Signals only set flags (or wake the loop); everything else happens in the loop.
Blocking work -- queue reads, systemd calls -- runs on one dedicated thread, so
the loop stays responsive and sd-bus/SQLite objects never cross threads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from ..config import DEFAULT_CONFIG_PATH, DaemonConfig, load_config
from ..errors import ConfigError, FlexiqdError
from ..fleet.base import Fleet
from ..notify import Notifier, watchdog_interval
from ..queue.url import open_backend
from .controller import Controller
from .events import EventLog

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 78  # EX_CONFIG: the config file is invalid; systemd shows it in the unit's status

# The applied config, for workers, in the daemon's runtime directory (/run/flexiqd).
APPLIED_CONFIG = "applied.yaml"

# After a wake-up from a worker unit's change, tick at most this often.
MIN_TICK_GAP = 0.2


@dataclasses.dataclass(frozen=True)
class DaemonOptions:
    config_path: str
    fleet: str | None = None          # overrides the config's "fleet"
    bus_address: str | None = None    # the system bus by default
    serve_api: bool = True            # offer org.flexiq.flexiqd1 on the bus
    state_dir: str | None = None      # where the event history is kept ($STATE_DIRECTORY)


def state_dir(options: DaemonOptions, config: DaemonConfig) -> str | None:
    """$STATE_DIRECTORY (systemd's StateDirectory=), else the SQLite store's folder."""
    if options.state_dir:
        return options.state_dir
    if os.environ.get("STATE_DIRECTORY"):
        return os.environ["STATE_DIRECTORY"].split(":")[0]
    if config.store.startswith("sqlite:///"):
        from ..queue.url import sqlite_path

        return os.path.dirname(os.path.abspath(sqlite_path(config.store)))
    return None


class Daemon:
    def __init__(self, options: DaemonOptions, notifier: Notifier | None = None) -> None:
        self.options = options
        self.notifier = notifier or Notifier()
        self.config: DaemonConfig | None = None
        self.config_error: str | None = None
        self.controller: Controller | None = None
        self.fleet: Fleet | None = None
        self._systemd = None
        self._watcher = None
        self.api = None                   # the D-Bus service, once serving
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flexiqd-io")
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._reload_requested = False
        self.listeners: list[Callable[[str, Any], None]] = []  # e.g. the D-Bus service

    # -- requests (from signal handlers or the D-Bus API) --------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    def request_reload(self) -> None:
        self._reload_requested = True
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    async def io(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run blocking work on the daemon's one I/O thread."""
        return await asyncio.get_running_loop().run_in_executor(self._io, lambda: fn(*args))

    # -- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        try:
            await self._startup(loop)
        except ConfigError as exc:
            log.error("Cannot start: %s", exc)
            self.notifier.status(f"config error: {exc}")
            return EXIT_CONFIG
        except FlexiqdError as exc:
            log.error("Cannot start: %s", exc)
            self.notifier.status(f"cannot start: {exc}")
            return EXIT_FAILURE
        try:
            await self._loop()
        finally:
            await self._shutdown(loop)
        return EXIT_OK

    async def _startup(self, loop: asyncio.AbstractEventLoop) -> None:
        self.config = load_config(self.options.config_path)
        self._publish(self.config)
        kind = self.options.fleet or self.config.fleet
        backend = await self.io(open_backend, self.config.store)
        self.fleet = await self.io(self._make_fleet, kind)
        folder = state_dir(self.options, self.config)
        events = EventLog(os.path.join(folder, "events.jsonl") if folder else None)
        self.controller = Controller(self.config, backend, self.fleet, events=events)
        # Adopt: the first tick lists what systemd already runs and sizes from there.
        await self.io(self.controller.tick)
        if self._systemd is not None:
            from ..fleet.systemd import UnitWatcher

            self._watcher = UnitWatcher(self.wake, self.options.bus_address)
            try:
                self._watcher.start(loop)
            except FlexiqdError as exc:
                log.warning("Not following unit changes (polling every tick instead): %s", exc)
                self._watcher = None
        if self.options.serve_api:
            from .dbus_api import serve_api

            try:
                self.api = await serve_api(self, self.options.bus_address)
            except FlexiqdError as exc:
                log.warning("Not offering the D-Bus API (flexiqctl will not reach this daemon): %s", exc)
        pools = ", ".join(f"{v.pool} ({v.active + v.starting} running)" for v in self.controller.views.values())
        log.info("flexiqd ready with %s fleet; pools: %s.", kind, pools or "none")
        self.notifier.ready(self.controller.status_line())

    def _make_fleet(self, kind: str) -> Fleet:
        if kind == "process":
            from ..fleet.process import ProcessFleet

            return ProcessFleet()
        from ..fleet.systemd import Systemd, SystemdFleet, open_bus

        self._systemd = Systemd(open_bus(self.options.bus_address))
        # Workers read their pool from the default file unless told where the daemon's is.
        config_path = self._applied_path()
        if config_path is None and self.options.config_path != DEFAULT_CONFIG_PATH:
            config_path = self.options.config_path
        return SystemdFleet(self._systemd, config_path=config_path)

    def _applied_path(self) -> str | None:
        """Where the config in force is published for the workers ($RUNTIME_DIRECTORY), if anywhere."""
        runtime = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
        return os.path.join(runtime, APPLIED_CONFIG) if runtime else None

    def _publish(self, config: DaemonConfig) -> None:
        """Give workers the config the daemon applied, not whatever the file holds now.

        A worker unit reads its pool's settings when it starts; an edit not yet
        reloaded -- or one with a typo -- must not reach a worker that systemd
        restarts in the meantime.
        """
        path = self._applied_path()
        if path is None:
            return
        try:
            with open(f"{path}.tmp", "w", encoding="utf-8") as handle:
                handle.write(config.source)
            os.replace(f"{path}.tmp", path)
        except OSError as exc:
            log.warning("Cannot publish the applied config at %s (workers read %s): %s",
                        path, self.options.config_path, exc.strerror)

    async def _loop(self) -> None:
        assert self.config is not None and self.controller is not None
        interval = watchdog_interval()
        loop = asyncio.get_running_loop()
        last_tick = loop.time()
        while not self._stop.is_set():
            await self._sleep_until_next_tick(last_tick)
            if self._stop.is_set():
                break
            if self._reload_requested:
                await self._reload()
            last_tick = loop.time()
            try:
                decisions = await self.io(self.controller.tick)
            except FlexiqdError as exc:
                log.error("Tick failed, holding every pool: %s", exc)
                decisions = {}
            status = self.controller.status_line()
            if self.config_error:
                status += f" (config rejected: {self.config_error})"
            self.notifier.status(status)
            if interval:
                self.notifier.watchdog()
            for decision in decisions.values():
                if decision.changed:
                    self._emit("scale", decision)

    async def _sleep_until_next_tick(self, last_tick: float) -> None:
        assert self.config is not None
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            remaining = last_tick + self.config.tick - loop.time()
            if remaining <= 0:
                return
            waiters = [asyncio.create_task(self._wake.wait()), asyncio.create_task(self._stop.wait())]
            try:
                await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
            if self._wake.is_set():
                self._wake.clear()
                # A worker changed state (or a reload was asked): act soon, but not in a storm.
                await asyncio.sleep(max(0.0, last_tick + MIN_TICK_GAP - loop.time()))
                return

    async def _reload(self) -> None:
        assert self.controller is not None
        self._reload_requested = False
        self.notifier.reloading()
        path = self.options.config_path
        try:
            config = await self.io(load_config, path)
        except ConfigError as exc:
            self.config_error = str(exc)
            log.error("Reload rejected, keeping the previous config: %s", exc)
            self._emit("reload", (False, str(exc)))
        else:
            if self.config is not None and config.fleet != self.config.fleet and not self.options.fleet:
                log.warning("Reload: 'fleet' changed to %s; that takes a restart of flexiqd.", config.fleet)
            self.config = dataclasses.replace(config, fleet=self.config.fleet if self.config else config.fleet)
            self.config_error = None
            self._publish(config)
            await self.io(self.controller.reconfigure, self.config)
            log.info("Reloaded %s: pools %s.", path, ", ".join(sorted(config.pools)) or "none")
            self._emit("reload", (True, f"reloaded {path}"))
        self.notifier.ready(self.controller.status_line() +
                            (f" (config rejected: {self.config_error})" if self.config_error else ""))

    async def _shutdown(self, loop: asyncio.AbstractEventLoop) -> None:
        self.notifier.stopping("stopping")
        if self.api is not None:
            await self.api.close()
        if self._watcher is not None:
            self._watcher.stop(loop)
        try:
            await self.io(self._leave_fleet)
        except FlexiqdError as exc:
            log.error("While stopping: %s", exc)
        finally:
            self._io.shutdown(wait=True)

    def _leave_fleet(self) -> None:
        from ..fleet.process import ProcessFleet

        if isinstance(self.fleet, ProcessFleet):
            log.info("Draining every worker before exiting.")
            self.fleet.shutdown()
            return
        if self._systemd is None or self.fleet is None:
            return
        from ..fleet.systemd import own_job_type

        # `systemctl stop flexiqd` stops the fleet; a restart (or an upgrade) leaves it
        # running for the next daemon to adopt.  A crash runs none of this.
        job = own_job_type(self._systemd)
        if job == "stop":
            log.info("flexiqd is being stopped: stopping every worker (each drains).")
            self.fleet.stop_all()
        else:
            log.info("flexiqd is %s: leaving the workers running for the next daemon.",
                     "restarting" if job else "exiting")

    def _emit(self, kind: str, payload: Any) -> None:
        for listener in self.listeners:
            try:
                listener(kind, payload)
            except Exception:  # a listener's bug must not stop the control loop
                log.exception("Event listener failed.")


def run_daemon(options: DaemonOptions) -> int:
    """The process entry point: installs the signal handlers and runs until SIGTERM/SIGINT."""
    async def main() -> int:
        daemon = Daemon(options)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, daemon.request_stop)
        loop.add_signal_handler(signal.SIGINT, daemon.request_stop)
        loop.add_signal_handler(signal.SIGHUP, daemon.request_reload)
        return await daemon.run()

    return asyncio.run(main())
