"""The flexiqd process: startup -> control loop -> shutdown, speaking sd_notify throughout.

Signals only set flags (or wake the loop); everything else happens in the loop.
Blocking work -- queue reads, systemd calls -- runs on one dedicated thread, so
the loop stays responsive and sd-bus/SQLite objects never cross threads.

The watchdog is kept by a heartbeat task on the loop, not by the tick: a long
``tick:`` or a tick blocked on a locked store or a hung bus call is reported in
STATUS= ("tick blocked 42s reading the queue stats of pool default") instead of
ending in a restart loop; a hung *loop* stops the heartbeat and systemd restarts
the daemon.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable

from ..config import DEFAULT_CONFIG_PATH, DaemonConfig, load_config
from ..errors import ConfigError, FleetError, FlexiqdError, StoreDamaged, StoreUnreachable
from ..fleet.base import Fleet
from ..logs import MessageId, journal
from ..notify import Notifier, watchdog_interval
from ..queue.store.backend import Backend
from ..queue.sqlite.check import Depth
from ..queue.store_check import refuse_if_damaged
from ..queue.url import open_backend, safe_url, sqlite_path
from ..runtime_files import APPLIED_CONFIG, PAUSED_FILE, write_published
from . import backoff, pacing, store_mark
from .api_port import DaemonPort
from .compose import StateFiles, build_controller
from .controller import Controller
from .declarations import publish_declarations
from .hosts import HostHeartbeat
from .schedules import ScheduleFirer

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 78  # EX_CONFIG: the config file is invalid; systemd shows it in the unit's status
# EX_DATAERR: the store is damaged (flexiqd.service does not restart on it: restore it first).
EXIT_STORE_DAMAGED = 65

# The heartbeat: how often it pings the watchdog (at most) and looks at the running tick.
HEARTBEAT = 1.0
# A tick running longer than this is reported in STATUS= as blocked.
BLOCKED_AFTER = 5.0
# A store out of reach at start (its server down or restarting, its disk full) is waited for,
# retried after this pause, doubling up to the most; systemd's start timeout is extended meanwhile.
STORE_RETRY_FIRST = 0.5
STORE_RETRY_MAX = 5.0
STORE_WAIT_MARGIN = 10.0
# systemd out of reach at start (the system bus away) is tried again as the store is, but at
# least once a second: connecting to a local socket costs nothing, and the bus's return is
# what every pool waits for.
BUS_RETRY_MAX = 1.0
# How long the check of the store at start may take before systemd's start timeout ends it.
STORE_CHECK_TIMEOUT = 300.0


def blocked_status(seconds: float, activity: str | None, last_status: str) -> str:
    """``tick blocked 42s reading the queue stats of pool default; default 3/10 ...`` for STATUS=."""
    what = f" {activity}" if activity else ""
    return f"tick blocked {seconds:.0f}s{what}; {last_status}"


def restart_needed(old: DaemonConfig, new: DaemonConfig) -> str | None:
    """Why ``new`` cannot be applied by a reload, or None when it can."""
    # Shown to every local user (ConfigError, Status, STATUS=, the journal): a store URL
    # only without its password.
    shown = {"store": safe_url, "fleet": str, "http": lambda http: "off" if http is None else "on"}
    for key, show in shown.items():
        before, after = getattr(old, key), getattr(new, key)
        if after != before:
            change = (f"from {show(before)} to {show(after)}" if show(before) != show(after)
                      else "its settings")
            return (f"'{key}' changed {change}: that takes a restart of flexiqd "
                    f"(systemctl restart flexiqd)")
    return None


@dataclasses.dataclass(frozen=True)
class DaemonOptions:
    config_path: str
    fleet: str | None = None          # overrides the config's "fleet"
    bus_address: str | None = None    # the system bus by default
    serve_api: bool = True            # offer org.flexiq.flexiqd1 on the bus
    state_dir: str | None = None      # the daemon's own state ($STATE_DIRECTORY)


def state_dir(options: DaemonOptions, config: DaemonConfig) -> str | None:
    """Where the event history and the operators' intent are kept.

    $STATE_DIRECTORY (systemd's StateDirectory=, root-only), else -- a daemon run
    by hand -- the SQLite store's folder.
    """
    if options.state_dir:
        return options.state_dir
    if os.environ.get("STATE_DIRECTORY"):
        return os.environ["STATE_DIRECTORY"].split(":")[0]
    if config.store.startswith("sqlite:///"):
        return os.path.dirname(os.path.abspath(sqlite_path(config.store)))
    return None


class Daemon:
    def __init__(self, options: DaemonOptions, notifier: Notifier | None = None) -> None:
        self.options = options
        self.notifier = notifier or Notifier()
        self.config: DaemonConfig | None = None
        self.config_error: str | None = None
        self.controller: Controller | None = None
        self.backend: Backend | None = None  # the store, once opened (the API's job queries use it)
        self.fleet: Fleet | None = None
        self._systemd = None
        self._watcher = None
        self._watcher_retry = backoff.Retry()
        self._watcher_was_lost = False
        self.api = None                   # the D-Bus service, once serving
        self.http = None                  # the HTTP endpoint (/metrics), when configured
        # The daemon as its two faces (the D-Bus API, the HTTP endpoint) see it.
        self.port = DaemonPort(self)
        self.hosts: HostHeartbeat | None = None  # this host's heartbeat in the store
        self.schedules: ScheduleFirer | None = None  # the schedules' firing loop
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flexiqd-io")
        self._running: tuple[float, str] | None = None   # (monotonic start, what) of the I/O thread's job
        self._status = "starting"
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._new_work = False            # set with _wake by the store's wake-up
        self._last_new_work_tick = -math.inf
        self._follow_up: float | None = None  # when to decide again on new work (loop time)
        self._unsubscribe: Callable[[], None] | None = None
        self._watched_queues: tuple[str, ...] = ()
        self._reload_requested = False
        self._app_checks = 0              # app checks started; a finished one older than the last is dropped
        self._damaged = False             # the running loop met a damaged store: exit 65
        # Told ("tick", seconds), ("scale", ScaleEvent), ("reload", (ok, message)): the faces, through the port.
        self.listeners: list[Callable[[str, Any], None]] = []

    # -- requests (from signal handlers or the D-Bus API) --------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    def request_reload(self) -> None:
        self._reload_requested = True
        self._wake.set()

    def wake(self) -> None:
        """Something changed (a worker unit, an operator's order): decide soon."""
        self._wake.set()

    def new_work(self) -> None:
        """New work was committed to a pool's queue: decide now (``pacing`` bounds the rate)."""
        self._new_work = True
        self._wake.set()

    async def io(self, fn: Callable[..., Any], *args: Any, what: str = "") -> Any:
        """Run blocking work on the daemon's one I/O thread; ``what`` names it if it blocks."""
        def job() -> Any:
            self._running = (time.monotonic(), what)
            try:
                return fn(*args)
            finally:
                self._running = None

        return await asyncio.get_running_loop().run_in_executor(self._io, job)

    def _set_status(self, text: str) -> None:
        self._status = text
        self.notifier.status(text)

    def blocked_for(self) -> tuple[float, str] | None:
        """(seconds, what) of the I/O thread's job when it has run past BLOCKED_AFTER."""
        running = self._running
        if running is None:
            return None
        seconds = time.monotonic() - running[0]
        if seconds < BLOCKED_AFTER:
            return None
        # The controller says which step of its job blocks (whose jobs it was releasing, say).
        activity = self.controller.activity if self.controller is not None else None
        return seconds, activity or running[1]

    async def _heartbeat(self) -> None:
        """Keep the watchdog while the loop runs, and say in STATUS= when a tick is blocked."""
        interval = watchdog_interval()
        period = min(HEARTBEAT, interval) if interval else HEARTBEAT
        warned = False
        while True:
            if interval:
                self.notifier.watchdog()
            blocked = self.blocked_for()
            if blocked is not None:
                seconds, what = blocked
                self.notifier.status(blocked_status(seconds, what, self._status))
                if not warned and seconds >= 2 * BLOCKED_AFTER:
                    log.warning("The I/O thread has been blocked for %.0fs %s; the daemon keeps "
                                "running and says so in its status.", seconds, what)
                    warned = True
            elif warned:
                warned = False
                self.notifier.status(self._status)
            await asyncio.sleep(period)

    # -- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        heartbeat = loop.create_task(self._heartbeat())
        try:
            try:
                if not await self._startup(loop):
                    return EXIT_OK  # stopped while it waited for the store
            except ConfigError as exc:
                log.error("Cannot start: %s", exc)
                self.notifier.status(f"config error: {exc}")
                return EXIT_CONFIG
            except StoreDamaged as exc:
                log.critical("Cannot start: %s", exc, extra=journal(
                    MessageId.STORE_DAMAGED, STORE=safe_url(self.config.store), PROBLEM=exc))
                self.notifier.status(f"refusing a damaged store: {exc}")
                return EXIT_STORE_DAMAGED
            except FlexiqdError as exc:
                log.error("Cannot start: %s", exc)
                self.notifier.status(f"cannot start: {exc}")
                return EXIT_FAILURE
            try:
                await self._loop()
            finally:
                await self._shutdown(loop)
            return EXIT_STORE_DAMAGED if self._damaged else EXIT_OK
        finally:
            heartbeat.cancel()

    async def _startup(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Start everything; False when a stop came while the store was out of reach."""
        self.config = load_config(self.options.config_path, fleet=self.options.fleet)
        self._publish(self.config)
        kind = self.config.fleet
        backend = await self._open_store()
        if backend is None:
            return False
        self.backend = backend
        self.fleet = await self._connect_fleet(kind)
        if self.fleet is None:
            return False
        folder = state_dir(self.options, self.config)
        files = StateFiles.in_folder(folder, paused=self._published_path(PAUSED_FILE))
        self.controller = await self.io(lambda: build_controller(self.config, backend, self.fleet, files=files),
                                        what="adopting the workers")
        # This host in the fleet: registered (and dead hosts' jobs rescued) before the first
        # tick, then beating on a thread of its own.
        on_beat = await self.io(self._compare_store_mark, backend, self.controller.host, folder,
                                what="comparing the store with flexiqd's record of it")
        controller = self.controller
        # The heartbeat's thread reads what the last tick published, never the controller's state.
        self.hosts = HostHeartbeat(backend, controller.host, lambda: self.config.heartbeat,
                                   lambda: controller.published.fleet_report,
                                   capacities=lambda: controller.published.global_caps, on_beat=on_beat)
        self.controller.fleet_grants = self.hosts.grants
        self.controller.fleet_peers = self.hosts.peers
        await self.io(self.hosts.beat, what="recording this host's heartbeat")
        # Adopt: the first tick lists what systemd already runs and sizes from there.
        await self.io(self.controller.tick, what="tick")
        self.hosts.start()
        # The schedules fire on a thread of their own, from the store's ledger (a long tick
        # must not delay a slot); with no schedule configured it only waits.
        self.schedules = ScheduleFirer(backend, f"{self.controller.host}:{os.getpid()}",
                                       lambda: self.config.schedules)
        self.schedules.start()
        self.controller.schedule_forecasts = self.schedules.forecasts
        await self._watch_queues(loop)
        if self._systemd is not None:
            await self._follow_units(loop)
        if self.config.http is not None:
            from ..http.daemon import HttpEndpoint

            try:
                self.http = await HttpEndpoint.start(self.port, self.config.http)
            except FlexiqdError as exc:  # as with D-Bus: scaling goes on without the endpoint
                log.error("Not serving /metrics and /api/scaler: %s", exc)
        if self.options.serve_api:
            from ..dbus.keeper import ApiKeeper

            # Offered now, or -- the bus away, the name refused -- as soon as it can be.
            self.api = await ApiKeeper.start(self.port, self.options.bus_address)
        pools = ", ".join(f"{v.pool} ({v.active + v.starting} running)" for v in self.controller.published.views.values())
        log.info("flexiqd ready with %s fleet; pools: %s.", kind, pools or "none")
        self._status = self.controller.status_line()
        self.notifier.ready(self._status)
        self._check_apps()
        return True

    def _check_apps(self) -> None:
        """Import each pool's app as its workers would, off the I/O thread (it takes a child
        process per pool); what is wrong goes to the journal and the pool's status."""
        from ..apps.check import check_apps

        config, controller = self.config, self.controller
        self._app_checks += 1
        generation = self._app_checks

        def check() -> None:
            try:
                probes, findings = check_apps(config)
            except Exception as exc:  # a check that cannot run must not take the daemon down
                log.warning("Could not check the pools' apps: %s", exc)
                return
            if generation != self._app_checks:
                return  # a reload started a newer check
            publish_declarations(controller.backend, probes)
            problems: dict[str, str] = {}
            for finding in findings:
                if finding.severity == "error":
                    problems.setdefault(finding.pool, finding.text)
                    log.error("Pool %s: its workers cannot run: %s", finding.pool, finding.text,
                              extra=journal(MessageId.APP_PROBLEM, POOL=finding.pool, ERROR=finding.text))
                else:
                    log.warning("Pool %s: %s", finding.pool, finding.text)
            for pool in sorted(set(controller.app_problems) - set(problems)):
                log.info("Pool %s: its app imports again as its workers would.", pool)
            controller.app_problems = problems

        asyncio.get_running_loop().run_in_executor(None, check)

    async def _open_store(self) -> Backend | None:
        """The store, once it can be reached; None when a stop comes first.

        A store out of reach for a reason that passes (``StoreUnreachable``: its server down
        or restarting, its disk full) is waited for -- STATUS= and the journal say why,
        systemd's start timeout is extended -- rather than failing the start, which systemd
        would repeat into its start limit.  Any other ``StoreUnavailable`` (a wrong URL or
        password, a schema too new) is raised: waiting would not mend it -- a damaged store
        above all (``StoreDamaged``): SQLite's quick_check reads every page first, so the
        daemon never runs on a queue read in part (its cost: bench/store_check.md).
        """
        async def attempt() -> Backend:
            # Reading every page takes about 2 s a million jobs from a cold disk: systemd's
            # start timeout is pushed out past a store a hundred times that.
            self._set_status("checking the store (quick_check)")
            self.notifier.extend_timeout(STORE_CHECK_TIMEOUT)
            await self.io(refuse_if_damaged, self.config.store, Depth.QUICK, what="checking the store")
            return await self.io(open_backend, self.config.store, what="opening the store")

        return await self._until_reached("the store", attempt, StoreUnreachable, STORE_RETRY_MAX)

    async def _until_reached(self, what: str, attempt: Callable[[], Awaitable[Any]],
                             passing: type[Exception], retry_max: float) -> Any | None:
        """``attempt()``'s result once it no longer raises ``passing`` (a reason that passes by
        itself: ``what`` is waited for, STATUS= and the journal say why, systemd's start timeout
        is extended, tries double apart up to ``retry_max``); None when a stop comes first."""
        delay, since = STORE_RETRY_FIRST, time.monotonic()
        while True:
            try:
                result = await attempt()
            except passing as exc:
                waited = time.monotonic() - since
                if delay == STORE_RETRY_FIRST:
                    log.warning("Waiting for %s before starting: %s", what, exc)
                self._set_status(f"waiting {waited:.0f}s for {what}: {exc}")
                self.notifier.extend_timeout(delay + STORE_WAIT_MARGIN)
                try:
                    await asyncio.wait_for(self._stop.wait(), delay)
                    log.info("Stopped while waiting for %s.", what)
                    return None
                except asyncio.TimeoutError:
                    pass
                delay = min(delay * 2, retry_max)
                continue
            if delay != STORE_RETRY_FIRST:
                log.info("Reached %s after %.1fs.", what, time.monotonic() - since)
            return result

    def _compare_store_mark(self, backend: Backend, host: str,
                            folder: str | None) -> Callable[[float], None] | None:
        """Say if the store is older than this daemon last saw it (``store_mark``); the writer of
        the record for each beat, or None where none is kept.  On the I/O thread."""
        store = self.config.store
        if folder is None or not store_mark.marked_store(store):
            return None
        path = os.path.join(folder, store_mark.MARK_FILE)
        try:
            beats = {info.name: info.last_beat for info in backend.hosts(now=backend.clock())}
        except FlexiqdError as exc:
            log.warning("Cannot compare the store with flexiqd's record of it: %s", exc)
            beats = None
        if beats is not None:
            older = store_mark.judge(store_mark.read_mark(path), store, host, beats.get(host))
            if older is not None:
                log.warning("%s: %s.", sqlite_path(store), older,
                            extra=journal(MessageId.STORE_OLDER, STORE=safe_url(store), PROBLEM=older))
        failed = []

        def record(beat: float) -> None:  # on the heartbeat's thread
            try:
                store_mark.write_mark(path, store_mark.StoreMark(store=store, host=host, beat=beat))
            except OSError as exc:
                if not failed:  # once: the record is a help, not a duty
                    log.warning("Cannot keep flexiqd's record of the store in %s: %s", path, exc.strerror)
                failed.append(exc)

        return record

    async def _connect_fleet(self, kind: str) -> Fleet | None:
        """The fleet, once systemd can be reached; None when a stop comes first.

        A system bus away at start (restarting, its socket not back yet) is waited for as a
        store out of reach is -- STATUS= and the journal say why, systemd's start timeout is
        extended -- rather than failing the start into a restart loop.
        """
        def attempt() -> Awaitable[Fleet]:
            return self.io(self._make_fleet, kind, what="connecting to systemd")

        return await self._until_reached("systemd", attempt, FleetError, BUS_RETRY_MAX)

    def _make_fleet(self, kind: str) -> Fleet:
        if kind == "process":
            from ..fleet.process import ProcessFleet

            return ProcessFleet(config_path=self._published_path(APPLIED_CONFIG),
                                paused_path=self._published_path(PAUSED_FILE))
        from ..fleet.systemd import Systemd, SystemdFleet

        self._systemd = Systemd.connect(self.options.bus_address)
        # Workers read their pool from the default file unless told where the daemon's is.
        config_path = self._published_path(APPLIED_CONFIG)
        if config_path is None and self.options.config_path != DEFAULT_CONFIG_PATH:
            config_path = self.options.config_path
        return SystemdFleet(self._systemd, config_path=config_path,
                            paused_path=self._published_path(PAUSED_FILE))

    def _published_path(self, name: str) -> str | None:
        """Where a file for the workers is published, if anywhere.

        $RUNTIME_DIRECTORY (/run/flexiqd) under systemd.  A daemon run by hand with the
        process fleet uses its state folder: its workers are its own children.
        """
        runtime = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
        if runtime:
            return os.path.join(runtime, name)
        kind = self.config.fleet if self.config is not None else None
        folder = state_dir(self.options, self.config) if self.config is not None else None
        return os.path.join(folder, name) if kind == "process" and folder else None

    def _publish(self, config: DaemonConfig) -> None:
        """Give workers the config the daemon applied, not whatever the file holds now.

        A worker reads its pool's settings when it starts (and its drain budget when
        it drains); an edit not yet reloaded -- or one with a typo -- must not reach
        a worker that systemd restarts in the meantime.  Written 0640 whatever the
        umask: readable by the workers' group, writable by the daemon alone.
        """
        path = self._published_path(APPLIED_CONFIG)
        if path is None:
            return
        try:
            write_published(path, config.source)
        except OSError as exc:
            log.warning("Cannot publish the applied config at %s (workers read %s): %s",
                        path, self.options.config_path, exc.strerror)

    async def _loop(self) -> None:
        assert self.config is not None and self.controller is not None
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
                events = await self.io(self._tick_events, what="tick")
            except StoreDamaged as exc:
                # Damage met while running (a page the start's check read whole): stop, as a
                # start would refuse -- the workers meet it too, and stop claiming.
                log.critical("Stopping: %s", exc, extra=journal(
                    MessageId.STORE_DAMAGED, STORE=safe_url(self.config.store), PROBLEM=exc))
                self._set_status(f"stopping on a damaged store: {exc}")
                self._damaged = True
                break
            except FlexiqdError as exc:
                log.error("Tick failed, holding every pool: %s", exc)
                events = []
            status = self.controller.status_line()
            if self.config_error:
                status += f" (config rejected: {self.config_error})"
            self._set_status(status)
            for event in events:
                self._emit("scale", event)
            self._emit("tick", loop.time() - last_tick)
            if self._systemd is not None:
                await self._follow_units(loop)

    def _tick_events(self) -> list:
        """One tick (on the I/O thread); the scale events it recorded, each with its sequence number."""
        first = self.controller.events.next_seq
        self.controller.tick()
        return self.controller.events.since(first - 1)

    async def _sleep_until_next_tick(self, last_tick: float) -> None:
        assert self.config is not None and self.controller is not None
        loop = asyncio.get_running_loop()
        due = pacing.due_at(self.controller.next_due, self.controller.clock(), loop.time())
        if self._follow_up is not None and self._follow_up <= last_tick:
            self._follow_up = None  # the decision it asked for was made
        follow_up = self._follow_up
        if self.controller.waits_on_stopping and (self._watcher is None or self._watcher.lost):
            # Growth waits for stopping workers, and no unit change will say they exited.
            follow_up = pacing.stopping_follow_up(last_tick, follow_up)
        while not self._stop.is_set():
            remaining = pacing.next_tick(last_tick, self.config.tick, due, follow_up) - loop.time()
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
                only_new_work, self._new_work = self._new_work and not self._reload_requested, False
                if only_new_work:
                    at, self._follow_up = pacing.after_new_work(loop.time(), self._last_new_work_tick)
                    self._last_new_work_tick = at
                else:
                    # A worker changed state (or a reload was asked).  A dead worker's jobs go
                    # back to the queue now -- every moment they wait, later jobs are claimed
                    # before them -- and the tick follows soon, but not in a storm.
                    await self._release_dead_workers()
                    at = pacing.after_unit_change(loop.time(), last_tick)
                await asyncio.sleep(max(0.0, at - loop.time()))
                return

    async def _follow_units(self, loop: asyncio.AbstractEventLoop) -> None:
        """Follow systemd's unit changes (the wake-ups that release a dead worker's jobs at
        once), on a connection of their own; again, backing off, when it was lost or could not
        be made.  Each tick lists the workers meanwhile, so nothing waits on it."""
        if self._watcher is not None and not self._watcher.lost:
            return
        if self._watcher is not None:
            self._watcher = None
            self._watcher_retry = backoff.Retry()
            self._watcher_was_lost = True
        if not self._watcher_retry.due(loop.time()):
            return
        from ..fleet.systemd import UnitWatcher

        watcher = UnitWatcher(self.wake, self.options.bus_address)
        try:
            await self.io(watcher.connect, what="subscribing to systemd's unit changes")
        except FlexiqdError as exc:
            if self._watcher_retry.failed(loop.time()):
                log.warning("Not following unit changes (polling every tick instead; trying again): %s", exc)
            return
        watcher.watch(loop)
        if self._watcher_was_lost or self._watcher_retry.failures:
            log.info("Following systemd's unit changes again.")
        self._watcher, self._watcher_retry, self._watcher_was_lost = watcher, backoff.Retry(), False

    async def _watch_queues(self, loop: asyncio.AbstractEventLoop) -> None:
        """Have the store wake the loop when work is committed to a pool's queue (again after a
        reload that changed the queues)."""
        assert self.config is not None and self.controller is not None
        queues = tuple(sorted({queue for pool in self.config.pools.values() for queue in pool.queues}))
        if queues == self._watched_queues and self._unsubscribe is not None:
            return
        if self._unsubscribe is not None:
            await self.io(self._unsubscribe, what="no longer watching the queues")
            self._unsubscribe = None

        def from_store() -> None:  # on the store's thread
            try:
                loop.call_soon_threadsafe(self.new_work)
            except RuntimeError:  # the loop has closed: the daemon is gone
                pass

        self._watched_queues = queues
        if queues:
            self._unsubscribe = await self.io(self.controller.backend.subscribe, queues, from_store,
                                              what="watching the queues for new work")

    async def _release_dead_workers(self) -> None:
        assert self.controller is not None
        try:
            await self.io(self.controller.release_dead_workers, what="releasing the jobs of dead workers")
        except FlexiqdError as exc:
            log.warning("Could not release the jobs of dead workers (the next tick retries): %s", exc)

    async def _reload(self) -> None:
        assert self.controller is not None
        self._reload_requested = False
        self.notifier.reloading()
        path = self.options.config_path
        try:
            config = await self.io(lambda: load_config(path, fleet=self.options.fleet), what="reading the config")
            refused = restart_needed(self.config, config) if self.config is not None else None
            if refused:
                raise ConfigError(f"{path}: {refused}")
        except ConfigError as exc:
            self.config_error = str(exc)
            log.error("Reload rejected, keeping the previous config: %s", exc,
                      extra=journal(MessageId.RELOAD_REFUSED, CONFIG_FILE=path, ERROR=exc))
            self._emit("reload", (False, str(exc)))
        else:
            self.config = config
            self.config_error = None
            self._publish(config)
            await self.io(self.controller.reconfigure, self.config, what="applying the config to running workers")
            await self._watch_queues(asyncio.get_running_loop())
            if self.schedules is not None:
                self.schedules.wake()
            self._check_apps()
            log.info("Reloaded %s: pools %s.", path, ", ".join(sorted(config.pools)) or "none",
                     extra=journal(MessageId.RELOADED, CONFIG_FILE=path, POOLS=" ".join(sorted(config.pools)) or None))
            self._emit("reload", (True, f"reloaded {path}"))
        self._status = self.controller.status_line() + (
            f" (config rejected: {self.config_error})" if self.config_error else "")
        self.notifier.ready(self._status)

    async def _shutdown(self, loop: asyncio.AbstractEventLoop) -> None:
        self.notifier.stopping("stopping")
        if self.http is not None:
            await self.http.close()
        if self.api is not None:
            await self.api.close()
        if self._watcher is not None:
            self._watcher.stop(loop)
        if self._unsubscribe is not None:
            await self.io(self._unsubscribe, what="no longer watching the queues")
        if self.schedules is not None:
            await loop.run_in_executor(None, self.schedules.stop)
        if self.hosts is not None:
            # Not unregistered: workers may still drain; the beat expires in two heartbeats.
            await loop.run_in_executor(None, self.hosts.stop)
        if self.controller is not None:
            self.controller.close()
        try:
            # The histories first: leaving may wait out the workers' drains, and systemd may
            # kill a daemon that outlives its stop timeout before it got to write them.
            if self.controller is not None:
                await self.io(self.controller.save_state, what="keeping the pools' histories")
            if self.fleet is not None:
                await self.io(self.fleet.leave, what="leaving the workers")
        except FlexiqdError as exc:
            log.error("While stopping: %s", exc)
        finally:
            self._io.shutdown(wait=True)

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
