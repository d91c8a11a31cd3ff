"""The hosts of a fleet sharing one store: their heartbeats, who is dead, and the timing that
makes handing a dead host's jobs to another host safe.

Each flexiqd registers its host in the store and beats every ``interval`` seconds
(``Backend.heartbeat``), publishing what its pools want and use.  A host whose
last beat is older than ``DEAD_AFTER_BEATS`` intervals is *dead*: any live flexiqd
hands its running jobs back to the queue (``Backend.rescue_dead_hosts``) -- but
only jobs whose lease has expired too, so a host whose daemon alone stopped
(its workers still draining, and renewing) keeps its jobs.

Safety rests on the dead side fencing itself (``LeaseTiming``): a worker on a
store shared by hosts takes leases of ``2 x heartbeat``, renews them every
``heartbeat / 3``, and ends its process -- tasks and their descendants killed --
once a job's lease has gone ``heartbeat`` seconds without a confirmed claim or
renewal.  Another host takes a job only after its lease expired.  Leases and beats are in the
store's clock (``flexiqd.queue.store.clock``: the database server's), which every host reads
alike whatever its own wall clock says, so a job is never run by two hosts at once while
each host's reading of it is within ``heartbeat / 2`` (milliseconds) and the fence
completes within ``heartbeat / 2`` (a SIGKILL and an exit: milliseconds).

Pure: no clock reads, no I/O.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

# A host is dead once its last beat is older than this many of its own intervals.
DEAD_AFTER_BEATS = 2.0
DEFAULT_HEARTBEAT = 2.0


@dataclasses.dataclass(frozen=True)
class HostInfo:
    """One host as the store last heard of it.

    ``report``: what it published with its last beat (``pools``: per pool its
    ``wants``, the policy's uncapped desire, and ``uses``, the workers it runs).
    """

    name: str
    last_beat: float
    interval: float
    alive: bool
    report: Mapping[str, Any]
    registered_at: float


def is_alive(last_beat: float, interval: float, now: float) -> bool:
    """Whether a host that last beat at ``last_beat`` (every ``interval`` s) counts as alive at ``now``."""
    return now - last_beat <= DEAD_AFTER_BEATS * interval


def host_info(name: str, last_beat: float, interval: float, report: str | None,
              registered_at: float, now: float) -> HostInfo:
    """A HostInfo from a stored row (``report`` as stored: JSON text)."""
    return HostInfo(name=name, last_beat=last_beat, interval=interval,
                    alive=is_alive(last_beat, interval, now),
                    report=decode_report(report), registered_at=registered_at)


def decode_report(report: str | None) -> dict[str, Any]:
    """A report as stored (JSON text); {} for one that does not parse."""
    try:
        decoded = json.loads(report) if report else {}
    except ValueError:
        decoded = {}
    return decoded if isinstance(decoded, dict) else {}


def encode_report(report: Mapping[str, Any]) -> str:
    return json.dumps(report, sort_keys=True, separators=(",", ":"))


@dataclasses.dataclass(frozen=True)
class LeaseTiming:
    """How a worker on a store shared by hosts keeps its leases, derived from the heartbeat.

    ``lease``: each claim or renewal holds a job this long; ``renew_every``: how
    often the leases are renewed; ``fence_after``: a job whose lease has not been
    confirmed for this long makes the worker end itself (kill its tasks' processes
    and exit) -- before any other host may take the job.
    """

    lease: float
    renew_every: float
    fence_after: float


def shared_store_timing(heartbeat: float) -> LeaseTiming:
    """The lease timing for workers on a store shared by hosts (see the module docstring)."""
    return LeaseTiming(lease=DEAD_AFTER_BEATS * heartbeat, renew_every=heartbeat / 3,
                       fence_after=heartbeat)
