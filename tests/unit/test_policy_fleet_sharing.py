"""Fleet-wide caps shared between hosts without a coordinator (policy.sharing.share_fleet)."""

from __future__ import annotations

import random

import pytest

from flexiqd.policy.config import DependencyUse
from flexiqd.policy.sharing import FleetPool, share_fleet, water_fill

DB = (DependencyUse(dependency="db", per_worker=1.0),)


def pair(host, wants, claim, pool="default", uses=DB):
    return FleetPool(host=host, pool=pool, wants=wants, claim=claim, uses=uses)


def test_every_host_computes_the_same_intents_from_the_same_rows():
    rows = [pair("a", 10, 0), pair("b", 10, 0), pair("c", 2, 0)]
    intents = {h: share_fleet({"db": 12}, rows, h, {"default": 0})["default"].intent["db"] for h in "abc"}
    assert intents == {"a": 5, "b": 5, "c": 2}


def test_a_grant_never_exceeds_the_claim_made_before_the_read():
    rows = [pair("a", 10, 3), pair("b", 0, 0)]
    share = share_fleet({"db": 10}, rows, "a", {"default": 3})["default"]
    assert (share.intent["db"], share.grant["db"], share.workers) == (10, 3, 3)
    assert share.next_claim == 10


def test_a_grant_leaves_what_the_others_claimed():
    # b still runs 8 (its claim) although its fair share is now 5: a waits for it to shrink.
    rows = [pair("a", 10, 5), pair("b", 10, 8)]
    share = share_fleet({"db": 10}, rows, "a", {"default": 5})["default"]
    assert (share.intent["db"], share.grant["db"]) == (5, 2)


def test_a_pool_of_this_host_that_uses_no_global_dependency_has_no_grant():
    rows = [pair("a", 4, 4, pool="mail", uses=())]
    assert share_fleet({"db": 10}, rows, "a", {"mail": 4})["mail"].workers is None


def test_per_worker_use_and_weights_count():
    heavy = (DependencyUse(dependency="db", per_worker=2.0, weight=3.0),)
    rows = [pair("a", 10, 10, uses=heavy), pair("b", 10, 10)]
    a = share_fleet({"db": 8}, rows, "a", {"default": 10})["default"]
    b = share_fleet({"db": 8}, rows, "b", {"default": 10})["default"]
    assert (a.intent["db"], b.intent["db"]) == (3, 2)  # 6 + 2 units: weighted 3:1


@pytest.mark.parametrize("seed", range(20))
def test_grants_in_force_never_exceed_the_capacity_whatever_the_interleaving(seed):
    """Hosts write their claim, then read the rows, in any interleaving; wants change at random.
    Each host runs exactly its grant at once (the worst case): their sum stays within capacity."""
    rng = random.Random(seed)
    capacity, hosts = 12, ["a", "b", "c"]
    wants = {h: rng.randint(0, 15) for h in hosts}
    rows = {h: pair(h, wants[h], 0) for h in hosts}
    intent = {h: 0 for h in hosts}
    grant = {h: 0 for h in hosts}
    wrote = {h: False for h in hosts}
    for _ in range(400):
        h = rng.choice(hosts)
        if not wrote[h]:
            if rng.random() < 0.2:
                wants[h] = rng.randint(0, 15)
            rows[h] = pair(h, wants[h], max(intent[h], grant[h]))
            wrote[h] = True
        else:
            share = share_fleet({"db": capacity}, list(rows.values()), h, {"default": rows[h].claim})["default"]
            grant[h], intent[h] = share.workers, share.next_claim
            wrote[h] = False
        assert sum(grant.values()) <= capacity


def test_with_steady_wants_the_fleet_settles_on_the_fair_shares():
    capacity, wants = 12, {"a": 10, "b": 3, "c": 10}
    rows = {h: pair(h, wants[h], 0) for h in wants}
    intent = {h: 0 for h in wants}
    grant = {h: 0 for h in wants}
    for _ in range(5):
        for h in wants:
            rows[h] = pair(h, wants[h], max(intent[h], grant[h]))
            share = share_fleet({"db": capacity}, list(rows.values()), h, {"default": rows[h].claim})["default"]
            grant[h], intent[h] = share.workers, share.next_claim
    fair = water_fill(capacity, {h: float(w) for h, w in wants.items()}, {h: 1.0 for h in wants})
    assert grant == {h: int(v) for h, v in fair.items()} == {"a": 4, "b": 3, "c": 4}
