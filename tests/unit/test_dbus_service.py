"""ApiService without a bus or a daemon: a fake ApiPort and a fake bus that records what is sent.

The fake bus joins each exported interface the way dbus-fast does (``ServiceInterface._add_bus``)
so that signals and PropertiesChanged reach it; everything else it only records.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
from types import SimpleNamespace

import pytest
from dbus_fast import Message, MessageType, RequestNameReply, Variant
from dbus_fast.service import ServiceInterface

from flexiqd.busnames import ERROR_ACCESS_DENIED, ERROR_FAILED, ERROR_INVALID_ARGS, INTERFACE, OBJECT_PATH
from flexiqd.dbus import service as dbus_api
from flexiqd.dbus.service import ApiService
from flexiqd.dbus.pools import pool_properties
from flexiqd.daemon.events import ScaleEvent
from flexiqd.errors import ControlError, FlexiqdError

POOL_PATH = "/org/flexiq/flexiqd1/pool/default"
POOL_INTERFACE = "org.flexiq.flexiqd1.Pool"
OPERATORS = 990


def pool_entry(name: str, active: int | None = 1, paused: bool = False) -> dict:
    return {"name": name, "queues": [name], "concurrency": 2, "min_workers": 1, "max_workers": 5,
            "workers": None if active is None else {"active": active, "starting": 0, "draining": 0, "failed": 0},
            "desired": active, "binding_cap": None, "start_cost": None, "metrics": None, "utilisation": None,
            "decision": None, "paused": paused, "pinned": None}


class FakePort:
    """ApiPort with a document to publish and a record of the requests."""

    config_path = "/etc/flexiqd/flexiqd.yaml"

    def __init__(self, *pools: str) -> None:
        self.document = {"version": "0", "config_path": self.config_path, "config_error": None,
                         "pools": {name: pool_entry(name) for name in pools}}
        self.error: str | None = None
        self.requests: list[tuple] = []
        self.listeners: list = []
        self.refuse: Exception | None = None

    def config_error(self):
        return self.error

    def pool_names(self):
        return sorted(self.document["pools"])

    async def status(self):
        return copy.deepcopy(self.document)

    async def events_since(self, seq):
        return [{"seq": 7, "pool": "default"}] if seq < 7 else []

    async def _request(self, *request):
        if self.refuse is not None:
            raise self.refuse
        self.requests.append(request)

    async def pin(self, pool, workers, seconds):
        await self._request("pin", pool, workers, seconds)

    async def unpin(self, pool):
        await self._request("unpin", pool)

    async def pause(self, pool):
        await self._request("pause", pool)

    async def restart(self, pool):
        await self._request("restart", pool)
        return 1_700_000_000_000_000

    async def resume(self, pool):
        await self._request("resume", pool)

    async def drain(self, pool):
        await self._request("drain", pool)

    async def clear_ceiling(self, pool):
        await self._request("clear_ceiling", pool)

    def request_reload(self):
        self.requests.append(("reload",))

    def subscribe(self, listener):
        self.listeners.append(listener)

    def unsubscribe(self, listener):
        self.listeners.remove(listener)

    def tell(self, kind, payload=None):
        for listener in list(self.listeners):
            listener(kind, payload)


class FakeBus:
    """Records exports, replies and signals; answers GetConnectionCredentials with ``uid`` and ``groups``."""

    def __init__(self, uid: int = 0, groups: tuple[int, ...] = ()) -> None:
        self.uid, self.groups = uid, groups
        self.exported: dict[str, ServiceInterface] = {}
        self.handlers: list = []
        self.replies: list[Message] = []
        self.signals: list[tuple[str, str, str, list]] = []   # (path, interface, member, body)
        self.name_reply = RequestNameReply.PRIMARY_OWNER
        self._gone: asyncio.Future | None = None

    def add_message_handler(self, handler):
        self.handlers.append(handler)

    def export(self, path, interface):
        self.exported[path] = interface
        ServiceInterface._add_bus(interface, self, lambda iface, method: None)

    def unexport(self, path, interface):
        assert self.exported.pop(path) is interface
        ServiceInterface._remove_bus(interface, self)

    def _interface_signal_notify(self, interface, interface_name, member, signature, body, unix_fds=None):
        path = next(p for p, i in self.exported.items() if i is interface)
        self.signals.append((path, interface_name, member, body))

    async def request_name(self, name, flags):
        return self.name_reply

    async def call(self, message):
        assert message.member == "GetConnectionCredentials"
        return SimpleNamespace(message_type=MessageType.METHOD_RETURN, body=[{
            "UnixUserID": Variant("u", self.uid), "UnixGroupIDs": Variant("au", list(self.groups)),
            "ProcessID": Variant("u", 4321)}])

    def send(self, message):
        self.replies.append(message)

    def _disconnected(self) -> asyncio.Future:
        if self._gone is None:
            self._gone = asyncio.get_running_loop().create_future()
        return self._gone

    def disconnect(self):
        if not self._disconnected().done():
            self._gone.set_result(None)

    async def wait_for_disconnect(self):
        # One future for every waiter, as dbus-fast has: a waiter that is cancelled cancels it for all.
        return await self._disconnected()


def call(path: str, interface: str, member: str, signature: str = "", body=()) -> Message:
    return Message(destination="org.flexiq.flexiqd1", path=path, interface=interface, member=member,
                   signature=signature, body=list(body), serial=11, sender=":1.42")


def run(scenario, port: FakePort, bus: FakeBus):
    """Start the service on ``bus`` for ``port``, run ``scenario(service)``, close it."""
    async def main():
        service = ApiService(port, bus)
        await service.start()
        try:
            return await scenario(service)
        finally:
            await service.close()
    return asyncio.run(main())


async def reply_to(service: ApiService, message: Message) -> Message:
    """Hand ``message`` to the service's handler as the bus would, and wait for its reply."""
    bus = service.bus
    sent = len(bus.replies)
    assert any(handler(message) for handler in bus.handlers), "the call was not taken"
    while len(bus.replies) == sent:
        await asyncio.sleep(0)
    return bus.replies[-1]


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.fixture(autouse=True)
def operators_group(monkeypatch):
    monkeypatch.setattr(dbus_api, "operator_gid", lambda: OPERATORS)


# -- objects ------------------------------------------------------------------------------------------

def test_start_exports_the_manager_and_one_object_per_pool_then_subscribes():
    port, bus = FakePort("default", "images"), FakeBus()

    async def scenario(service):
        assert port.listeners == [service._on_change]
        return dict(bus.exported)

    exported = run(scenario, port, bus)
    assert sorted(exported) == [OBJECT_PATH, "/org/flexiq/flexiqd1/pool/default", "/org/flexiq/flexiqd1/pool/images"]
    assert exported[POOL_PATH].values == pool_properties(port.document["pools"]["default"])
    assert port.listeners == []  # close() unsubscribed


def test_a_name_owned_elsewhere_is_refused_and_nothing_subscribes():
    port, bus = FakePort("default"), FakeBus()
    bus.name_reply = RequestNameReply.EXISTS

    async def main():
        with pytest.raises(FlexiqdError, match="already owned"):
            await ApiService(port, bus).start()

    asyncio.run(main())
    assert port.listeners == []


def test_status_and_events_are_the_ports_documents_as_json():
    port = FakePort("default")

    async def scenario(service):
        return (json.loads(await service.interface._status_json()),
                json.loads(await service.interface._events_json(0)),
                json.loads(await service.interface._events_json(7)))

    document, events, none = run(scenario, port, FakeBus())
    assert document == port.document and events == [{"seq": 7, "pool": "default"}] and none == []


# -- mutating calls -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("message, expected", [
    (call(OBJECT_PATH, INTERFACE, "Scale", "sud", ["default", 3, 0.0]), ("pin", "default", 3, None)),
    (call(OBJECT_PATH, INTERFACE, "Scale", "sud", ["default", 3, 30.0]), ("pin", "default", 3, 30.0)),
    (call(OBJECT_PATH, INTERFACE, "Drain", "s", ["default"]), ("drain", "default")),
    (call(OBJECT_PATH, INTERFACE, "Reload"), ("reload",)),
    (call(POOL_PATH, POOL_INTERFACE, "Scale", "ud", [2, 0.0]), ("pin", "default", 2, None)),
    (call(POOL_PATH, POOL_INTERFACE, "Pause"), ("pause", "default")),
    (call(POOL_PATH, POOL_INTERFACE, "Resume"), ("resume", "default")),
    (call(POOL_PATH, POOL_INTERFACE, "Unpin"), ("unpin", "default")),
    (call(OBJECT_PATH, INTERFACE, "ClearCeiling", "s", ["default"]), ("clear_ceiling", "default")),
    (call(POOL_PATH, POOL_INTERFACE, "ClearCeiling"), ("clear_ceiling", "default")),
    (call(OBJECT_PATH, INTERFACE, "Restart", "s", ["default"]), ("restart", "default")),
    (call(POOL_PATH, POOL_INTERFACE, "Restart"), ("restart", "default")),
])
def test_root_and_the_operators_group_steer_through_the_port(message, expected):
    for uid, groups in ((0, ()), (1000, (27, OPERATORS))):
        port = FakePort("default")

        async def scenario(service):
            return await reply_to(service, message)

        reply = run(scenario, port, FakeBus(uid, groups))
        assert reply.message_type is MessageType.METHOD_RETURN and reply.reply_serial == 11
        assert port.requests == [expected]


def test_anyone_else_is_refused_before_the_port_hears_of_it():
    port = FakePort("default")

    async def scenario(service):
        return [await reply_to(service, m) for m in (call(POOL_PATH, POOL_INTERFACE, "Pause"),
                                                     call(OBJECT_PATH, INTERFACE, "Reload"))]

    replies = run(scenario, port, FakeBus(uid=1000, groups=(27,)))
    assert [r.error_name for r in replies] == [ERROR_ACCESS_DENIED] * 2
    assert replies[0].body == ["Pause is for root and members of the flexiq-admin group (caller uid 1000)"]
    assert port.requests == []


@pytest.mark.parametrize("refusal, error_name", [
    (ControlError("no pool named 'nope' (pools: default)"), ERROR_INVALID_ARGS),
    (FlexiqdError("flexiqd is still starting"), ERROR_FAILED),
])
def test_the_ports_refusals_become_error_replies_of_one_line(refusal, error_name):
    port = FakePort("default")
    port.refuse = refusal

    async def scenario(service):
        return await reply_to(service, call(OBJECT_PATH, INTERFACE, "Pause", "s", ["nope"]))

    reply = run(scenario, port, FakeBus())
    assert reply.error_name == error_name and reply.body == [str(refusal)]


def test_a_scale_for_a_time_that_is_not_finite_is_refused():
    port = FakePort("default")

    async def scenario(service):
        return await reply_to(service, call(POOL_PATH, POOL_INTERFACE, "Scale", "ud", [2, math.inf]))

    reply = run(scenario, port, FakeBus())
    assert reply.error_name == ERROR_INVALID_ARGS and port.requests == []


def test_calls_that_are_not_mutating_or_name_no_pool_go_to_dbus_fast():
    port = FakePort("default")

    async def scenario(service):
        return [handler(m) for handler in service.bus.handlers for m in (
            call(OBJECT_PATH, INTERFACE, "Status"),
            call(POOL_PATH, POOL_INTERFACE, "Scale", "sud", ["default", 1, 0.0]),   # the manager's signature
            call("/org/flexiq/flexiqd1/pool/nosuchpool", POOL_INTERFACE, "Pause"),
            call(POOL_PATH, INTERFACE, "Pause", "s", ["default"]))]

    assert run(scenario, port, FakeBus()) == [None, None, None, None]


# -- signals --------------------------------------------------------------------------------------------

def test_a_scale_event_is_signalled_with_its_sequence_number():
    port, bus = FakePort("default"), FakeBus()

    async def scenario(service):
        port.tell("scale", ScaleEvent(seq=42, at=1.0, pool="default", previous=1, desired=3, reason="Pinned",
                                      rationale="default 1 -> 3: Pinned"))

    run(scenario, port, bus)
    assert bus.signals == [(OBJECT_PATH, INTERFACE, "ScaleEvent", ["default", 1, 3, "Pinned", 42])]


def test_after_a_tick_only_the_changed_properties_are_announced():
    port, bus = FakePort("default", "images"), FakeBus()

    async def scenario(service):
        port.tell("tick")
        await settle()
        quiet = list(bus.signals)
        port.document["pools"]["default"]["paused"] = True
        port.document["pools"]["default"]["workers"]["active"] = 4
        port.tell("tick")
        await settle()
        return quiet

    quiet = run(scenario, port, bus)
    assert quiet == []  # nothing changed, nothing said
    assert len(bus.signals) == 1
    path, interface, member, (name, changed, invalidated) = bus.signals[0]
    assert (path, interface, member, name, invalidated) == \
        (POOL_PATH, "org.freedesktop.DBus.Properties", "PropertiesChanged", POOL_INTERFACE, [])
    assert {key: variant.value for key, variant in changed.items()} == {"Paused": True, "ActiveWorkers": 4}


def test_a_reload_adds_and_removes_pool_objects_and_says_so():
    port, bus = FakePort("default"), FakeBus()

    async def scenario(service):
        port.document["pools"] = {"images": pool_entry("images", active=None)}
        port.tell("reload", (True, "reloaded /etc/flexiqd/flexiqd.yaml"))
        await settle()
        return sorted(bus.exported)

    exported = run(scenario, port, bus)
    assert exported == [OBJECT_PATH, "/org/flexiq/flexiqd1/pool/images"]
    assert (OBJECT_PATH, INTERFACE, "ConfigReloaded", [True, "reloaded /etc/flexiqd/flexiqd.yaml"]) in bus.signals
    manager_changes = [body for path, iface, member, body in bus.signals
                       if path == OBJECT_PATH and member == "PropertiesChanged"]
    assert len(manager_changes) == 1 and manager_changes[0][1]["Pools"].value == ["images"]


def test_restart_answers_the_requests_id():
    port = FakePort("default")

    async def scenario(service):
        return await reply_to(service, call(POOL_PATH, POOL_INTERFACE, "Restart"))

    reply = run(scenario, port, FakeBus())
    assert reply.signature == "t" and reply.body == [1_700_000_000_000_000]
