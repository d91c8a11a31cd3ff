"""Recovery and upkeep: what the store and the fleet need after workers die and as time passes.

``Recovery`` releases at once the jobs of this host's workers whose process is
gone (``release_dead_workers``), forgets failed workers so their numbers are
free again (``forget_failed``), drains the workers of pools no longer
configured (``stop_unconfigured``), and once a minute puts jobs with expired
leases back and removes finished jobs past their retention (``maintain``).

The observer (``observe.Observer``) runs each of them in every tick, before it reads the
queues, and the controller runs ``release_dead_workers`` on its own when systemd reports a
unit change.
Not thread-safe: the controller's loop drives it.
"""

from __future__ import annotations

import logging
from typing import Callable

from ..config.model import DaemonConfig
from ..errors import FleetError, QueueError
from ..fleet.base import Fleet, WorkerInfo, WorkerState, parse_instance
from ..logs import MessageId, journal
from ..queue.store.backend import Backend
from ..queue.owners import owner_parts
from ..queue.types import JobState

# The control loop's logger, not this module's: these lines were always the controller's, and
# its name starts every line's text in the journal (logs.LINE_FORMAT) and is its LOGGER= field.
log = logging.getLogger("flexiqd.daemon.controller")

MAINTENANCE_INTERVAL = 60.0  # seconds between lease recovery and retention sweeps


class Recovery:
    """Dead workers' jobs released, failed and unconfigured workers cleared, the store swept.

    ``doing(what)`` is told what it is about to wait for (the controller's ``activity``,
    which the daemon reports when a tick blocks).
    """

    def __init__(self, config: DaemonConfig, backend: Backend, fleet: Fleet, *, host: str,
                 pid_alive: Callable[[int], bool], doing: Callable[[str], None]) -> None:
        self.config = config
        self.backend = backend
        self.fleet = fleet
        self.host = host
        self.pid_alive = pid_alive
        self._doing = doing
        self._maintained_at: float | None = None

    def reconfigure(self, config: DaemonConfig) -> None:
        """Use the reloaded config (retention, pools) from the next call."""
        self.config = config

    def release_dead_workers(self, now: float,
                             live_pids: set[int] | frozenset[int] = frozenset()) -> dict[str, int] | None:
        """Release at once the leases of this host's workers whose process is gone.

        Covers a worker unit that failed, one that systemd restarted on its own
        (new pid, same name), and a SIGKILLed child process: no job waits for its
        lease to expire.  Needs no fleet listing (``live_pids`` only saves pid
        checks), so the daemon runs it the moment systemd reports a unit change.
        Returns running jobs per live instance (for choosing idle workers to stop), None
        when the lease owners cannot be read (nothing is known to be idle then).
        """
        self._doing("reading the lease owners")
        try:
            owners = self.backend.lease_owners()
        except QueueError as exc:
            log.warning("Cannot read lease owners: %s", exc)
            return None
        busy: dict[str, int] = {}
        for owner, running in owners.items():
            parts = owner_parts(owner)
            if parts is None or parts[0] != self.host or parse_instance(parts[1]) is None:
                continue  # another host's worker, or one flexiqd does not manage
            _, instance, pid = parts
            if pid in live_pids or self.pid_alive(pid):
                busy[instance] = busy.get(instance, 0) + running
                continue
            self._doing(f"releasing the jobs of dead worker {instance}")
            how = self.fleet.how_it_ended(instance, pid)
            reason = f"worker {instance} died" + (f": {how}" if how else "")
            try:
                recovered = self.backend.recover_owner(owner, now=now, reason=reason)
            except QueueError as exc:
                log.warning("Could not release the jobs of dead worker %s: %s", instance, exc)
                continue
            log.warning("Worker %s (pid %d) is gone%s: released its %d jobs to run again.", instance, pid,
                        f" ({how})" if how else "", recovered,
                        extra=self._released_fields(instance, pid, recovered))
        return busy

    def _released_fields(self, instance: str, pid: int, jobs: int) -> dict:
        # UNIT= only where workers are units: the process fleet's have the same names but no unit.
        unit = f"flexiq-worker@{instance}.service" if self.config.fleet == "systemd" else None
        return journal(MessageId.DEAD_WORKER_JOBS_RELEASED, POOL=parse_instance(instance)[0], WORKER=instance,
                       UNIT=unit, WORKER_PID=pid, JOBS=jobs)

    def maintain(self, now: float) -> None:
        """Once a minute: expired leases back to the queue, old finished jobs out of it."""
        if self._maintained_at is not None and now - self._maintained_at < MAINTENANCE_INTERVAL:
            return
        self._maintained_at = now
        self._doing("sweeping expired leases and old jobs")
        try:
            recovered = self.backend.recover_expired(now=now)
            purged = self.backend.purge(states=[JobState.DONE, JobState.CANCELLED],
                                        finished_before=now - self.config.retention, sweep=True)
            purged += self.backend.purge(states=[JobState.DEAD],
                                         finished_before=now - self.config.dead_retention, sweep=True)
        except QueueError as exc:
            log.warning("Queue maintenance failed (it is retried in a minute): %s", exc)
            return
        if recovered:
            log.warning("Made %d jobs with expired leases runnable again.", recovered,
                        extra=journal(MessageId.EXPIRED_LEASES_RECOVERED, JOBS=recovered))
        if purged:
            log.info("Removed %d finished jobs past their retention.", purged)

    def forget_failed(self, workers: list[WorkerInfo]) -> None:
        """Forget failed workers (their leases were released first): their numbers are free again."""
        for worker in workers:
            if worker.state is WorkerState.FAILED:
                log.warning("Worker %s failed; it will be replaced if the pool needs it.", worker.instance)
                self.fleet.forget(worker)

    def stop_unconfigured(self, by_pool: dict[str, list[WorkerInfo]]) -> None:
        """Drain the running workers of pools the config no longer has."""
        for name, workers in by_pool.items():
            if name in self.config.pools:
                continue
            running = [w for w in workers if w.state in (WorkerState.ACTIVE, WorkerState.STARTING)]
            if running:
                log.info("Pool %s is no longer configured: draining its %d workers.", name, len(running))
                try:
                    self.fleet.stop(running)
                except FleetError as exc:
                    log.error("Could not stop the workers of removed pool %s: %s", name, exc)
