"""Dependency limits: what a limit is, and the pure arithmetic of admitting a job under it.

A task declares the shared dependencies it uses (``@queue.task(uses=[...])``);
the operator limits each one (``dependencies.<name>.limit`` in the daemon's
config).  Before a worker starts such a job it asks the store to *admit* it
(``Backend.admit``); the store keeps the holds and the rate state and calls
the functions here to decide.  No I/O and no clock reads: time is an argument.

Concurrency: at most ``concurrency`` jobs hold the dependency at once.
Rate: the generic cell rate algorithm (GCRA) -- one number per dependency, the
theoretical arrival time ``tat``.  With the emission interval T = 1/rate and
the tolerance (burst - 1) * T, a start at ``now`` is granted when
max(tat, now) - now <= tolerance, and then tat = max(tat, now) + T.  So a
quiet dependency lets ``burst`` jobs start at once, then ``rate`` per second.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any, Mapping, Sequence

# A job refused a slot is looked at again after at least this long: below it, refusals
# cost more store transactions than they save waiting.
MIN_WAIT = 0.01
# Without a measured hold time, a refused job waits this long for a concurrency slot.
DEFAULT_SLOT_WAIT = 0.2
# A deferred job comes back after its wait plus up to this fraction of it (at least
# MIN_JITTER): jobs refused together do not all come back at the same instant.
JITTER_FRACTION = 0.5
MIN_JITTER = 0.02
LIMIT_KEYS = ("concurrency", "rate", "burst")


class LimitError(ValueError):
    """A limit that cannot hold: ``key`` names the bad field (``limit.rate``)."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}")
        self.key = key
        self.why = why


@dataclasses.dataclass(frozen=True)
class DependencyLimit:
    """The limit of one dependency, as the worker hands it to ``Backend.admit``.

    ``concurrency``: most jobs inside it at once (None: not limited).
    ``rate``: most job starts per second, on average (None: not limited);
    ``burst``: starts allowed at once after a quiet spell (default ceil(rate)).
    """

    name: str
    concurrency: int | None = None
    rate: float | None = None
    burst: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise LimitError("name", f"must be a non-empty name, got {self.name!r}")
        if self.concurrency is not None and (isinstance(self.concurrency, bool) or not isinstance(
                self.concurrency, int) or self.concurrency < 1):
            raise LimitError("limit.concurrency", f"must be a whole number of at least 1, got {self.concurrency!r}")
        if self.rate is not None and (isinstance(self.rate, bool) or not isinstance(self.rate, (int, float))
                                      or not 0 < self.rate < math.inf):
            raise LimitError("limit.rate", f"must be a number of starts per second above 0, got {self.rate!r}")
        if self.burst is not None:
            if self.rate is None:
                raise LimitError("limit.burst", "needs limit.rate: a burst is of the rate's starts")
            if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
                raise LimitError("limit.burst", f"must be a whole number of at least 1, got {self.burst!r}")
        if self.concurrency is None and self.rate is None:
            raise LimitError("limit", "must set concurrency, rate or both")

    @property
    def effective_burst(self) -> int:
        """The burst in force: the given one, else ceil(rate) (0 without a rate)."""
        if self.rate is None:
            return 0
        return self.burst if self.burst is not None else max(1, math.ceil(self.rate))

    def as_dict(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "rate": self.rate,
                "burst": self.effective_burst if self.rate is not None else None}


def limit_from_mapping(name: str, value: Any) -> DependencyLimit:
    """A limit from config (``{concurrency: 20, rate: 50, burst: 60}``); ``LimitError`` names the key."""
    if not isinstance(value, Mapping):
        raise LimitError("limit", f"must be a mapping such as {{concurrency: 20, rate: 50}}, got {value!r}")
    for key in value:
        if key not in LIMIT_KEYS:
            raise LimitError(f"limit.{key}", f"unknown key (known: {', '.join(LIMIT_KEYS)})")
    rate = value.get("rate")
    if isinstance(rate, int) and not isinstance(rate, bool):
        rate = float(rate)
    return DependencyLimit(name=name, concurrency=value.get("concurrency"), rate=rate,
                           burst=value.get("burst"))


def limits_for(uses: Sequence[str], limits: Mapping[str, DependencyLimit]) -> tuple[DependencyLimit, ...]:
    """The limits a job of a task using ``uses`` must be admitted under (unlimited ones left out)."""
    return tuple(limits[name] for name in dict.fromkeys(uses) if name in limits)


# -- rate: GCRA ----------------------------------------------------------------------------

def gcra(tat: float | None, now: float, rate: float, burst: int) -> tuple[float | None, float]:
    """One start under a rate: ``(new_tat, 0.0)`` when granted, ``(None, wait)`` when not.

    ``tat`` is the stored theoretical arrival time (None: never used).  ``wait``
    is the seconds until the same request would be granted.
    """
    interval = 1.0 / rate
    tolerance = (burst - 1) * interval
    base = max(tat if tat is not None else now, now)
    if base - now <= tolerance + 1e-9:  # a rounding hair must not refuse an exact fit
        return base + interval, 0.0
    return None, base - tolerance - now


# -- concurrency ---------------------------------------------------------------------------

def plan_admissions(requests: Sequence[tuple[int, Sequence[DependencyLimit]]], in_use: Mapping[str, int],
                    tats: Mapping[str, float | None], now: float, room: Mapping[str, int] | None = None,
                    ) -> tuple[dict[int, list[tuple[str, float | None]] | None], dict[str, float | None]]:
    """Which of a batch of jobs enter their dependencies, in order, each all or nothing.

    ``in_use``: live holds per dependency before the batch; ``tats``: each rate's stored
    theoretical arrival time; ``room``: the slots a concurrency limit may fill here, when
    less than its ``concurrency`` (an owner's share of it, flexiqd.queue.store.shares).
    Returns, per job id, None (admitted) or what refused it --
    ``(dependency, wait)`` with the rate's exact wait, or None for a full concurrency
    (the caller estimates that wait from the holds) -- and the rates' new tats.  Pure:
    a store reads the state once, plans the batch, and writes the outcome once.
    """
    using, rates = dict(in_use), dict(tats)
    plan: dict[int, list[tuple[str, float | None]] | None] = {}
    for job_id, limits in requests:
        refused: list[tuple[str, float | None]] = []
        started: dict[str, float] = {}
        for limit in limits:
            slots = limit.concurrency if room is None else room.get(limit.name, limit.concurrency)
            if slots is not None and using.get(limit.name, 0) >= slots:
                refused.append((limit.name, None))
            if limit.rate is not None:
                tat, wait = gcra(rates.get(limit.name), now, limit.rate, limit.effective_burst)
                if tat is None:
                    refused.append((limit.name, wait))
                else:
                    started[limit.name] = tat
        if refused:
            plan[job_id] = refused
            continue
        plan[job_id] = None
        for limit in limits:
            if limit.concurrency is not None:
                using[limit.name] = using.get(limit.name, 0) + 1
        rates.update(started)
    return plan, rates


def slot_wait(hold_ages: Sequence[float], typical_hold: float | None) -> float:
    """Seconds until a full dependency is likely to have a free slot.

    ``hold_ages``: how long each current hold has lasted; ``typical_hold``: the
    recent median hold time (None: not measured yet).  The soonest expected end
    of a hold; a hold already past the median is looked at again after a tenth
    of it, so an overlong job does not make others wait a whole median each time.
    """
    if typical_hold is None or typical_hold <= 0:
        return DEFAULT_SLOT_WAIT
    remaining = [typical_hold - age for age in hold_ages]
    soonest = min(remaining, default=0.0)
    if soonest <= 0:
        soonest = typical_hold / 10
    return max(MIN_WAIT, min(soonest, typical_hold))


def deferral_delay(wait: float, rng: random.Random) -> float:
    """The delay a refused job is deferred by: its wait plus jitter, so refused jobs spread out."""
    wait = max(MIN_WAIT, wait)
    return wait + rng.uniform(0.0, max(MIN_JITTER, wait * JITTER_FRACTION))


def nearest_rank(sorted_values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile of already sorted values (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


# -- tenant caps ---------------------------------------------------------------------------

# The name of the cap of every tenant without one of its own.
EVERY_TENANT = "*"
TENANT_CAP_KEYS = ("max_running",)


@dataclasses.dataclass(frozen=True)
class TenantCaps:
    """Most jobs of one tenant running at once, across every worker sharing the store.

    ``max_running`` maps a tenant to its cap; ``EVERY_TENANT`` ("*") is the cap
    of every tenant without its own entry.  Jobs without a tenant are never capped.
    """

    max_running: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for tenant, cap in self.max_running.items():
            if not isinstance(tenant, str) or not tenant:
                raise LimitError("tenants", f"a tenant's name must be a non-empty string, got {tenant!r}")
            if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
                raise LimitError(f"{tenant}.max_running", f"must be a whole number of at least 0, got {cap!r}")

    def cap_of(self, tenant: str | None) -> int | None:
        """The tenant's cap (None: not capped)."""
        if not tenant:
            return None
        cap = self.max_running.get(tenant)
        return cap if cap is not None else self.max_running.get(EVERY_TENANT)

    def __bool__(self) -> bool:
        return bool(self.max_running)

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {tenant: {"max_running": cap} for tenant, cap in sorted(self.max_running.items())}


def tenant_caps_from_mapping(value: Any) -> TenantCaps:
    """Caps from config (``{acme: {max_running: 10}, "*": {max_running: 50}}``); ``LimitError``
    names the bad key (``acme.max_running``)."""
    if not isinstance(value, Mapping):
        raise LimitError("tenants", f"must be a mapping such as {{acme: {{max_running: 10}}}}, got {value!r}")
    caps: dict[str, int] = {}
    for tenant, entry in value.items():
        if not isinstance(tenant, str) or not tenant:
            raise LimitError("tenants", f"a tenant's name must be a non-empty string, got {tenant!r}")
        if not isinstance(entry, Mapping):
            raise LimitError(tenant, f"must be a mapping such as {{max_running: 10}}, got {entry!r}")
        for key in entry:
            if key not in TENANT_CAP_KEYS:
                raise LimitError(f"{tenant}.{key}", f"unknown key (known: {', '.join(TENANT_CAP_KEYS)})")
        if "max_running" not in entry:
            raise LimitError(f"{tenant}.max_running", "is required")
        caps[tenant] = entry["max_running"]
    return TenantCaps(caps)


def within_caps(candidates: Sequence[tuple[int, str]], room: dict[str, int],
                caps: TenantCaps) -> tuple[list[int], set[str]]:
    """Which of ``candidates`` (job id, tenant; in claim order) a claim may take.

    ``room`` holds how many more jobs each capped tenant may start (it is spent
    here); a capped tenant missing from it may start none.  Returns the ids taken
    and the tenants found without room, whose jobs the next walk must skip.
    """
    taken: list[int] = []
    full: set[str] = set()
    for job_id, tenant in candidates:
        if caps.cap_of(tenant) is None:
            taken.append(job_id)
        elif room.get(tenant, 0) > 0:
            room[tenant] -= 1
            taken.append(job_id)
        else:
            full.add(tenant)
    return taken, full


def room_left(caps: TenantCaps, running: Mapping[str, int], tenants: Sequence[str]) -> dict[str, int]:
    """How many more jobs each capped tenant of ``tenants`` may start, given its running jobs."""
    room = {}
    for tenant in tenants:
        cap = caps.cap_of(tenant)
        if cap is not None:
            room[tenant] = max(0, cap - running.get(tenant, 0))
    return room
