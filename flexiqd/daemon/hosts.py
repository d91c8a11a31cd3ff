"""This host in the fleet: its heartbeat in the store, and the rescue of dead hosts' jobs.

Every ``heartbeat`` seconds, on a thread of its own (a long tick must not make the
host look dead): record this host's beat with what its pools want and use (the
``fleet_report`` the controller published after its last tick), read every host's row (the fleet the caps are
shared with), and hand back the jobs of hosts that stopped beating
(``Backend.rescue_dead_hosts``: one daemon at a time does it).  See
flexiqd.queue.hosts for the timing and why it is safe.

Global caps (``dependencies.<d>.global``, ``max_workers: {count, global: true}``)
are shared here too (``policy.sharing.share_fleet``): each beat publishes per pool
what it wants and a *claim* (never below what it runs or was granted), then reads
every live host's row and grants this host its share within what the others
claimed (a dead host's claims still count while its workers hold jobs: its daemon
may be down with its workers running on).  The tick caps each pool at its grant; a pool with a global cap and no
grant yet (before the first beat) holds its count, and one whose beats have failed
for a heartbeat gets none (the others may soon take its share).

The daemon's own beat failing does not stop its workers: they guard their own
leases (flexiqd.worker.fence).  Stopping the daemon does not unregister the host:
its workers may still be draining, and its share of global caps is given back
when its beat expires, two heartbeats later.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Mapping

from ..errors import QueueError
from ..logs import MessageId, journal
from ..queue.store.backend import Backend
from ..policy.config import DependencyUse
from ..policy.sharing import FleetPool, share_fleet
from ..queue.hosts import HostInfo
from ..queue.owners import owner_parts

log = logging.getLogger(__name__)


class HostHeartbeat:
    """This host's beat and the rescue, every ``interval()`` seconds.  Thread-safe reads.

    ``report()`` is called on the beat's thread and must be cheap and thread-safe
    (it reads what the last tick saw): ``{"pools": {pool: {"wants": n, "current": n,
    "uses": {dependency: [per_worker, weight]}}}}``; ``capacities()`` the global caps
    (dependency or ``max_workers:<pool>`` -> capacity).
    """

    def __init__(self, backend: Backend, host: str, interval: Callable[[], float],
                 report: Callable[[], Mapping[str, Any]], *, clock: Callable[[], float] | None = None,
                 capacities: Callable[[], Mapping[str, float]] = dict,
                 on_beat: Callable[[float], None] | None = None) -> None:
        self.backend = backend
        self._on_beat = on_beat  # told each beat's time once it is committed (store_mark)
        self.host = host
        self._interval = interval
        self._report = report
        self._capacities = capacities
        self._intent: dict[str, int] = {}   # pool -> the share computed at the last beat
        self._grants: dict[str, dict[str, int]] = {}  # pool -> global cap -> workers, in force
        # Beats are written and judged in the store's time: a host whose wall clock is off or
        # steps neither looks dead to the others nor finds them dead.
        self._clock = clock or backend.clock
        self._started = self._clock()
        self._lock = threading.Lock()
        self._fleet: list[HostInfo] = []
        self._failing_since: float | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.rescued = 0  # jobs handed back from dead hosts since the start

    # -- reads (any thread) -------------------------------------------------------------------

    def fleet(self) -> list[HostInfo]:
        """Every host as the last beat read them (this one included)."""
        with self._lock:
            return list(self._fleet)

    def failing_for(self, now: float) -> float | None:
        """For how long the beats have been failing (None: the last one went through)."""
        with self._lock:
            return None if self._failing_since is None else now - self._failing_since

    def peers(self) -> dict[str, int]:
        """Per pool, how many other live hosts serve it (as of the last beat): their completions
        are in the store's counts too."""
        with self._lock:
            counts: dict[str, int] = {}
            for host in self._fleet:
                if host.alive and host.name != self.host:
                    for pool in (host.report.get("pools") or {}):
                        counts[str(pool)] = counts.get(str(pool), 0) + 1
            return counts

    def grants(self, now: float) -> dict[str, dict[str, int]] | None:
        """Per pool, the workers each global cap allows it now; None when the beats have been
        failing for a heartbeat (this host may already count as dead: no share is its own)."""
        with self._lock:
            if self._failing_since is not None and now - self._failing_since > self._interval():
                return None
            return {pool: dict(caps) for pool, caps in self._grants.items()}

    # -- one beat -----------------------------------------------------------------------------

    def beat(self) -> dict[str, int]:
        """Beat, read the fleet, rescue dead hosts' jobs; return what was rescued per host."""
        now = self._clock()
        report = self._published(self._report())
        try:
            self.backend.heartbeat(self.host, now=now, interval=self._interval(), report=report)
            if self._on_beat is not None:
                self._on_beat(now)
            fleet = self.backend.hosts(now=now)
            rescued = self.backend.rescue_dead_hosts(now=now, exclude=(self.host,))
            busy = self._busy_dead_hosts(fleet)
        except QueueError as exc:
            with self._lock:
                first = self._failing_since is None
                if first:
                    self._failing_since = now
            if first:
                log.warning("Cannot record this host's heartbeat (retried every beat): %s", exc)
            return {}
        with self._lock:
            if self._failing_since is not None:
                log.info("This host's heartbeat goes through again after %.1fs.", now - self._failing_since)
            self._failing_since = None
            self._fleet = fleet
            self._share(fleet, report, busy)
        for host, jobs in sorted(rescued.items()):
            self.rescued += jobs
            log.warning("Host %s stopped beating: handed its %d running jobs back to the queue.", host, jobs,
                        extra=journal(MessageId.EXPIRED_LEASES_RECOVERED, JOBS=jobs, HOST=host))
        return rescued

    def _published(self, report: Mapping[str, Any]) -> dict[str, Any]:
        """The report with each pool's claim: what it may run until the next beat; and the
        schema this host's code knows, once it is the only code it runs."""
        pools = {}
        for pool, entry in (report.get("pools") or {}).items():
            granted = min(self._grants.get(pool, {}).values(), default=0)
            claim = max(int(entry.get("current", 0)), self._intent.get(pool, 0), granted)
            pools[pool] = {**entry, "claim": claim}
        published = {**report, "pools": pools}
        if runs_only_own_code(report, self._started):
            published["schema"] = dict(self.backend.schema_versions)
        return published

    def _busy_dead_hosts(self, fleet: list[HostInfo]) -> set[str]:
        """Dead hosts whose workers still hold jobs (a daemon down, its workers running on):
        their claims still count, so nobody takes a share their workers may be using."""
        if not self._capacities() or all(host.alive for host in fleet):
            return set()
        dead = {host.name for host in fleet if not host.alive}
        return {parts[0] for parts in map(owner_parts, self.backend.lease_owners())
                if parts is not None and parts[0] in dead}

    def _share(self, fleet: list[HostInfo], report: Mapping[str, Any], busy: set[str]) -> None:
        """The grants and intents from the rows just read (the lock held)."""
        capacities = self._capacities()
        if not capacities:
            self._grants, self._intent = {}, {}
            return
        pairs = [pair for host in fleet if host.alive or host.name == self.host or host.name in busy
                 for pair in _pairs(host.name, host.report)]
        claimed = {pool: entry["claim"] for pool, entry in report["pools"].items()}
        shares = share_fleet(capacities, pairs, self.host, claimed)
        self._grants = {pool: share.grant for pool, share in shares.items() if share.grant}
        self._intent = {pool: share.next_claim for pool, share in shares.items() if share.intent}

    # -- the thread ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="flexiqd-heartbeat", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop beating (idempotent); returns once the beat under way, if any, has ended."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stopped.is_set():
            started = time.monotonic()
            try:
                self.beat()
            except Exception:  # a bug here must not silence the beat for good
                log.exception("The heartbeat failed.")
            self._stopped.wait(max(0.0, self._interval() - (time.monotonic() - started)))


def _pairs(host: str, report: Mapping[str, Any]) -> list[FleetPool]:
    """The (host, pool) pairs a host published; entries that do not parse are left out (a
    host of another version must not stop the others' sharing)."""
    pairs = []
    for pool, entry in (report.get("pools") or {}).items():
        try:
            uses = tuple(DependencyUse(dependency=str(name), per_worker=float(pw), weight=float(weight))
                         for name, (pw, weight) in (entry.get("uses") or {}).items())
            pairs.append(FleetPool(host=host, pool=str(pool), wants=int(entry.get("wants", 0)),
                                   claim=int(entry.get("claim", 0)), uses=uses))
        except (TypeError, ValueError, AttributeError):
            continue
    return pairs


def runs_only_own_code(report: Mapping[str, Any], started: float) -> bool:
    """Whether every worker of this host runs this daemon's code: none started before the
    daemon did (an upgrade leaves the older workers running until they end).  A report from
    before the first tick says nothing of the workers: no."""
    if "workers_since" not in report:
        return False
    since = report["workers_since"]
    return since is None or since >= started
