"""Listing the hosts registered in a store, and forgetting one that is gone for good
(``flexiq hosts``, ``flexiq forget-host``).

A host stays registered after its daemon stops (its workers may still be draining);
one whose machine was retired stays listed as dead, and its share of the fleet's
global caps and its jobs wait on it, until it is forgotten.  Forgetting hands back
its workers' running jobs whose leases have expired -- released, with no attempt
used, as a live daemon's rescue of a dead host does -- and removes its row.  A job
whose lease has not expired yet stays with its worker: a daemon's recovery hands it
back when the lease expires (counted then as a lost attempt, since no registered host
vouches for the worker any more).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from ..errors import FlexiqdError
from .store.backend import Backend
from .hosts import DEAD_AFTER_BEATS, HostInfo
from .owners import owner_parts


class ForgetRefused(FlexiqdError):
    """A host that was not forgotten."""


@dataclasses.dataclass(frozen=True)
class HostRow:
    """One registered host as ``flexiq hosts`` shows it: its registration and the jobs its
    workers hold now."""

    info: HostInfo
    running: int


@dataclasses.dataclass(frozen=True)
class Forgotten:
    name: str
    handed_back: int   # running jobs released to the queue at once
    still_leased: int  # running jobs whose leases had not expired: recovered when they do


def running_by_host(lease_owners: Mapping[str, int]) -> dict[str, int]:
    """Running jobs per host, from the jobs per lease owner (``<host>:<instance>:<pid>``)."""
    counts: dict[str, int] = {}
    for owner, jobs in lease_owners.items():
        parts = owner_parts(owner)
        if parts is not None:
            counts[parts[0]] = counts.get(parts[0], 0) + jobs
    return counts


def forget_refusal(name: str, host: HostInfo | None, known: Sequence[str], *, force: bool,
                   now: float) -> str | None:
    """Why ``name`` is not to be forgotten (None: it may be).  Pure."""
    if host is None:
        listed = ", ".join(known) if known else "none"
        return f"no host named {name!r} is registered in this store (registered: {listed})"
    if host.alive and not force:
        return (f"host {name} is alive: it beat {now - host.last_beat:.0f}s ago (a host is dead "
                f"{DEAD_AFTER_BEATS * host.interval:g}s after its last beat). Stop its daemon first, or give "
                f"--force (a daemon that still runs registers again at its next beat)")
    return None


def list_hosts(backend: Backend, *, now: float) -> list[HostRow]:
    running = running_by_host(backend.lease_owners())
    return [HostRow(info=host, running=running.get(host.name, 0)) for host in backend.hosts(now=now)]


def forget_host(backend: Backend, name: str, *, force: bool, now: float) -> Forgotten:
    """Forget ``name`` (see the module docstring); ``ForgetRefused`` when it is alive without
    ``force`` or not registered."""
    hosts = {host.name: host for host in backend.hosts(now=now)}
    refusal = forget_refusal(name, hosts.get(name), sorted(hosts), force=force, now=now)
    if refusal:
        raise ForgetRefused(refusal)
    handed_back = backend.retire_host(name, now=now)
    if handed_back is None:  # forgotten by someone else meanwhile
        raise ForgetRefused(f"host {name} is no longer registered in this store")
    still = running_by_host(backend.lease_owners()).get(name, 0)
    return Forgotten(name=name, handed_back=handed_back, still_leased=still)
