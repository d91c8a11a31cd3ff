"""flexiqd's D-Bus API: ``org.flexiq.flexiqd1`` on the system bus, for flexiqctl and others.

    bus name   org.flexiq.flexiqd1
    objects    /org/flexiq/flexiqd1             org.flexiq.flexiqd1.Manager, ObjectManager
               /org/flexiq/flexiqd1/pool/<name> org.flexiq.flexiqd1.Pool (pools.py)

Read-only members about the pools and schedules (``Status``, ``Events``, ``History``,
``Schedules``, the properties) are for everyone; mutating ones (``Scale``, ``Unpin``, ``Pause``,
``Resume``, ``Drain``, ``Restart``, ``Reload``, on the manager and on each pool; ``RetryDead``,
``PurgeDead``; ``RunSchedule``, ``PauseSchedule``, ``ResumeSchedule``) and the reads of the jobs themselves (``Jobs``, ``Job``: their
arguments and errors) for root and members of the steering group ``flexiq-admin``
(``OPERATOR_GROUP``); job producers, in group ``flexiq``, get nothing more than everyone.  The bus policy
(``/usr/share/dbus-1/system.d/org.flexiq.flexiqd1.conf``) enforces that first; the
daemon checks again with the caller's credentials as the bus reports them, so a
missing or loosened policy file does not open them to every user.

A ``@method`` handler of dbus-fast does not see its caller, so the checked calls
are taken before dbus-fast dispatches them (``bus.add_message_handler``): ask
the bus who sent it (``GetConnectionCredentials``), then run or refuse it.  The
``@method`` stubs exist for introspection only and refuse if ever reached.

The service sees the daemon only through ``ApiPort`` (daemon/api_port.py).  It lives on
the daemon's event loop and is not thread-safe.  docs/dbus-api.md describes every
member and the ``Status`` document.  keeper.py serves it again when the bus restarts.
"""

from __future__ import annotations

import asyncio
import grp
import json
import logging
import math
from typing import Any, Awaitable, Coroutine, Iterable, Mapping

from dbus_fast import BusType, DBusError, Message, MessageFlag, MessageType, NameFlag, RequestNameReply
from dbus_fast.aio import MessageBus
from dbus_fast.service import PropertyAccess, ServiceInterface, dbus_property, method, signal

from .. import __version__
from ..busnames import (BUS_NAME, DBUS_INTERFACE, DBUS_NAME, DBUS_PATH, ERROR_ACCESS_DENIED, ERROR_FAILED,
                        ERROR_INVALID_ARGS, INTERFACE, OBJECT_MANAGER_INTERFACE, OBJECT_PATH, OPERATOR_GROUP,
                        POOL_INTERFACE, POOL_PATH_PREFIX, SIGNAL_CONFIG_RELOADED, SIGNAL_SCALE_EVENT,
                        pool_from_path)
from ..errors import ControlError, FlexiqdError
from ..daemon.api_port import ApiPort
from .pools import POOL_MUTATING, PoolInterface, PoolObjects
from .writer import install_patient_writer
from ..daemon.job_queries import parse_query

log = logging.getLogger(__name__)


# Members of the manager for root and the steering group, and their input signatures: the credentials
# check covers exactly these.
CHECKED = {"Scale": "sud", "Unpin": "s", "Pause": "s", "Resume": "s", "Drain": "s", "ClearCeiling": "s", "Reload": "",
           "Restart": "s",
           "Jobs": "s", "Job": "t", "RetryDead": "sat", "PurgeDead": "sat",
           "RunSchedule": "s", "PauseSchedule": "s", "ResumeSchedule": "s"}

CONNECT_TIMEOUT = 10.0   # seconds to reach the bus and own the name at startup
CLOSE_TIMEOUT = 2.0


class NameRefused(FlexiqdError):
    """The bus was reached but this process may not own the name (no policy file, another
    flexiqd): trying again soon will not change it."""


# -- pure part: the access rule ----------------------------------------------

def caller_allowed(uid: int, groups: Iterable[int], operator_gid: int | None) -> bool:
    """Root, or a process with the operators' group among its groups (None: no such group)."""
    return uid == 0 or (operator_gid is not None and operator_gid in set(groups))


def operator_gid() -> int | None:
    """The steering group's id, looked up on every call: the group may be created later."""
    try:
        return grp.getgrnam(OPERATOR_GROUP).gr_gid
    except KeyError:
        return None


def checked_request(msg: Message, pools: PoolObjects) -> tuple[str, list[Any]] | None:
    """(member, arguments as the manager takes them) of a call only root and the steering group may
    make; None for any other message.

    A pool object's call gets its pool as first argument: ``Pause()`` on
    ``.../pool/default`` is the manager's ``Pause("default")``.
    """
    if msg.message_type is not MessageType.METHOD_CALL:
        return None
    if msg.path == OBJECT_PATH and msg.interface == INTERFACE and CHECKED.get(msg.member) == msg.signature:
        return msg.member, list(msg.body)
    pool = pool_from_path(msg.path or "")
    if (pool is not None and pool in pools and msg.interface == POOL_INTERFACE
            and POOL_MUTATING.get(msg.member) == msg.signature):
        return msg.member, [pool, *msg.body]
    return None  # dbus-fast dispatches it (or replies UnknownMethod/UnknownObject)


# -- the bus -----------------------------------------------------------------------------------------

class ApiBus(MessageBus):
    """A MessageBus whose ObjectManager signals come from the manager object, as the specification
    says, and that a full socket does not throw off the bus (writer.py).

    dbus-fast emits InterfacesAdded/InterfacesRemoved from the added object's own
    path, where a client following the manager (sd-bus, GDBus, ``busctl monitor
    --match path=/org/flexiq/flexiqd1``) does not look.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        install_patient_writer(self)

    def _emit_interface_added(self, path: str, interface: ServiceInterface) -> None:
        if self._disconnected or not isinstance(interface, PoolInterface):
            return  # nothing manages the manager object itself
        self.send(Message.new_signal(OBJECT_PATH, OBJECT_MANAGER_INTERFACE, "InterfacesAdded",
                                     "oa{sa{sv}}", [path, {interface.name: interface.variants()}]))

    def _emit_interface_removed(self, path: str, removed_interfaces: list[str]) -> None:
        if self._disconnected or not path.startswith(POOL_PATH_PREFIX):
            return
        self.send(Message.new_signal(OBJECT_PATH, OBJECT_MANAGER_INTERFACE, "InterfacesRemoved",
                                     "oas", [path, list(removed_interfaces)]))


# -- the manager interface ----------------------------------------------------------------------------

class ManagerInterface(ServiceInterface):
    """``org.flexiq.flexiqd1.Manager``.  Lives on the daemon's event loop; not thread-safe."""

    def __init__(self, port: ApiPort) -> None:
        super().__init__(INTERFACE)
        self._port = port

    # read-only -----------------------------------------------------------------------------

    @method(name="Status")
    async def status(self) -> "s":
        return await _answer("Status", self._status_json())

    @method(name="Events")
    async def events(self, since: "t") -> "s":
        return await _answer("Events", self._events_json(since))

    async def _status_json(self) -> str:
        return json.dumps(await self._port.status())

    @method(name="Schedules")
    async def schedules(self) -> "s":
        return await _answer("Schedules", self._schedules_json())

    async def _schedules_json(self) -> str:
        return json.dumps(await self._port.schedules())

    async def _events_json(self, since: int) -> str:
        return json.dumps(await self._port.events_since(since))

    @method(name="History")
    async def history(self, pool: "s", since: "d") -> "s":
        try:
            return await _answer("History", self._history_json(pool, since))
        except ControlError as exc:
            raise DBusError(ERROR_INVALID_ARGS, str(exc)) from None

    async def _history_json(self, pool: str, since: float) -> str:
        if math.isnan(since):
            raise ControlError("since must be a time (seconds since the epoch), not NaN")
        return json.dumps(await self._port.history(pool, since))

    @dbus_property(access=PropertyAccess.READ, name="Version")
    def version(self) -> "s":
        return __version__

    @dbus_property(access=PropertyAccess.READ, name="ConfigPath")
    def config_path(self) -> "s":
        return self._port.config_path

    @dbus_property(access=PropertyAccess.READ, name="ConfigError")
    def config_error(self) -> "s":
        return self._port.config_error() or ""

    @dbus_property(access=PropertyAccess.READ, name="Pools")
    def pools(self) -> "as":
        return self._port.pool_names()

    # mutating: taken by ApiService._intercept after the credentials check; never reached ------

    @method(name="Scale")
    def scale(self, pool: "s", n: "u", for_seconds: "d"):
        raise _unchecked()

    @method(name="Unpin")
    def unpin(self, pool: "s"):
        raise _unchecked()

    @method(name="Pause")
    def pause(self, pool: "s"):
        raise _unchecked()

    @method(name="Resume")
    def resume(self, pool: "s"):
        raise _unchecked()

    @method(name="Drain")
    def drain(self, pool: "s"):
        raise _unchecked()

    @method(name="ClearCeiling")
    def clear_ceiling(self, pool: "s"):
        raise _unchecked()

    @method(name="Restart")
    def restart(self, pool: "s") -> "t":
        raise _unchecked()

    @method(name="Reload")
    def reload(self):
        raise _unchecked()

    @method(name="Jobs")
    def jobs(self, query: "s") -> "s":
        raise _unchecked()

    @method(name="Job")
    def job(self, job_id: "t") -> "s":
        raise _unchecked()

    @method(name="RetryDead")
    def retry_dead(self, queue: "s", ids: "at") -> "u":
        raise _unchecked()

    @method(name="PurgeDead")
    def purge_dead(self, queue: "s", ids: "at") -> "u":
        raise _unchecked()

    @method(name="RunSchedule")
    def run_schedule(self, name: "s") -> "t":
        raise _unchecked()

    @method(name="PauseSchedule")
    def pause_schedule(self, name: "s") -> "b":
        raise _unchecked()

    @method(name="ResumeSchedule")
    def resume_schedule(self, name: "s") -> "b":
        raise _unchecked()

    # signals -----------------------------------------------------------------------------------

    @signal(name=SIGNAL_SCALE_EVENT)
    def scale_event(self, pool: str, previous: int, desired: int, reason: str, seq: int) -> "suust":
        return [pool, previous, desired, reason, seq]

    @signal(name=SIGNAL_CONFIG_RELOADED)
    def config_reloaded(self, ok: bool, message: str) -> "bs":
        return [ok, message]


async def _answer(member: str, work: Awaitable[str]) -> str:
    """The result of ``work``; a failure becomes one line for the caller and a traceback in the log
    (a ``ControlError``, the caller's mistake, is the caller's to turn into InvalidArgs).

    Without this dbus-fast would send the traceback itself to any caller.
    """
    try:
        return await work
    except ControlError:
        raise
    except Exception as exc:
        log.exception("%s failed.", member)
        raise DBusError(ERROR_FAILED, f"{member} failed inside flexiqd: {exc}") from None


def _unchecked() -> DBusError:
    # Fail closed: a mutating call that skipped the credentials check is refused.
    return DBusError(ERROR_ACCESS_DENIED, "refused: the caller's credentials were not checked")


class ApiService:
    """The exported objects, the name and the checks around them.  Owned by the daemon's loop."""

    def __init__(self, port: ApiPort, bus: Any) -> None:
        self.port = port
        self.bus = bus
        self.interface = ManagerInterface(port)
        self.pools = PoolObjects(bus)
        self._tasks: set[asyncio.Task] = set()
        self._published = self._properties()
        self._closing = False
        self._subscribed = False
        self._refresh: asyncio.Task | None = None
        self._refresh_again = False

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        self.bus.add_message_handler(self._intercept)
        self.bus.export(OBJECT_PATH, self.interface)
        # The pool objects exist before the name appears: a client that sees the name finds them.
        try:
            self.pools.update(await self.port.status())
        except Exception:  # the first tick's refresh adds them
            log.exception("Could not read the status for the pool objects.")
        try:
            reply = await self.bus.request_name(BUS_NAME, NameFlag.DO_NOT_QUEUE)
        except DBusError as exc:
            raise NameRefused(
                f"the bus refused to let this process own {BUS_NAME} ({exc.text}); "
                f"is /usr/share/dbus-1/system.d/{BUS_NAME}.conf installed and is flexiqd running as root?"
            ) from None
        if reply not in (RequestNameReply.PRIMARY_OWNER, RequestNameReply.ALREADY_OWNER):
            raise NameRefused(f"{BUS_NAME} is already owned by another process: is another flexiqd running?")
        self.port.subscribe(self._on_change)
        self._subscribed = True
        log.info("Offering %s at %s on the bus.", BUS_NAME, OBJECT_PATH)

    async def lost(self) -> str:
        """Wait until the bus closes the connection; why, in words.  (keeper.py serves again.)"""
        try:
            # Shielded: cancelling a wait for the disconnection would cancel dbus-fast's one
            # future for it, and close() waits on that future too.
            await asyncio.shield(self.bus.wait_for_disconnect())
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return str(exc) or type(exc).__name__
        return "the bus closed the connection"

    def abandon(self) -> None:
        """Stop serving on a connection the bus has closed: no more signals, in-flight calls
        cancelled (their callers lost their connection too).  Idempotent."""
        if self._closing:
            return
        self._closing = True
        if self._subscribed:
            self.port.unsubscribe(self._on_change)
        for task in list(self._tasks):
            task.cancel()

    async def close(self) -> None:
        """Leave the bus: in-flight calls are cancelled.  Idempotent."""
        if self._closing:
            return
        self.abandon()
        self.bus.disconnect()
        try:
            await asyncio.wait_for(self.bus.wait_for_disconnect(), CLOSE_TIMEOUT)
        except Exception:  # disconnecting is all that matters; how it ended does not
            pass

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task:
        """Run ``work`` on the loop; close() cancels it."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- the daemon's changes, as signals -----------------------------------------------------------

    def _properties(self) -> dict[str, Any]:
        return {"ConfigError": self.port.config_error() or "", "Pools": self.port.pool_names()}

    def _on_change(self, kind: str, payload: Any) -> None:
        """The port's listener (called on the loop): turn the daemon's changes into signals."""
        if self._closing:
            return
        if kind == "scale":
            self.interface.scale_event(payload.pool, payload.previous, payload.desired, payload.reason,
                                       payload.seq)
        elif kind == "reload":
            ok, message = payload
            self.interface.config_reloaded(bool(ok), str(message))
            current = self._properties()
            changed = {name: value for name, value in current.items() if self._published.get(name) != value}
            self._published = current
            if changed:
                self.interface.emit_properties_changed(changed)
            self._refresh_pools()  # a reload may add or remove pools
        elif kind == "tick":
            self._refresh_pools()

    def _refresh_pools(self) -> None:
        """Bring the pool objects up to date, once more if asked again meanwhile (never two at once)."""
        if self._refresh is not None and not self._refresh.done():
            self._refresh_again = True
            return
        self._refresh = self._spawn(self._update_pools())

    async def _update_pools(self) -> None:
        while True:
            self._refresh_again = False
            try:
                document = await self.port.status()
            except Exception:  # the next tick tries again; the objects keep their values meanwhile
                log.exception("Could not read the status for the pool objects.")
                return
            if self._closing:
                return
            self.pools.update(document)
            if not self._refresh_again:
                return

    # -- mutating calls: check the caller, then act ---------------------------------------------------

    def _intercept(self, msg: Message) -> bool | None:
        """bus message handler: take the mutating calls (True = handled, the reply comes later)."""
        request = checked_request(msg, self.pools)
        if request is None:
            return None
        self._spawn(self._checked_call(msg, *request))
        return True

    async def _checked_call(self, msg: Message, member: str, args: list[Any]) -> None:
        try:
            uid, pid = await self._authorize(msg)
            # Every change is logged with its caller; a read of the jobs only when debugging.
            log.log(logging.DEBUG if member in ("Jobs", "Job") else logging.INFO, "%s(%s) from uid %d (pid %s).",
                    member, ", ".join(repr(a) for a in args), uid, pid if pid is not None else "?")
            signature, body = await self._perform(member, args)
            reply = Message.new_method_return(msg, signature, body)
        except DBusError as exc:
            reply = Message.new_error(msg, exc.type, exc.text)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug must answer the caller, not leave it waiting
            log.exception("%s failed.", member)
            reply = Message.new_error(msg, ERROR_FAILED, f"{member} failed inside flexiqd: {exc}")
        if not msg.flags & MessageFlag.NO_REPLY_EXPECTED:
            self.bus.send(reply)

    async def _authorize(self, msg: Message) -> tuple[int, int | None]:
        """(uid, pid) of the caller when it may steer flexiqd; AccessDenied otherwise."""
        reply = await self.bus.call(Message(
            destination=DBUS_NAME, path=DBUS_PATH, interface=DBUS_INTERFACE,
            member="GetConnectionCredentials", signature="s", body=[msg.sender]))
        if reply is None or reply.message_type is not MessageType.METHOD_RETURN:
            detail = reply.body[0] if reply is not None and reply.body else "no answer"
            raise DBusError(ERROR_ACCESS_DENIED, f"{msg.member} refused: cannot verify the caller ({detail})")
        credentials = reply.body[0]
        uid = _variant(credentials, "UnixUserID")
        groups = _variant(credentials, "UnixGroupIDs")
        pid = _variant(credentials, "ProcessID")
        if uid is None:
            raise DBusError(ERROR_ACCESS_DENIED, f"{msg.member} refused: the bus did not say who the caller is")
        # A bus that does not report groups leaves only root (fail closed).
        if caller_allowed(uid, groups or (), operator_gid()):
            return uid, pid
        log.warning("Refused %s to uid %d (pid %s): neither root nor in group %s.", msg.member, uid,
                    pid if pid is not None else "?", OPERATOR_GROUP)
        raise DBusError(ERROR_ACCESS_DENIED,
                        f"{msg.member} is for root and members of the {OPERATOR_GROUP} group "
                        f"(caller uid {uid})")

    async def _perform(self, member: str, args: list[Any]) -> tuple[str, list[Any]]:
        """Carry out a checked call, in the manager's terms (the pool first); its reply's
        signature and body."""
        port = self.port
        if member == "Reload":
            port.request_reload()
            return "", []
        if member in ("Jobs", "Job", "RetryDead", "PurgeDead", "RunSchedule", "PauseSchedule", "ResumeSchedule"):
            try:
                return await self._jobs_call(member, args)
            except ControlError as exc:
                raise DBusError(ERROR_INVALID_ARGS, str(exc)) from None
            except FlexiqdError as exc:
                raise DBusError(ERROR_FAILED, f"{member}: {exc}") from None
        if member == "Restart":
            try:
                return "t", [await port.restart(args[0])]
            except ControlError as exc:
                raise DBusError(ERROR_INVALID_ARGS, str(exc)) from None
            except FlexiqdError as exc:
                raise DBusError(ERROR_FAILED, str(exc)) from None
        if member == "Scale":
            pool, workers, for_seconds = args
            if not math.isfinite(for_seconds):
                raise DBusError(ERROR_INVALID_ARGS, f"for_seconds must be a finite number, got {for_seconds}")
            work = port.pin(pool, workers, for_seconds if for_seconds > 0 else None)
        else:
            action = getattr(port, {"Unpin": "unpin", "Pause": "pause", "Resume": "resume", "Drain": "drain",
                                    "ClearCeiling": "clear_ceiling"}[member])
            work = action(*args)
        try:
            await work
        except ControlError as exc:
            raise DBusError(ERROR_INVALID_ARGS, str(exc)) from None
        except FlexiqdError as exc:
            raise DBusError(ERROR_FAILED, str(exc)) from None
        return "", []

    async def _jobs_call(self, member: str, args: list[Any]) -> tuple[str, list[Any]]:
        """The checked reads and changes of the jobs themselves."""
        port = self.port
        if member == "Jobs":
            return "s", [json.dumps(await port.jobs(parse_query(args[0])))]
        if member == "Job":
            return "s", [json.dumps(await port.job(args[0]))]
        if member == "RunSchedule":
            return "t", [await port.run_schedule(args[0])]
        if member in ("PauseSchedule", "ResumeSchedule"):
            return "b", [await port.pause_schedule(args[0], member == "PauseSchedule")]
        queue, ids = args[0] or None, list(args[1]) or None
        action = port.retry_dead if member == "RetryDead" else port.purge_dead
        return "u", [await action(queue, ids)]


def _variant(mapping: Mapping[str, Any], key: str) -> Any:
    value = mapping.get(key)
    return getattr(value, "value", value)


async def serve_api(port: ApiPort, address: str | None) -> ApiService:
    """Connect to the bus (the system bus when ``address`` is None), export, own the name.

    Raises FlexiqdError when the bus cannot be reached or the name is taken or refused.
    """
    where = address or "the system bus"
    try:
        bus = ApiBus(bus_address=address) if address else ApiBus(bus_type=BusType.SYSTEM)
        await asyncio.wait_for(bus.connect(), CONNECT_TIMEOUT)
    except Exception as exc:  # OSError, a timeout, or dbus-fast's AuthError and plain Exceptions of a failed handshake
        raise FlexiqdError(f"cannot connect to {where}: {exc or type(exc).__name__}") from None
    service = ApiService(port, bus)
    try:
        await asyncio.wait_for(service.start(), CONNECT_TIMEOUT)
    except asyncio.TimeoutError:
        service.abandon()
        bus.disconnect()
        raise FlexiqdError(f"{where} did not answer the request for {BUS_NAME}") from None
    except BaseException:  # refused, or the daemon stopping meanwhile: leave no connection behind
        service.abandon()
        bus.disconnect()
        raise
    return service
