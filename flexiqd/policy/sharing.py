"""Sharing declared dependencies between pools: each pool's maximum useful worker count.

A dependency's available capacity (capacity - reserved) is shared max-min
fairly by weight (water-filling): every pool gets up to its weighted share; a
pool that needs less than its share leaves the rest to the others, which split
it again by weight.  A pool's cap is the allocation divided by what one of its
workers uses, rounded down; the smallest over its dependencies binds.  The
allocations never add up to more than the capacity, so pools that keep to
their caps never overload the dependency together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from .config import Dependency, DependencyUse

_EPSILON = 1e-9


@dataclass(frozen=True, kw_only=True)
class PoolDemand:
    """What a pool would like: ``workers``, and the dependencies one worker uses."""

    pool: str
    workers: int
    uses: tuple[DependencyUse, ...]


@dataclass(frozen=True, kw_only=True)
class DependencyCap:
    """One pool's ceiling from its dependencies.

    ``workers`` is the smallest cap over its dependencies (None: it declares
    none); ``dependency`` names the one that binds; ``per_dependency`` lists
    every ``(name, cap)``.  ``stopping``: ``(cap, workers)`` for each ceiling that
    stopping workers (asked to stop, their processes not yet exited) hold lower
    than it will be once they are gone: they still hold what one worker uses
    (see ``policy.fleet``).
    """

    pool: str
    workers: int | None
    dependency: str | None
    per_dependency: tuple[tuple[str, int], ...] = ()
    stopping: tuple[tuple[str, int], ...] = ()


def water_fill(capacity: float, demands: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, float]:
    """Weighted max-min fair allocation of ``capacity`` to ``demands`` (same unit).

    Pools asking for less than their weighted share get all they ask; the rest
    is shared again by weight among the others.  Pure; O(n^2) in the number of
    pools, which is small.
    """
    allocation = {pool: 0.0 for pool in demands}
    wanting = {pool for pool, demand in demands.items() if demand > 0}
    remaining = capacity
    while wanting and remaining > _EPSILON:
        level = remaining / sum(weights[pool] for pool in wanting)
        satisfied = {pool for pool in wanting if demands[pool] <= level * weights[pool] + _EPSILON}
        if not satisfied:
            for pool in wanting:
                allocation[pool] = level * weights[pool]
            break
        for pool in satisfied:
            allocation[pool] = demands[pool]
            remaining -= demands[pool]
        wanting -= satisfied
    return allocation


def share_dependencies(
    dependencies: Iterable[Dependency], demands: Sequence[PoolDemand], held: Sequence[PoolDemand] = ()
) -> dict[str, DependencyCap]:
    """Each pool's maximum useful worker count, keyed by pool name.

    ``demands`` should hold every pool that uses any of the ``dependencies``
    (a pool left out is assumed to use none).  ``held`` pools (whose metrics
    could not be read, so they keep their workers) use what their workers use
    first; the others share what is left.  Raises ``ValueError`` when a pool
    uses a dependency that is not declared.
    """
    declared = {dependency.name: dependency for dependency in dependencies}
    for demand in (*demands, *held):
        for use in demand.uses:
            if use.dependency not in declared:
                raise ValueError(f"pool {demand.pool} uses dependency {use.dependency!r}, which is not declared")
    per_pool: dict[str, dict[str, int]] = {demand.pool: {} for demand in demands}
    for name, dependency in declared.items():
        taken = sum(pool.workers * use.per_worker for pool in held for use in pool.uses if use.dependency == name)
        users = [(demand, use) for demand in demands for use in demand.uses if use.dependency == name]
        wanted = {demand.pool: demand.workers * use.per_worker for demand, use in users}
        weights = {demand.pool: use.weight for demand, use in users}
        allocation = water_fill(max(0.0, dependency.available - taken), wanted, weights)
        for demand, use in users:
            per_pool[demand.pool][name] = math.floor(allocation[demand.pool] / use.per_worker + _EPSILON)
    return {pool: _cap(pool, caps) for pool, caps in per_pool.items()}


def _cap(pool: str, caps: dict[str, int]) -> DependencyCap:
    if not caps:
        return DependencyCap(pool=pool, workers=None, dependency=None)
    binding = min(caps, key=lambda name: (caps[name], name))
    return DependencyCap(
        pool=pool, workers=caps[binding], dependency=binding, per_dependency=tuple(sorted(caps.items()))
    )


# -- fleet-wide caps: participants are (host, pool) pairs --------------------------------------
#
# A dependency marked global (or a pool's global max_workers) is shared between the live
# hosts without a coordinator.  Every host publishes per pool, with its heartbeat, what it
# *wants* (the demand above) and what it *claims*: never less than what it runs or may run
# until its next beat.  From the same rows every host computes the same fair shares of
# the wants (water-filling over the (host, pool) pairs) -- its *intent*, published as its
# next claim -- and *grants* itself only what it claimed before reading the rows and what
# the others' claims leave free.  Each host writes its claim before it reads the others',
# so of any two hosts at least one sees the other's claim: the grants in force never add up
# to more than the capacity.  Growing to a new share takes two beats; a host that stopped
# beating gives its claim back once its beat expires.

#: The name under which a pool's global max_workers is shared, as a dependency of its own.
FLEET_MAX = "max_workers@fleet"


@dataclass(frozen=True, kw_only=True)
class FleetPool:
    """One (host, pool) pair as its host last published it.

    ``wants`` and ``claim`` are worker counts; ``uses`` how much of each global
    dependency one of its workers uses.
    """

    host: str
    pool: str
    wants: int
    claim: int
    uses: tuple[DependencyUse, ...]


@dataclass(frozen=True, kw_only=True)
class FleetShare:
    """This host's outcome for one pool: ``intent`` to publish as its next claim, and ``grant``
    per global dependency (the workers it may run until the next beat)."""

    pool: str
    intent: dict[str, int]
    grant: dict[str, int]

    @property
    def next_claim(self) -> int:
        return min(self.intent.values(), default=0)

    @property
    def workers(self) -> int | None:
        return min(self.grant.values()) if self.grant else None


def share_fleet(capacities: Mapping[str, float], pairs: Sequence[FleetPool], host: str,
                claimed: Mapping[str, int]) -> dict[str, FleetShare]:
    """This ``host``'s share of each global dependency in ``capacities``, per pool of its own.

    ``pairs``: every live host's published pools (this host's included, as read);
    ``claimed``: what this host published as its claims in the beat just before
    the read (a grant never exceeds it).  Pure and deterministic: hosts with the
    same rows compute the same intents.
    """
    intents: dict[str, dict[str, int]] = {pair.pool: {} for pair in pairs if pair.host == host}
    grants: dict[str, dict[str, int]] = {pool: {} for pool in intents}
    for name, capacity in sorted(capacities.items()):
        users = [(pair, use) for pair in pairs for use in pair.uses if use.dependency == name]
        if not users:
            continue
        wanted = {(pair.host, pair.pool): pair.wants * use.per_worker for pair, use in users}
        weights = {(pair.host, pair.pool): use.weight for pair, use in users}
        fair = water_fill(capacity, wanted, weights)
        for pair, use in users:
            if pair.host != host:
                continue
            others = sum(other.claim * other_use.per_worker for other, other_use in users
                         if (other.host, other.pool) != (pair.host, pair.pool))
            intent = math.floor(fair[(pair.host, pair.pool)] / use.per_worker + _EPSILON)
            free = math.floor(max(0.0, capacity - others) / use.per_worker + _EPSILON)
            intents[pair.pool][name] = intent
            grants[pair.pool][name] = max(0, min(intent, claimed.get(pair.pool, 0), free))
    return {pool: FleetShare(pool=pool, intent=intents[pool], grant=grants[pool]) for pool in intents}


def with_fleet_grants(cap: DependencyCap | None, pool: str, grants: Mapping[str, int]) -> DependencyCap | None:
    """A pool's dependency cap with the global dependencies' entries replaced by the fleet's grants."""
    caps = dict(cap.per_dependency) if cap is not None else {}
    caps.update(grants)
    return _cap(pool, caps) if caps else cap
