"""Each pool as a D-Bus object, as systemd exposes each unit: ``/org/flexiq/flexiqd1/pool/<name>``.

Interface ``org.flexiq.flexiqd1.Pool``: typed, read-only properties that any
D-Bus client can read (``busctl get-property``) and follow
(``PropertiesChanged``, emitted after a tick for the properties that changed),
plus the pool's mutating methods.  The objects are listed by the manager object's
``org.freedesktop.DBus.ObjectManager`` (``InterfacesAdded``/``InterfacesRemoved``
when a reload adds or removes pools).

The properties are taken from the pool's entry of the Status document
(documents.pool_document): one source for every surface.  D-Bus has no null,
so a value not known is -1 for a count, NaN for a number (seconds, a rate, a
fraction) and "" for a string -- never 0, which would read as "no load".
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from dbus_fast import DBusError, Variant
from dbus_fast.service import PropertyAccess, ServiceInterface, dbus_property, method

from ..busnames import ERROR_ACCESS_DENIED, POOL_INTERFACE, pool_path

UNKNOWN_COUNT = -1
UNKNOWN = math.nan

# Mutating members of a pool object and their input signatures: the credentials check covers exactly these.
POOL_MUTATING = {"Scale": "ud", "Unpin": "", "Pause": "", "Resume": "", "Drain": "", "ClearCeiling": "",
                 "Restart": ""}

# Every property and its D-Bus type, in the order docs/dbus-api.md lists them.
POOL_PROPERTIES = {
    "Name": "s", "Queues": "as", "Concurrency": "u", "MinWorkers": "u", "MaxWorkers": "u",
    "ActiveWorkers": "i", "StartingWorkers": "i", "DrainingWorkers": "i", "FailedWorkers": "i",
    "DesiredWorkers": "i", "Runnable": "i", "Delayed": "i", "Running": "i",
    "OldestRunnableAge": "d", "TimeToDrain": "d", "ArrivalRate": "d", "CompletionRate": "d",
    "Utilisation": "d", "BindingCap": "s", "Paused": "b", "Pinned": "b", "PinnedWorkers": "i",
    "PinnedUntil": "d", "StartCost": "d", "StartCostReady": "d", "StartCostSamples": "u",
    "Reason": "s", "Rationale": "s",
}


# -- pure part: a pool document -> typed values ----------------------------------------------------

def _number(value: float | None) -> float:
    return UNKNOWN if value is None else float(value)


def pool_properties(pool: Mapping[str, Any]) -> dict[str, Any]:
    """The Pool interface's property values from one pool's entry of the Status document."""
    workers = pool["workers"] or {}
    metrics = pool["metrics"]
    pinned = pool["pinned"]
    cost = pool["start_cost"] or {}
    decision = pool["decision"] or {}
    if metrics is None:
        time_to_drain = UNKNOWN
    elif metrics["time_to_drain"] is None:
        time_to_drain = math.inf  # jobs wait and nothing completes: they never drain at this rate
    else:
        time_to_drain = float(metrics["time_to_drain"])
    return {
        "Name": pool["name"],
        "Queues": list(pool["queues"]),
        "Concurrency": pool["concurrency"],
        "MinWorkers": pool["min_workers"],
        "MaxWorkers": pool["max_workers"],
        "ActiveWorkers": workers.get("active", UNKNOWN_COUNT),
        "StartingWorkers": workers.get("starting", UNKNOWN_COUNT),
        "DrainingWorkers": workers.get("draining", UNKNOWN_COUNT),
        "FailedWorkers": workers.get("failed", UNKNOWN_COUNT),
        "DesiredWorkers": UNKNOWN_COUNT if pool["desired"] is None else pool["desired"],
        "Runnable": UNKNOWN_COUNT if metrics is None else metrics["runnable"],
        "Delayed": UNKNOWN_COUNT if metrics is None else metrics["delayed"],
        "Running": UNKNOWN_COUNT if metrics is None else metrics["running"],
        "OldestRunnableAge": UNKNOWN if metrics is None else _number(metrics["oldest_runnable_age"]),
        "TimeToDrain": time_to_drain,
        "ArrivalRate": UNKNOWN if metrics is None else _number(metrics["arrival_rate"]),
        "CompletionRate": UNKNOWN if metrics is None else _number(metrics["completion_rate"]),
        "Utilisation": _number(pool["utilisation"]),
        "BindingCap": pool["binding_cap"] or "",
        "Paused": bool(pool["paused"]),
        "Pinned": pinned is not None,
        "PinnedWorkers": UNKNOWN_COUNT if pinned is None else pinned["workers"],
        # inf: pinned until unpinned; NaN: not pinned.
        "PinnedUntil": UNKNOWN if pinned is None else (math.inf if pinned["until"] is None
                                                       else float(pinned["until"])),
        "StartCost": _number(cost.get("seconds")),
        "StartCostReady": _number(cost.get("ready")),
        "StartCostSamples": cost.get("samples", 0),
        "Reason": decision.get("reason") or "",
        "Rationale": decision.get("rationale") or "",
    }


def _same(a: Any, b: Any) -> bool:
    # NaN is not equal to itself: an unknown value that stays unknown has not changed.
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def changed_properties(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The properties of ``after`` whose value differs from ``before`` (what PropertiesChanged carries)."""
    return {name: value for name, value in after.items() if name not in before or not _same(before[name], value)}


# -- the interface ------------------------------------------------------------------------------------

def _unchecked() -> DBusError:
    # Fail closed: a mutating call that skipped the credentials check is refused.
    return DBusError(ERROR_ACCESS_DENIED, "refused: the caller's credentials were not checked")


class PoolInterface(ServiceInterface):
    """``org.flexiq.flexiqd1.Pool`` of one pool; its values are replaced after each tick.  Not thread-safe."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        super().__init__(POOL_INTERFACE)
        self.values = dict(values)

    def variants(self) -> dict[str, Variant]:
        """Every property as a Variant (the body of InterfacesAdded)."""
        return {name: Variant(signature, self.values[name]) for name, signature in POOL_PROPERTIES.items()}

    # read-only properties --------------------------------------------------------------------------

    @dbus_property(access=PropertyAccess.READ, name="Name")
    def name_(self) -> "s":
        return self.values["Name"]

    @dbus_property(access=PropertyAccess.READ, name="Queues")
    def queues(self) -> "as":
        return self.values["Queues"]

    @dbus_property(access=PropertyAccess.READ, name="Concurrency")
    def concurrency(self) -> "u":
        return self.values["Concurrency"]

    @dbus_property(access=PropertyAccess.READ, name="MinWorkers")
    def min_workers(self) -> "u":
        return self.values["MinWorkers"]

    @dbus_property(access=PropertyAccess.READ, name="MaxWorkers")
    def max_workers(self) -> "u":
        return self.values["MaxWorkers"]

    @dbus_property(access=PropertyAccess.READ, name="ActiveWorkers")
    def active_workers(self) -> "i":
        return self.values["ActiveWorkers"]

    @dbus_property(access=PropertyAccess.READ, name="StartingWorkers")
    def starting_workers(self) -> "i":
        return self.values["StartingWorkers"]

    @dbus_property(access=PropertyAccess.READ, name="DrainingWorkers")
    def draining_workers(self) -> "i":
        return self.values["DrainingWorkers"]

    @dbus_property(access=PropertyAccess.READ, name="FailedWorkers")
    def failed_workers(self) -> "i":
        return self.values["FailedWorkers"]

    @dbus_property(access=PropertyAccess.READ, name="DesiredWorkers")
    def desired_workers(self) -> "i":
        return self.values["DesiredWorkers"]

    @dbus_property(access=PropertyAccess.READ, name="Runnable")
    def runnable(self) -> "i":
        return self.values["Runnable"]

    @dbus_property(access=PropertyAccess.READ, name="Delayed")
    def delayed(self) -> "i":
        return self.values["Delayed"]

    @dbus_property(access=PropertyAccess.READ, name="Running")
    def running(self) -> "i":
        return self.values["Running"]

    @dbus_property(access=PropertyAccess.READ, name="OldestRunnableAge")
    def oldest_runnable_age(self) -> "d":
        return self.values["OldestRunnableAge"]

    @dbus_property(access=PropertyAccess.READ, name="TimeToDrain")
    def time_to_drain(self) -> "d":
        return self.values["TimeToDrain"]

    @dbus_property(access=PropertyAccess.READ, name="ArrivalRate")
    def arrival_rate(self) -> "d":
        return self.values["ArrivalRate"]

    @dbus_property(access=PropertyAccess.READ, name="CompletionRate")
    def completion_rate(self) -> "d":
        return self.values["CompletionRate"]

    @dbus_property(access=PropertyAccess.READ, name="Utilisation")
    def utilisation(self) -> "d":
        return self.values["Utilisation"]

    @dbus_property(access=PropertyAccess.READ, name="BindingCap")
    def binding_cap(self) -> "s":
        return self.values["BindingCap"]

    @dbus_property(access=PropertyAccess.READ, name="Paused")
    def paused(self) -> "b":
        return self.values["Paused"]

    @dbus_property(access=PropertyAccess.READ, name="Pinned")
    def pinned(self) -> "b":
        return self.values["Pinned"]

    @dbus_property(access=PropertyAccess.READ, name="PinnedWorkers")
    def pinned_workers(self) -> "i":
        return self.values["PinnedWorkers"]

    @dbus_property(access=PropertyAccess.READ, name="PinnedUntil")
    def pinned_until(self) -> "d":
        return self.values["PinnedUntil"]

    @dbus_property(access=PropertyAccess.READ, name="StartCost")
    def start_cost(self) -> "d":
        return self.values["StartCost"]

    @dbus_property(access=PropertyAccess.READ, name="StartCostReady")
    def start_cost_ready(self) -> "d":
        return self.values["StartCostReady"]

    @dbus_property(access=PropertyAccess.READ, name="StartCostSamples")
    def start_cost_samples(self) -> "u":
        return self.values["StartCostSamples"]

    @dbus_property(access=PropertyAccess.READ, name="Reason")
    def reason(self) -> "s":
        return self.values["Reason"]

    @dbus_property(access=PropertyAccess.READ, name="Rationale")
    def rationale(self) -> "s":
        return self.values["Rationale"]

    # mutating: taken by ApiService._intercept after the credentials check; never reached -------------

    @method(name="Scale")
    def scale(self, n: "u", for_seconds: "d"):
        raise _unchecked()

    @method(name="Unpin")
    def unpin(self):
        raise _unchecked()

    @method(name="Pause")
    def pause(self):
        raise _unchecked()

    @method(name="Resume")
    def resume(self):
        raise _unchecked()

    @method(name="Drain")
    def drain(self):
        raise _unchecked()

    @method(name="ClearCeiling")
    def clear_ceiling(self):
        raise _unchecked()

    @method(name="Restart")
    def restart(self) -> "t":
        raise _unchecked()


class PoolObjects:
    """The exported pool objects, kept equal to the pools of the last Status document.  Not thread-safe."""

    def __init__(self, bus: Any) -> None:
        self._bus = bus
        self._exported: dict[str, PoolInterface] = {}

    def __contains__(self, pool: str) -> bool:
        return pool in self._exported

    def names(self) -> list[str]:
        return sorted(self._exported)

    def update(self, status: Mapping[str, Any]) -> None:
        """Export new pools, unexport removed ones, and emit PropertiesChanged for what changed."""
        pools = status["pools"]
        for name in sorted(set(self._exported) - set(pools)):
            self._bus.unexport(pool_path(name), self._exported.pop(name))
        for name, pool in pools.items():
            values = pool_properties(pool)
            exported = self._exported.get(name)
            if exported is None:
                self._exported[name] = PoolInterface(values)
                self._bus.export(pool_path(name), self._exported[name])
                continue
            changed = changed_properties(exported.values, values)
            exported.values = values
            if changed:
                exported.emit_properties_changed(changed)

    def clear(self) -> None:
        for name in self.names():
            self._bus.unexport(pool_path(name), self._exported.pop(name))
