"""The Pool objects' typed properties, from the same pool document that Status publishes."""

from __future__ import annotations

import math

import pytest

from flexiqd.dbus.pools import (POOL_PROPERTIES, PoolInterface, changed_properties, pool_properties)

NOW = 1_700_000_000.0

CONFIG = ("store: sqlite:///x.db\npools:\n  default:\n    concurrency: 4\n    max_workers: 6\n"
          "  idle: {queues: [idle, later], min_workers: 0}\n")


def status(override=None, completion_rate: float = 4.0, start_cost=True) -> dict:
    """A Status document built by documents.status_document: pool default sized, pool idle not yet."""
    from flexiqd.config.load import parse_config
    from flexiqd.daemon.controller import PoolView
    from flexiqd.daemon.documents import status_document
    from flexiqd.policy import PoolMetrics
    from flexiqd.daemon.startcost import StartCost
    from flexiqd.policy import Decision, History
    from flexiqd.policy.types import CapValue
    from flexiqd.queue.types import Stats

    config = parse_config(CONFIG, "/etc/flexiqd/flexiqd.yaml")
    stats = Stats(queue="default", runnable=12, delayed=2, running=6, dead=0, oldest_runnable_age=2.0,
                  arrival_rate=3.0, completion_rate=completion_rate, failure_rate=0.0, duration_p50=0.1,
                  duration_p95=0.3, duration_p99=0.9, window=60.0, coming_due=5, coming_due_within=10.0)
    decision = Decision(pool="default", current=3, desired=4, raw_desired=9, capped=4, stabilized=4,
                        reason="CappedByDependency", message="capped by db", recommendations=(), winner="age",
                        caps=(CapValue("dependency:db", 4),), binding_cap=CapValue("dependency:db", 4),
                        smoothing=(), history=History())
    view = PoolView(pool="default", active=2, starting=1, draining=1, failed=0, max_workers=6,
                    decision=decision, stats=[stats], metrics=PoolMetrics.from_queues([stats]),
                    start_cost=StartCost(seconds=0.62, ready=None, samples=9) if start_cost else None,
                    line=decision.line())
    overrides = {"default": override} if override is not None else {}
    return status_document(config, "/etc/flexiqd/flexiqd.yaml", None, {"default": view}, overrides, NOW)


def test_a_sized_pool_has_every_property_with_its_type():
    from flexiqd.daemon.overrides import Override

    values = pool_properties(status(Override(pinned=4, until=NOW + 60, paused=True))["pools"]["default"])
    assert list(values) == list(POOL_PROPERTIES)
    python_types = {"s": str, "as": list, "u": int, "i": int, "d": float, "b": bool}
    for name, signature in POOL_PROPERTIES.items():
        assert type(values[name]) is python_types[signature], name
    assert values["Name"] == "default" and values["Queues"] == ["default"]
    assert (values["Concurrency"], values["MinWorkers"], values["MaxWorkers"]) == (4, 1, 6)
    assert (values["ActiveWorkers"], values["StartingWorkers"], values["DrainingWorkers"],
            values["FailedWorkers"], values["DesiredWorkers"]) == (2, 1, 1, 0, 4)
    assert (values["Runnable"], values["Delayed"], values["Running"]) == (12, 2, 6)
    assert values["OldestRunnableAge"] == 2.0 and values["TimeToDrain"] == 3.0
    assert values["Utilisation"] == 6 / (2 * 4) and values["BindingCap"] == "dependency:db"
    assert values["Paused"] is True and values["Pinned"] is True
    assert (values["PinnedWorkers"], values["PinnedUntil"]) == (4, NOW + 60)
    assert (values["StartCost"], values["StartCostSamples"]) == (0.62, 9)
    assert math.isnan(values["StartCostReady"])  # the process fleet reports no readiness
    assert values["Reason"] == "CappedByDependency" and values["Rationale"].startswith("default 3 -> 4:")


def test_unknown_values_are_minus_one_nan_and_empty_never_zero():
    values = pool_properties(status(start_cost=False)["pools"]["idle"])  # configured, not sized yet
    assert values["Queues"] == ["idle", "later"] and values["MinWorkers"] == 0
    for name in ("ActiveWorkers", "StartingWorkers", "DrainingWorkers", "FailedWorkers", "DesiredWorkers",
                 "Runnable", "Delayed", "Running", "PinnedWorkers"):
        assert values[name] == -1, name
    for name in ("OldestRunnableAge", "TimeToDrain", "ArrivalRate", "CompletionRate", "Utilisation",
                 "PinnedUntil", "StartCost", "StartCostReady"):
        assert math.isnan(values[name]), name
    assert (values["BindingCap"], values["Reason"], values["Rationale"]) == ("", "", "")
    assert values["StartCostSamples"] == 0 and values["Paused"] is False and values["Pinned"] is False


def test_infinity_means_never_drains_and_pinned_until_unpinned():
    from flexiqd.daemon.overrides import Override

    values = pool_properties(status(Override(pinned=0, until=None), completion_rate=0.0)["pools"]["default"])
    assert values["TimeToDrain"] == math.inf  # jobs wait and nothing completes
    assert values["Pinned"] is True and values["PinnedWorkers"] == 0 and values["PinnedUntil"] == math.inf


def test_only_changed_values_are_announced_and_an_unknown_that_stays_unknown_is_no_change():
    before = {"ActiveWorkers": 2, "StartCost": math.nan, "Paused": False, "Reason": "ScaleUpAge"}
    after = {"ActiveWorkers": 3, "StartCost": math.nan, "Paused": False, "Reason": "ScaleUpAge"}
    assert changed_properties(before, after) == {"ActiveWorkers": 3}
    assert changed_properties(before, dict(before)) == {}
    measured = changed_properties(before, {**before, "StartCost": 0.5})
    assert measured == {"StartCost": 0.5}
    assert changed_properties({}, {"Paused": True}) == {"Paused": True}


@pytest.mark.parametrize("pool", ["default", "idle"])
def test_the_interface_offers_exactly_the_table_of_properties(pool):
    interface = PoolInterface(pool_properties(status()["pools"][pool]))
    introspected = {p.name: p.signature for p in interface.introspect().properties}
    assert introspected == POOL_PROPERTIES
    assert {name: variant.signature for name, variant in interface.variants().items()} == POOL_PROPERTIES
