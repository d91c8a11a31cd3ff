"""flexiqd's D-Bus API: ``org.flexiq.flexiqd1`` on the system bus, for flexiqctl and others.

    bus name   org.flexiq.flexiqd1
    object     /org/flexiq/flexiqd1
    interface  org.flexiq.flexiqd1.Manager

Read-only members (``Status``, ``Events``, the properties) are for everyone;
mutating ones (``Scale``, ``Unpin``, ``Pause``, ``Resume``, ``Drain``,
``Reload``) for root and members of the ``flexiq`` group.  The bus policy
(``/usr/share/dbus-1/system.d/org.flexiq.flexiqd1.conf``) enforces that first;
the daemon checks again with the caller's credentials as the bus reports them,
so a missing or loosened policy file does not open the controls to every user.

A ``@method`` handler of dbus-fast does not see its caller, so mutating calls
are taken before dbus-fast dispatches them (``bus.add_message_handler``): ask
the bus who sent it (``GetConnectionCredentials``), then run or refuse it.  The
``@method`` stubs exist for introspection only and refuse if ever reached.

Everything that touches the controller runs on the daemon's I/O thread
(``daemon.io``): the controller is not thread-safe.  docs/dbus-api.md describes
every member and the ``Status`` document.
"""

from __future__ import annotations

import asyncio
import grp
import json
import logging
import math
import time
from typing import TYPE_CHECKING, Any, Awaitable, Iterable, Mapping

from dbus_fast import BusType, DBusError, Message, MessageFlag, MessageType, NameFlag, RequestNameReply
from dbus_fast.aio import MessageBus
from dbus_fast.service import PropertyAccess, ServiceInterface, dbus_property, method, signal

from .. import __version__
from ..busnames import (BUS_NAME, ERROR_ACCESS_DENIED, ERROR_FAILED, ERROR_INVALID_ARGS, INTERFACE,
                        OBJECT_PATH, OPERATOR_GROUP)
from ..errors import ControlError, FlexiqdError
from .documents import event_document, status_document

if TYPE_CHECKING:
    from .service import Daemon

log = logging.getLogger(__name__)


# Mutating members and their input signatures: the credentials check covers exactly these.
MUTATING = {"Scale": "sud", "Unpin": "s", "Pause": "s", "Resume": "s", "Drain": "s", "Reload": ""}

CONNECT_TIMEOUT = 10.0   # seconds to reach the bus and own the name at startup
CLOSE_TIMEOUT = 2.0


# -- pure part: the access rule ----------------------------------------------

def caller_allowed(uid: int, groups: Iterable[int], operator_gid: int | None) -> bool:
    """Root, or a process with the operators' group among its groups (None: no such group)."""
    return uid == 0 or (operator_gid is not None and operator_gid in set(groups))


def operator_gid() -> int | None:
    """The ``flexiq`` group's id, looked up on every call: the group may be created later."""
    try:
        return grp.getgrnam(OPERATOR_GROUP).gr_gid
    except KeyError:
        return None


# -- the interface ------------------------------------------------------------------------------

class ManagerInterface(ServiceInterface):
    """``org.flexiq.flexiqd1.Manager``.  Lives on the daemon's event loop; not thread-safe."""

    def __init__(self, api: "ApiService") -> None:
        super().__init__(INTERFACE)
        self._api = api

    # read-only -----------------------------------------------------------------------------

    @method(name="Status")
    async def status(self) -> "s":
        return await _answer("Status", self._api.status_json())

    @method(name="Events")
    async def events(self, since: "t") -> "s":
        return await _answer("Events", self._api.events_json(since))

    @dbus_property(access=PropertyAccess.READ, name="Version")
    def version(self) -> "s":
        return __version__

    @dbus_property(access=PropertyAccess.READ, name="ConfigPath")
    def config_path(self) -> "s":
        return self._api.daemon.options.config_path

    @dbus_property(access=PropertyAccess.READ, name="ConfigError")
    def config_error(self) -> "s":
        return self._api.daemon.config_error or ""

    @dbus_property(access=PropertyAccess.READ, name="Pools")
    def pools(self) -> "as":
        return self._api.pool_names()

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

    @method(name="Reload")
    def reload(self):
        raise _unchecked()

    # signals -----------------------------------------------------------------------------------

    @signal(name="ScaleEvent")
    def scale_event(self, pool: str, previous: int, desired: int, reason: str) -> "suus":
        return [pool, previous, desired, reason]

    @signal(name="ConfigReloaded")
    def config_reloaded(self, ok: bool, message: str) -> "bs":
        return [ok, message]


async def _answer(member: str, work: Awaitable[str]) -> str:
    """The result of ``work``; a failure becomes one line for the caller and a traceback in the log.

    Without this dbus-fast would send the traceback itself to any caller.
    """
    try:
        return await work
    except Exception as exc:
        log.exception("%s failed.", member)
        raise DBusError(ERROR_FAILED, f"{member} failed inside flexiqd: {exc}") from None


def _unchecked() -> DBusError:
    # Fail closed: a mutating call that skipped the credentials check is refused.
    return DBusError(ERROR_ACCESS_DENIED, "refused: the caller's credentials were not checked")


class ApiService:
    """The exported object, its name and the checks around it.  Owned by the daemon's loop."""

    def __init__(self, daemon: "Daemon", bus: MessageBus) -> None:
        self.daemon = daemon
        self.bus = bus
        self.interface = ManagerInterface(self)
        self._tasks: set[asyncio.Task] = set()
        self._published = self._properties()
        self._closing = False
        self._watch: asyncio.Task | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        self.bus.add_message_handler(self._intercept)
        self.bus.export(OBJECT_PATH, self.interface)
        try:
            reply = await self.bus.request_name(BUS_NAME, NameFlag.DO_NOT_QUEUE)
        except DBusError as exc:
            raise FlexiqdError(
                f"the bus refused to let this process own {BUS_NAME} ({exc.text}); "
                f"is /usr/share/dbus-1/system.d/{BUS_NAME}.conf installed and is flexiqd running as root?"
            ) from None
        if reply not in (RequestNameReply.PRIMARY_OWNER, RequestNameReply.ALREADY_OWNER):
            raise FlexiqdError(f"{BUS_NAME} is already owned by another process: is another flexiqd running?")
        self.daemon.listeners.append(self._on_daemon_event)
        self._watch = asyncio.get_running_loop().create_task(self._watch_disconnect())
        log.info("Offering %s at %s on the bus.", BUS_NAME, OBJECT_PATH)

    async def close(self) -> None:
        """Leave the bus: in-flight calls are cancelled.  Idempotent."""
        if self._closing:
            return
        self._closing = True
        if self._on_daemon_event in self.daemon.listeners:
            self.daemon.listeners.remove(self._on_daemon_event)
        for task in list(self._tasks):
            task.cancel()
        self.bus.disconnect()
        try:
            await asyncio.wait_for(self.bus.wait_for_disconnect(), CLOSE_TIMEOUT)
        except Exception:  # disconnecting is all that matters; how it ended does not
            pass

    async def _watch_disconnect(self) -> None:
        try:
            await self.bus.wait_for_disconnect()
        except Exception as exc:
            if not self._closing:
                log.warning("Lost the bus connection (%s): flexiqctl cannot reach this daemon until "
                            "it restarts.", exc)
            return
        if not self._closing:
            log.warning("The bus closed the connection: flexiqctl cannot reach this daemon until it restarts.")

    # -- read-only ----------------------------------------------------------------------------------

    async def status_json(self) -> str:
        daemon = self.daemon
        config_path, config_error = daemon.options.config_path, daemon.config_error

        def build() -> dict[str, Any]:
            controller = daemon.controller
            if controller is None:
                return status_document(daemon.config, config_path, config_error, {}, {}, time.time())
            return status_document(controller.config, config_path, config_error, controller.views,
                                   controller.overrides, time.time())

        return json.dumps(await daemon.io(build))

    async def events_json(self, since: int) -> str:
        controller = self.daemon.controller
        if controller is None:
            return "[]"
        events = await self.daemon.io(controller.events.since, since)
        return json.dumps([event_document(e) for e in events])

    def pool_names(self) -> list[str]:
        config = self.daemon.config
        return sorted(config.pools) if config is not None else []

    def _properties(self) -> dict[str, Any]:
        return {"ConfigError": self.daemon.config_error or "", "Pools": self.pool_names()}

    # -- signals --------------------------------------------------------------------------------

    def _on_daemon_event(self, kind: str, payload: Any) -> None:
        """A Daemon listener (called on the loop): turn the daemon's events into signals."""
        if kind == "scale":
            self.interface.scale_event(payload.pool, payload.current, payload.desired, payload.reason)
        elif kind == "reload":
            ok, message = payload
            self.interface.config_reloaded(bool(ok), str(message))
            current = self._properties()
            changed = {name: value for name, value in current.items() if self._published.get(name) != value}
            self._published = current
            if changed:
                self.interface.emit_properties_changed(changed)

    # -- mutating calls: check the caller, then act ---------------------------------------------------

    def _intercept(self, msg: Message) -> bool | None:
        """bus message handler: take the mutating calls (True = handled, the reply comes later)."""
        if (msg.message_type is not MessageType.METHOD_CALL or msg.path != OBJECT_PATH
                or msg.interface != INTERFACE or MUTATING.get(msg.member) != msg.signature):
            return None  # dbus-fast dispatches it (or replies UnknownMethod)
        task = asyncio.get_running_loop().create_task(self._checked_call(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _checked_call(self, msg: Message) -> None:
        try:
            uid, pid = await self._authorize(msg)
            log.info("%s(%s) from uid %d (pid %s).", msg.member,
                     ", ".join(repr(a) for a in msg.body), uid, pid if pid is not None else "?")
            await self._perform(msg.member, list(msg.body))
            reply = Message.new_method_return(msg)
        except DBusError as exc:
            reply = Message.new_error(msg, exc.type, exc.text)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug must answer the caller, not leave it waiting
            log.exception("%s failed.", msg.member)
            reply = Message.new_error(msg, ERROR_FAILED, f"{msg.member} failed inside flexiqd: {exc}")
        if not msg.flags & MessageFlag.NO_REPLY_EXPECTED:
            self.bus.send(reply)

    async def _authorize(self, msg: Message) -> tuple[int, int | None]:
        """(uid, pid) of the caller when it may steer flexiqd; AccessDenied otherwise."""
        reply = await self.bus.call(Message(
            destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus", member="GetConnectionCredentials",
            signature="s", body=[msg.sender]))
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

    async def _perform(self, member: str, args: list[Any]) -> None:
        daemon = self.daemon
        if member == "Reload":
            daemon.request_reload()
            return
        controller = daemon.controller
        if controller is None:
            raise DBusError(ERROR_FAILED, "flexiqd is still starting")
        if member == "Scale":
            pool, workers, for_seconds = args
            if not math.isfinite(for_seconds):
                raise DBusError(ERROR_INVALID_ARGS, f"for_seconds must be a finite number, got {for_seconds}")
            action = (controller.pin, pool, workers, for_seconds if for_seconds > 0 else None)
        else:
            action = ({"Unpin": controller.unpin, "Pause": controller.pause, "Resume": controller.resume,
                       "Drain": controller.drain}[member], *args)
        try:
            await daemon.io(*action)
        except ControlError as exc:
            raise DBusError(ERROR_INVALID_ARGS, str(exc)) from None
        except FlexiqdError as exc:
            raise DBusError(ERROR_FAILED, str(exc)) from None
        daemon.wake()  # apply it now, not at the next tick


def _variant(mapping: Mapping[str, Any], key: str) -> Any:
    value = mapping.get(key)
    return getattr(value, "value", value)


async def serve_api(daemon: "Daemon", address: str | None) -> ApiService:
    """Connect to the bus (the system bus when ``address`` is None), export, own the name.

    Raises FlexiqdError when the bus cannot be reached or the name is taken or refused.
    """
    where = address or "the system bus"
    try:
        bus = MessageBus(bus_address=address) if address else MessageBus(bus_type=BusType.SYSTEM)
        await asyncio.wait_for(bus.connect(), CONNECT_TIMEOUT)
    except Exception as exc:  # OSError, a timeout, or dbus-fast's AuthError and plain Exceptions of a failed handshake
        raise FlexiqdError(f"cannot connect to {where}: {exc or type(exc).__name__}") from None
    service = ApiService(daemon, bus)
    try:
        await asyncio.wait_for(service.start(), CONNECT_TIMEOUT)
    except asyncio.TimeoutError:
        bus.disconnect()
        raise FlexiqdError(f"{where} did not answer the request for {BUS_NAME}") from None
    except FlexiqdError:
        bus.disconnect()
        raise
    return service
