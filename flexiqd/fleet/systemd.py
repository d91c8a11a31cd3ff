"""Workers as ``flexiq-worker@<pool>-<n>.service`` units, driven over systemd's D-Bus API.

The only module that speaks to systemd.  ``Systemd`` mirrors the Manager's
methods by their D-Bus names; ``SystemdFleet`` turns them into the fleet
operations.  systemd is the source of truth: ``list()`` asks it every time,
so a daemon restart adopts whatever runs.

The system bus can go away under a running daemon (dbus restarted, or killed and
brought back by socket activation) and systemd can re-execute itself
(``daemon-reexec``).  ``Systemd`` connects again on the next call that finds its
connection lost; ``UnitWatcher`` notices its connection close and says so, so the
daemon can start another.  The workers never notice: they do not use the bus.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from typing import Any, Callable, Iterable

from ..errors import FleetError
from ..logs import MessageId, journal
from ..runtime_files import write_atomically
from .base import Fleet, WorkerInfo, WorkerSpec, WorkerState, instance_name, parse_instance
from .dropin import dropin_text

log = logging.getLogger(__name__)

DESTINATION = b"org.freedesktop.systemd1"
MANAGER_PATH = b"/org/freedesktop/systemd1"
MANAGER = b"org.freedesktop.systemd1.Manager"
UNIT = b"org.freedesktop.systemd1.Unit"
SERVICE = b"org.freedesktop.systemd1.Service"
JOB = b"org.freedesktop.systemd1.Job"
PROPERTIES = b"org.freedesktop.DBus.Properties"
UNIT_PATH_PREFIX = b"/org/freedesktop/systemd1/unit"
# Object paths of flexiq-worker@*.service ("-" and "@" escaped as systemd does).
WORKER_PATH_PREFIX = UNIT_PATH_PREFIX + b"/flexiq_2dworker_40"

TEMPLATE = "flexiq-worker@"
UNIT_PATTERN = "flexiq-worker@*.service"
DROPIN_ROOT = "/run/systemd/system"
DROPIN_NAME = "50-flexiqd.conf"
# What SetUnitProperties takes for "no limit": MemoryMax=infinity, CPUWeight= (the default).
UNLIMITED = 2 ** 64 - 1

# ActiveState -> what the controller cares about.  "inactive" units are gone.
_STATES = {"active": WorkerState.ACTIVE, "reloading": WorkerState.ACTIVE,
           "activating": WorkerState.STARTING, "deactivating": WorkerState.DRAINING,
           "failed": WorkerState.FAILED}


def worker_state(active_state: str, job_type: str) -> WorkerState | None:
    """A unit's state as the controller counts it; None for units that are gone.

    A queued job wins over ActiveState: right after StartUnit the unit is still
    "inactive" with a start job pending, and must already count as starting, or
    the next tick would start another worker in its place; a unit being restarted
    counts as starting throughout.
    """
    if job_type == "stop":
        return WorkerState.DRAINING
    if job_type in ("restart", "try-restart"):
        # Restarted (by an operator, a deploy): it comes back by itself.  Counted as capacity
        # on its way, or the tick would start a replacement and then stop one of the two.
        return WorkerState.STARTING
    if job_type and active_state not in ("active", "reloading", "deactivating"):
        return WorkerState.STARTING
    return _STATES.get(active_state)


def unit_name(pool: str, index: int) -> str:
    return f"{TEMPLATE}{instance_name(pool, index)}.service"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _argument(value: Any) -> str:
    """A call's argument as an error message shows it: ``[flexiq-worker@*.service]``, not bytes' reprs."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(_text, value)) + "]"
    return _text(value)


# Pauses (seconds) before a call systemd left unanswered as it re-executed is made again:
# ``daemon-reexec`` takes a few hundred milliseconds (up to about a second on a busy host).
REEXEC_PAUSES = (0.1, 0.3, 0.9)

# How sd-bus reports a connection the bus closed (pystemd raises them with a negative errno),
# and the bus's own name for it.
_LOST_ERRNOS = {errno.ECONNRESET, errno.ENOTCONN, errno.EPIPE, errno.ESHUTDOWN}
_LOST_NAMES = {b"org.freedesktop.DBus.Error.Disconnected", b"System.Error.ECONNRESET",
               b"System.Error.ENOTCONN", b"System.Error.EPIPE", b"System.Error.ESHUTDOWN"}


def connection_lost(exc: BaseException) -> bool:
    """Whether a failed call failed because the bus connection is gone (not because systemd
    refused it): the bus was restarted or killed, and a new connection may succeed."""
    number = getattr(exc, "errno", None)
    name = getattr(exc, "err_name", None)
    if isinstance(name, str):
        name = name.encode()
    return (isinstance(number, int) and abs(number) in _LOST_ERRNOS) or name in _LOST_NAMES


def recipient_left(exc: BaseException) -> bool:
    """Whether systemd left the bus before answering (``daemon-reexec``, or its own reconnection
    after the bus restarted): the bus answers NoReply at once, and a call made again waits for
    systemd to come back (the bus holds calls to its name until it is owned again)."""
    name = getattr(exc, "err_name", None)
    message = getattr(exc, "err_message", None)
    name = name.decode() if isinstance(name, bytes) else str(name or "")
    message = message.decode() if isinstance(message, bytes) else str(message or "")
    # pystemd gives this one without its name, as ETIMEDOUT: the bus's words tell it apart
    # ("Message recipient disconnected from message bus without replying").
    return name in ("org.freedesktop.DBus.Error.NoReply", "") and "disconnected" in message


def bus_name(address: str | None) -> str:
    """The bus as the journal names it."""
    return address or os.environ.get("DBUS_SYSTEM_BUS_ADDRESS") or "the system bus"


def open_bus(address: str | None = None):
    """A connection to the system bus (or ``address``); FleetError when there is none."""
    from pystemd.dbuslib import DBus, DBusAddress

    try:
        bus = DBusAddress(address.encode(), peer_to_peer=False) if address else DBus()
        bus.open()
    except Exception as exc:  # pystemd raises its own tree and plain OSErrors
        raise FleetError(f"cannot connect to systemd over {bus_name(address)}: {_dbus_error_text(exc)}") from None
    return bus


class Systemd:
    """systemd's Manager, by its D-Bus method names.  One thread at a time (sd-bus is not thread-safe).

    Made by ``connect`` it connects again when it finds its connection lost, and repeats
    the call once on the new connection; a call systemd left unanswered because it left
    the bus (re-executing) is repeated after a pause, up to ``REEXEC_PAUSES``.  Every call
    the fleet makes is idempotent (starting a started unit, stopping a stopping one,
    sending SIGUSR1 twice, setting the same properties, reloading again), so one that may
    or may not have reached systemd before the bus went away can be made again.  While
    the bus is down each call raises FleetError, and the next one tries again.
    """

    def __init__(self, bus, reopen: Callable[[], Any] | None = None, where: str = "the system bus") -> None:
        self.bus = bus
        self._reopen = reopen
        self.where = where
        #: False: a lost connection is not made again (the daemon is stopping; see ``leave``).
        self.reconnect = True

    @classmethod
    def connect(cls, address: str | None = None) -> Systemd:
        """Connected to the system bus (or ``address``), and again whenever that connection is lost."""
        return cls(open_bus(address), reopen=lambda: open_bus(address), where=bus_name(address))

    def _on_bus(self, use: Callable[[Any], Any]) -> Any:
        """``use(bus)``, on a new connection if the bus closed the current one."""
        if self.bus is None:
            if not self.reconnect:
                raise FleetError(f"not connected to systemd: the connection over {self.where} was lost")
            self._connect_again()
        try:
            return self._while_systemd_returns(use)
        except Exception as exc:
            if self._reopen is None or not self.reconnect or not connection_lost(exc):
                raise
            log.warning("Lost the connection to systemd over %s (%s); connecting again.",
                        self.where, _dbus_error_text(exc))
        self._connect_again()
        return use(self.bus)

    def _while_systemd_returns(self, use: Callable[[Any], Any]) -> Any:
        """``use(self.bus)``, made again after a pause while systemd leaves it unanswered because
        it left the bus (re-executing): a call sent while the old process still owns the name is
        dropped with it; one sent once the new process owns it is answered."""
        for pause in (*REEXEC_PAUSES, None):
            try:
                return use(self.bus)
            except Exception as exc:
                if pause is None or not recipient_left(exc):
                    raise
                log.debug("systemd left the bus without answering (re-executing?); asking again in %.1fs.", pause)
                time.sleep(pause)

    def _connect_again(self) -> None:
        old, self.bus = self.bus, None
        if old is not None:
            try:
                old.close()
            except Exception:  # it is gone already; closing only frees it
                pass
        self.bus = self._reopen()  # FleetError while the bus is down: the next call tries again
        log.info("Connected to systemd again over %s.", self.where)

    def _call(self, path: bytes, interface: bytes, method: str, signature: bytes, args: list) -> Any:
        """The reply's body: the value itself for one out-argument (as pystemd returns it)."""
        from pystemd.dbuslib import apply_signature

        try:
            reply = self._on_bus(lambda bus: bus.call_method(
                DESTINATION, path, interface, method.encode(),
                apply_signature(signature, args) if signature else []))
        except FleetError:
            raise
        except Exception as exc:
            raise FleetError(f"systemd {method}({', '.join(map(_argument, args))}) failed: "
                             f"{_dbus_error_text(exc)}") from None
        return reply.body

    def _manager(self, method: str, signature: bytes = b"", *args: Any) -> Any:
        return self._call(MANAGER_PATH, MANAGER, method, signature, list(args))

    def ListUnitsByPatterns(self, states: list[str], patterns: list[str]) -> list[tuple]:
        return self._manager("ListUnitsByPatterns", b"asas", [s.encode() for s in states],
                             [p.encode() for p in patterns]) or []

    def StartUnit(self, name: str, mode: str = "replace") -> None:
        self._manager("StartUnit", b"ss", name.encode(), mode.encode())

    def StopUnit(self, name: str, mode: str = "replace") -> None:
        self._manager("StopUnit", b"ss", name.encode(), mode.encode())

    def KillUnit(self, name: str, whom: str, signum: int) -> None:
        self._manager("KillUnit", b"ssi", name.encode(), whom.encode(), signum)

    def ResetFailedUnit(self, name: str) -> None:
        self._manager("ResetFailedUnit", b"s", name.encode())

    def Reload(self) -> None:
        self._manager("Reload")

    def Subscribe(self) -> None:
        self._manager("Subscribe")

    def GetUnitByPID(self, pid: int) -> bytes:
        return self._manager("GetUnitByPID", b"u", pid)

    def SetUnitProperties(self, name: str, runtime: bool, properties: list[tuple[str, bytes, Any]]) -> None:
        """``properties``: (name, D-Bus signature, value), e.g. ("MemoryMax", b"t", 2**30)."""
        from pystemd.dbuslib import apply_signature

        args = apply_signature(b"sb", [name.encode(), runtime])
        args += [(ord(b"a"), b"(sv)")]
        for prop, sig, value in properties:
            args += [(ord(b"r"), b"sv"), (ord(b"s"), prop.encode()), (ord(b"v"), sig)]
            args += apply_signature(sig, [value])
            args += [(-1, None), (-1, None)]
        args += [(-1, None)]
        try:
            self._on_bus(lambda bus: bus.call_method(DESTINATION, MANAGER_PATH, MANAGER, b"SetUnitProperties", args))
        except FleetError:
            raise
        except Exception as exc:
            raise FleetError(f"systemd SetUnitProperties({name}) failed: {_dbus_error_text(exc)}") from None

    def unit_property(self, path: bytes, interface: bytes, prop: str, signature: bytes) -> Any:
        try:
            return self._on_bus(lambda bus: bus.get_property(DESTINATION, path, interface, prop.encode(), signature))
        except FleetError:
            raise
        except Exception as exc:
            raise FleetError(f"systemd property {prop} of {_text(path)} unreadable: "
                             f"{_dbus_error_text(exc)}") from None

    def job_type_of_unit(self, path: bytes) -> str | None:
        """The type of the job queued for a unit (``stop``, ``restart``, ...), or None."""
        job_id, job_path = self.unit_property(path, UNIT, "Job", b"(uo)")
        if not job_id:
            return None
        return _text(self.unit_property(job_path, JOB, "JobType", b"s"))


# ExecMainCode: how the main process ended, as siginfo's si_code (CLD_*).
_CLD_EXITED, _CLD_KILLED, _CLD_DUMPED = 1, 2, 3


def exit_description(code: int, status: int, result: str) -> str | None:
    """A process's end in words, from systemd's ExecMainCode/ExecMainStatus and the unit's Result."""
    if result == "oom-kill":
        return "out of memory: killed by the kernel's OOM killer"
    if code in (_CLD_KILLED, _CLD_DUMPED):
        try:
            name = signal.Signals(status).name
        except ValueError:
            name = f"signal {status}"
        return f"killed by {name}" + (" (core dumped)" if code == _CLD_DUMPED else "")
    if code == _CLD_EXITED:
        return f"exited with status {status}"
    return None


def _dbus_error_text(exc: Exception) -> str:
    name = getattr(exc, "err_name", None) or getattr(exc, "errno", None)
    message = getattr(exc, "err_message", None)
    if name or message:
        return f"{_text(name) if name else ''}: {_text(message) if message else exc}".strip(": ")
    return str(exc) or type(exc).__name__


def unit_path(name: str) -> bytes:
    from pystemd.dbuslib import path_encode

    return path_encode(UNIT_PATH_PREFIX, name.encode())


class SystemdFleet(Fleet):
    """Workers as template instances.  Blocking calls; drive it from one thread.

    Each instance gets a drop-in (stop timeout, environment, credentials, where the
    applied config and the paused pools are published) and its cgroup limits by
    ``SetUnitProperties``; ``configure`` brings running instances up to date too.
    ``leave`` stops the workers only when flexiqd.service itself is being stopped: a
    restart (an upgrade) or a crash leaves them running for the next daemon to adopt.
    """

    def __init__(self, systemd: Systemd, *, config_path: str | None = None,
                 paused_path: str | None = None, dropin_root: str = DROPIN_ROOT) -> None:
        super().__init__()
        self.systemd = systemd
        self.config_path = config_path
        self.paused_path = paused_path
        self.dropin_root = dropin_root
        self._timings: dict[tuple[str, int | None], float | None] = {}
        self._launches: dict[tuple[str, int], float | None] = {}

    # -- reading ----------------------------------------------------------------------------

    def list(self) -> list[WorkerInfo]:
        workers = []
        for row in self.systemd.ListUnitsByPatterns([], [UNIT_PATTERN]):
            name, active, job = _text(row[0]), _text(row[3]), _text(row[8])
            parsed = parse_instance(name[len(TEMPLATE):-len(".service")])
            state = worker_state(active, job)
            if parsed is None or state is None:
                continue
            path = row[6]
            pid = started = None
            ready_after = launched = None
            try:
                pid = int(self.systemd.unit_property(path, SERVICE, "MainPID", b"u")) or None
                usec = int(self.systemd.unit_property(path, UNIT, "ActiveEnterTimestamp", b"t"))
                started = usec / 1e6 if usec else None
                ready_after = self._start_timing(name, path, pid, state)
                launched = self._launch_time(name, path, pid)
            except FleetError:
                pass  # the unit went away between the calls; list it without details
            workers.append(WorkerInfo(parsed[0], parsed[1], state, pid, started, ready_after, launched))
        self._forget_pids(w.pid for w in workers if w.pid)
        seen = {(unit_name(w.pool, w.index), w.pid) for w in workers}
        self._timings = {key: value for key, value in self._timings.items() if key in seen}
        self._launches = {key: value for key, value in self._launches.items() if key in seen}
        return workers

    def _launch_time(self, name: str, path: bytes, pid: int | None) -> float | None:
        """When the unit's main process ``pid`` was started (``ExecMainStartTimestampMonotonic``,
        seconds): read once per process, it does not change while the process runs.  None before
        the process exists (a start job still queued)."""
        if pid is None:
            return None
        key = (name, pid)
        if key not in self._launches:
            usec = int(self.systemd.unit_property(path, SERVICE, "ExecMainStartTimestampMonotonic", b"t"))
            self._launches[key] = usec / 1e6 if usec else None
        return self._launches[key]

    def _start_timing(self, name: str, path: bytes, pid: int | None, state: WorkerState) -> float | None:
        """Seconds the unit's current run took to become ready, from systemd's own timestamps
        (inactive-exit to active-enter: ``READY=1`` for a ``Type=notify`` worker).

        Read once per run (name and main pid) once the unit is ready: they do not change
        until it stops, so a tick reads two more properties only for a newly ready worker.
        """
        if state is not WorkerState.ACTIVE:
            return None
        key = (name, pid)
        if key not in self._timings:
            exited = int(self.systemd.unit_property(path, UNIT, "InactiveExitTimestampMonotonic", b"t"))
            entered = int(self.systemd.unit_property(path, UNIT, "ActiveEnterTimestampMonotonic", b"t"))
            self._timings[key] = (entered - exited) / 1e6 if entered >= exited > 0 else None
        return self._timings[key]

    # -- changing ---------------------------------------------------------------------------

    def how_it_ended(self, instance: str, pid: int | None) -> str | None:
        """From the unit's ``ExecMainPID``/``ExecMainCode``/``ExecMainStatus`` and ``Result``: what
        systemd recorded of its last main process -- only if that process was ``pid`` (a unit
        restarted meanwhile describes its new process)."""
        pool, index = parse_instance(instance) or (None, None)
        if pool is None:
            return None
        path = unit_path(unit_name(pool, index))
        try:
            if pid is not None and int(self.systemd.unit_property(path, SERVICE, "ExecMainPID", b"u")) != pid:
                return None
            code = int(self.systemd.unit_property(path, SERVICE, "ExecMainCode", b"i"))
            status = int(self.systemd.unit_property(path, SERVICE, "ExecMainStatus", b"i"))
            result = _text(self.systemd.unit_property(path, SERVICE, "Result", b"s"))
        except FleetError:
            return None
        return exit_description(code, status, result)

    def configure(self, specs: Iterable[WorkerSpec]) -> None:
        """Rewrite the drop-ins of running instances and write those of the instances a pool
        may start (``WorkerSpec.ready_ahead``), with one Reload; set the running ones' limits now.

        The stop timeout takes effect at once; environment and credentials at the
        instance's next start (a process's environment cannot change).  Written ahead,
        a scale-up finds its drop-ins in place: a daemon-reload costs ~100 ms with many
        units loaded, and would stand between a burst and its first new worker.
        """
        specs = {spec.pool: spec for spec in specs}
        running = [w for w in self.list() if w.pool in specs
                   and w.state in (WorkerState.ACTIVE, WorkerState.STARTING)]
        indices = {(w.pool, w.index) for w in running}
        indices |= {(spec.pool, index) for spec in specs.values() for index in range(1, spec.ready_ahead + 1)}
        changed = False
        for pool, index in sorted(indices):
            changed |= self._write_dropin(specs[pool], index)
        if changed:
            self.systemd.Reload()
        for worker in running:
            self._set_limits(specs[worker.pool], unit_name(worker.pool, worker.index))

    def dropin_text(self, spec: WorkerSpec) -> str:
        return dropin_text(spec, config_path=self.config_path, paused_path=self.paused_path)

    def _write_dropin(self, spec: WorkerSpec, index: int) -> bool:
        """Write one instance's drop-in; True when it changed (systemd must then reload)."""
        text = self.dropin_text(spec)
        folder = os.path.join(self.dropin_root, f"{unit_name(spec.pool, index)}.d")
        path = os.path.join(folder, DROPIN_NAME)
        try:
            with open(path, encoding="utf-8") as handle:
                if handle.read() == text:
                    return False
        except OSError:
            pass
        try:
            # Writable by root alone, whatever the daemon's umask (0007, for the queue it
            # shares with group flexiq): a drop-in can set User= or ExecStartPre=.
            os.makedirs(folder, exist_ok=True)
            os.chmod(folder, 0o755)
            write_atomically(path, text, 0o644)
        except OSError as exc:
            raise FleetError(f"cannot write the drop-in {path}: {exc.strerror}") from None
        return True

    def start(self, spec: WorkerSpec, indices: Iterable[int]) -> None:
        indices = list(indices)
        if not indices:
            return
        changed = False
        for index in indices:
            changed |= self._write_dropin(spec, index)
        # One Reload for the whole batch: it costs ~100 ms with many units loaded.
        if changed:
            self.systemd.Reload()
        for index in indices:
            name = unit_name(spec.pool, index)
            # Limits first: the instance name may have run before with other limits,
            # and runtime properties outlive the run that set them.
            self._set_limits(spec, name)
            self.systemd.StartUnit(name, "replace")
            log.info("Starting %s.", name, extra=journal(MessageId.WORKER_STARTING, POOL=spec.pool, UNIT=name))

    def _set_limits(self, spec: WorkerSpec, name: str) -> None:
        memory = spec.memory_max if spec.memory_max is not None else UNLIMITED
        weight = spec.cpu_weight if spec.cpu_weight is not None else UNLIMITED
        self.systemd.SetUnitProperties(name, True, [("MemoryMax", b"t", memory),
                                                    ("CPUWeight", b"t", weight)])

    def stop(self, workers: Iterable[WorkerInfo]) -> None:
        for worker in workers:
            name = unit_name(worker.pool, worker.index)
            if worker.state is WorkerState.ACTIVE:
                try:
                    # Stop claiming now (SIGUSR1), then drain under the unit's stop timeout.
                    # Never to a starting worker: it has no handler yet.  StopUnit's SIGTERM
                    # before READY=1 is a clean exit for systemd.
                    self.systemd.KillUnit(name, "main", signal.SIGUSR1)
                except FleetError as exc:
                    log.debug("Could not pause %s before stopping it: %s", name, exc)
            # Said before it is asked: a stop whose answer is lost (systemd re-executing) may
            # still have been carried out, and the journal must not show a worker gone unasked.
            log.info("Stopping %s (draining).", name, extra=journal(MessageId.WORKER_STOPPING, POOL=worker.pool, UNIT=name))
            self.systemd.StopUnit(name, "replace")

    def _signal_pause(self, worker: WorkerInfo, paused: bool) -> None:
        self.systemd.KillUnit(unit_name(worker.pool, worker.index), "main",
                              signal.SIGUSR1 if paused else signal.SIGUSR2)

    def forget(self, worker: WorkerInfo) -> None:
        try:
            self.systemd.ResetFailedUnit(unit_name(worker.pool, worker.index))
        except FleetError as exc:
            log.debug("reset-failed of %s: %s", worker.instance, exc)

    def stop_all(self) -> None:
        """Ask every worker unit to stop (each drains in its own time); do not wait."""
        self.stop([w for w in self.list() if w.state in (WorkerState.ACTIVE, WorkerState.STARTING)])

    def leave(self) -> None:
        # `systemctl stop flexiqd` stops the fleet; a restart (or an upgrade) leaves it
        # running for the next daemon to adopt.  A crash runs none of this.
        # A bus lost meanwhile is not waited for: `systemctl restart flexiqd` orders the bus's
        # own start (Wants=dbus.service) after this stop, so connecting again would wait for a
        # bus that waits for us.  The workers are left running then: stopping them needs the bus.
        self.systemd.reconnect = False
        job = own_job_type(self.systemd)
        if job == "stop":
            log.info("flexiqd is being stopped: stopping every worker (each drains).")
            self.stop_all()
        else:
            log.info("flexiqd is %s: leaving the workers running for the next daemon.",
                     "restarting" if job else "exiting")


def own_job_type(systemd: Systemd) -> str | None:
    """Why systemd is stopping this process's unit: ``stop``, ``restart``, ... or None."""
    try:
        return systemd.job_type_of_unit(systemd.GetUnitByPID(os.getpid()))
    except FleetError as exc:
        log.warning("Could not read this unit's pending job: %s", exc)
        return None


class UnitWatcher:
    """Calls ``on_change`` whenever a worker unit changes state (subscribed signals).

    Uses its own bus connection, driven by the asyncio loop's reader: never make
    a blocking call on it after ``watch`` (signals would queue up inside sd-bus).
    ``connect`` blocks (it waits for systemd's answer to Subscribe): run it off the loop,
    then ``watch`` on the loop.  When the bus closes the connection (the bus restarted)
    the watcher stops reading, calls ``on_change`` once more (a unit may have changed
    meanwhile) and ``lost`` turns True: the owner starts another one.
    """

    def __init__(self, on_change: Callable[[], None], address: str | None = None) -> None:
        self._on_change = on_change
        self._address = address
        self._bus = None
        self._fd: int | None = None  # sd-bus closes it when the connection is lost: remember it
        self._loop = None
        self._callback = None  # pystemd needs us to keep a reference
        self.lost = False

    def start(self, loop) -> None:
        """``connect`` and ``watch`` in one call, on the loop (blocking)."""
        self.connect()
        self.watch(loop)

    def connect(self) -> None:
        """Open the connection and subscribe to systemd's signals (blocking; FleetError on failure)."""
        bus = open_bus(self._address)
        try:
            Systemd(bus).Subscribe()
            prefix = WORKER_PATH_PREFIX
            notify = self._on_change

            def on_signal(msg, error=None, userdata=None):
                try:
                    msg.process_reply(True)
                    path = msg.headers.get("Path") or msg.headers.get(b"Path") or b""
                    if isinstance(path, str):
                        path = path.encode()
                    if path.startswith(prefix) or msg.is_signal(MANAGER, b"JobRemoved"):
                        notify()
                except Exception:  # exceptions here are lost by pystemd; log them ourselves
                    log.exception("Error while handling a systemd signal.")

            bus.match_signal(DESTINATION, None, PROPERTIES, b"PropertiesChanged", on_signal, None)
            bus.match_signal(DESTINATION, MANAGER_PATH, MANAGER, b"JobRemoved", on_signal, None)
        except Exception as exc:
            bus.close()
            if isinstance(exc, FleetError):
                raise
            raise FleetError(f"cannot follow systemd's unit changes: {_dbus_error_text(exc)}") from None
        self._callback = on_signal
        self._bus = bus

    def watch(self, loop) -> None:
        """Read the connection's messages on ``loop`` from now on."""
        self._loop = loop
        self._fd = self._bus.get_fd()
        loop.add_reader(self._fd, self._process)

    def _process(self) -> None:
        # Drain everything queued: one readable event may carry many messages.
        try:
            while True:
                message = self._bus.process()
                if message.is_empty():
                    break
        except Exception as exc:
            log.debug("Reading systemd's signals failed: %s", _dbus_error_text(exc))
        # A closed connection reads as a last message or two, then an fd of -ENOTCONN.
        if self._bus.get_fd() < 0:
            self._drop()
            self.lost = True
            log.warning("Lost the connection that follows systemd's unit changes; following them "
                        "again once the bus is back (each tick lists the workers meanwhile).")
            self._on_change()

    def _drop(self) -> None:
        if self._fd is not None and self._loop is not None:
            self._loop.remove_reader(self._fd)
        self._fd = None
        if self._bus is not None:
            try:
                self._bus.close()
            except Exception:  # closing frees it; how the bus ended does not matter
                pass
            self._bus = None

    def stop(self, loop) -> None:
        self._loop = self._loop or loop
        self._drop()
