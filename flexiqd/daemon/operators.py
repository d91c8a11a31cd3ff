"""Operators' intent: the pins, drains and pauses asked for with flexiqctl (over D-Bus).

``OperatorIntent`` takes the requests (``pin``, ``unpin``, ``drain``, ``pause``,
``resume``, ``clear_ceiling``), ends a pin whose time ran out, steers the policy's decision of a
pool by its override (``steer``) and makes ready workers follow a pause or a
resume (``hold_pause``).  Every change is kept in a file (``IntentFile``), so a
restart of the daemon does not forget a drain, a pin or a pause, and the paused
pools are published for workers (``paused.json``), so a worker that (re)starts
in a paused pool starts paused.

Not thread-safe: the controller's loop drives it, requests included.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Container, Mapping

from ..config.model import PoolConfig
from ..errors import ControlError, FleetError
from ..fleet.base import Fleet, WorkerInfo, WorkerState
from ..logs import MessageId, journal
from ..policy import Decision, History
from ..policy.history import entered_by_others
from ..runtime_files import write_paused_pools
from .intent import IntentFile
from .overrides import Override, apply_override

# The control loop's logger, not this module's: these lines were always the controller's, and
# its name starts every line's text in the journal (logs.LINE_FORMAT) and is its LOGGER= field.
log = logging.getLogger("flexiqd.daemon.controller")


class OperatorIntent:
    """The operators' overrides of the policy, pool by pool, kept and published."""

    def __init__(self, pools: Mapping[str, PoolConfig], fleet: Fleet, *, clock: Callable[[], float],
                 file: IntentFile | None = None, paused_path: str | None = None,
                 retiring: Container[WorkerInfo] = ()) -> None:
        self.pools = pools
        self.fleet = fleet
        #: Workers a scale-in paused until their jobs are done: an operator's resume leaves them paused.
        self.retiring = retiring
        self.clock = clock
        self.file = file or IntentFile(None)
        self.paused_path = paused_path
        self._resuming: dict[str, set[str]] = {}   # pool -> instances to tell "resume" once ready
        self._ceilings_to_clear: set[str] = set()  # pools whose measured ceiling is forgotten next tick
        loaded = self.file.load(clock())
        self.overrides: dict[str, Override] = {n: o for n, o in loaded.items() if n in pools}
        for name, override in sorted(self.overrides.items()):
            log.info("Pool %s: keeping the operator's %s from before the restart.", name, _describe(override))
        self._changed(save=self.overrides != loaded)

    def reconfigure(self, pools: Mapping[str, PoolConfig]) -> None:
        """Use the reloaded config's pools; a removed pool's override goes with it."""
        self.pools = pools
        kept = {name: o for name, o in self.overrides.items() if name in pools}
        if kept != self.overrides:
            self.overrides = kept
            self._changed()

    def _changed(self, save: bool = True) -> None:
        """Keep the overrides for the next daemon, and tell workers which pools are paused."""
        if save:
            self.file.save(self.overrides)
        if self.paused_path:
            paused = sorted(name for name, o in self.overrides.items() if o.paused)
            try:
                write_paused_pools(self.paused_path, paused)
            except OSError as exc:
                log.error("Cannot publish the paused pools at %s (a worker restarted in a paused pool "
                          "would claim until the next tick pauses it): %s", self.paused_path, exc.strerror)

    # -- in the tick ----------------------------------------------------------------------------

    def steer(self, decision: Decision, before: History | None, now: float) -> Decision | None:
        """The policy's ``decision`` under the pool's override, with the history that follows;
        None when no operator steers the pool (a pin that ran out ends here).

        The count an operator set enters the history as a change made by others
        (``entered_by_others``), not as the policy's own.
        """
        name = decision.pool
        override = self.overrides.get(name)
        if override is None:
            return None
        if override.expired(now):
            log.info("Pool %s: the operator's pin ended; the policy decides again.", name,
                     extra=journal(MessageId.OPERATOR_OVERRIDE, POOL=name, ACTION="pin-ended"))
            del self.overrides[name]
            self._changed()
            return None
        pool = self.pools[name]
        steered = apply_override(decision, override, pool, now)
        history = entered_by_others(decision, before, pool.policy, now, steered.desired)
        return dataclasses.replace(steered, history=history)

    def hold_pause(self, name: str, workers: list[WorkerInfo]) -> None:
        """Make every ready worker do what the pool's override says (idempotent, every tick).

        Catches a worker that became ready after a pause, or that systemd restarted;
        and after a resume, one that started paused because it read the file before.
        """
        override = self.overrides.get(name)
        try:
            if override is not None and override.paused:
                self.fleet.set_paused(workers, True)
                return
            waiting = self._resuming.get(name)
            if not waiting:
                return
            ready = [w for w in workers if w.instance in waiting and w.state is WorkerState.ACTIVE
                     and w not in self.retiring]
            self.fleet.set_paused(ready, False)
            waiting -= {w.instance for w in ready}
            waiting &= {w.instance for w in workers}
            if not waiting:
                del self._resuming[name]
        except FleetError as exc:
            log.warning("Pool %s: could not signal its workers (retried next tick): %s", name, exc)

    def drained(self, name: str) -> bool:
        """Whether an operator holds pool ``name`` at zero (``drain``, or a pin at 0)."""
        override = self.overrides.get(name)
        return override is not None and override.pinned == 0

    def paused(self, name: str) -> bool:
        """Whether an operator paused pool ``name``."""
        override = self.overrides.get(name)
        return override is not None and override.paused

    # -- requests (each takes effect at the next tick) ------------------------------------------------

    def pin(self, name: str, workers: int, seconds: float | None) -> None:
        """Hold pool ``name`` at ``workers`` for ``seconds`` (None: until ``unpin``)."""
        pool = self._pool(name)
        if not 0 <= workers <= pool.policy.max_workers:
            raise ControlError(f"pool {name}: {workers} workers is outside 0..{pool.policy.max_workers} "
                               f"(its max_workers)")
        if seconds is not None and seconds <= 0:
            raise ControlError(f"pool {name}: a pin must last more than 0s, got {seconds:g}s")
        until = None if seconds is None else self.clock() + seconds
        self.overrides[name] = Override(pinned=workers, until=until,
                                        paused=self.overrides.get(name, Override()).paused)
        self._changed()
        log.info("Pool %s pinned at %d workers%s by an operator.", name, workers,
                 f" for {seconds:g}s" if seconds else "",
                 extra=journal(MessageId.OPERATOR_OVERRIDE, POOL=name, ACTION="pin", TO=workers,
                               DURATION_SEC=f"{seconds:g}" if seconds else None))

    def unpin(self, name: str) -> None:
        """Let the policy decide again; a pause stays."""
        self._pool(name)
        override = self.overrides.pop(name, None)
        if override is not None and override.paused:
            self.overrides[name] = Override(paused=True)
        self._changed()
        log.info("Pool %s unpinned: the policy decides again.", name,
                 extra=journal(MessageId.OPERATOR_OVERRIDE, POOL=name, ACTION="unpin"))

    def clear_ceiling(self, name: str) -> None:
        """Forget the pool's measured ceiling (the knee) and its throughput samples: it is measured
        again from the next backlog (after the dependency was scaled up, say)."""
        self._pool(name)
        self._ceilings_to_clear.add(name)
        log.info("Pool %s: its measured ceiling is cleared by an operator; it is measured again.", name,
                 extra=journal(MessageId.OPERATOR_OVERRIDE, POOL=name, ACTION="clear-ceiling"))

    def take_cleared_ceilings(self) -> set[str]:
        """The pools whose ceiling an operator cleared since the last call (the controller forgets them)."""
        cleared, self._ceilings_to_clear = self._ceilings_to_clear, set()
        return cleared

    def drain(self, name: str) -> None:
        """Drain every worker of the pool and keep it at zero until ``unpin``."""
        self._pool(name)
        self.overrides[name] = Override(pinned=0, until=None)
        self._changed()
        log.info("Pool %s: draining every worker by an operator's request.", name,
                 extra=journal(MessageId.OPERATOR_OVERRIDE, POOL=name, ACTION="drain", TO=0))

    def pause(self, name: str) -> None:
        """Workers stop claiming (nothing is killed) and the pool is held as it is."""
        self._pool(name)
        current = self.overrides.get(name, Override())
        self.overrides[name] = dataclasses.replace(current, paused=True)
        self._resuming.pop(name, None)
        self._changed()  # first: a worker starting now reads it
        self.fleet.set_paused(self._workers_of(name), True)
        log.info("Pool %s paused: its workers claim nothing new.", name,
                 extra=journal(MessageId.OPERATOR_OVERRIDE, POOL=name, ACTION="pause"))

    def resume(self, name: str) -> None:
        """Workers claim again; a pin stays."""
        self._pool(name)
        current = self.overrides.pop(name, Override())
        if current.pinned is not None:
            self.overrides[name] = dataclasses.replace(current, paused=False)
        self._changed()  # first: a worker starting now reads it
        workers = self._workers_of(name)
        # Those still starting may have read the file before: tell them once they are ready.
        self._resuming[name] = {w.instance for w in workers if w.state is WorkerState.STARTING}
        self.fleet.set_paused([w for w in workers if w not in self.retiring], False)
        log.info("Pool %s resumed.", name, extra=journal(MessageId.OPERATOR_OVERRIDE, POOL=name, ACTION="resume"))

    def _pool(self, name: str) -> PoolConfig:
        pool = self.pools.get(name)
        if pool is None:
            raise ControlError(f"no pool named {name!r} (pools: {', '.join(sorted(self.pools)) or 'none'})")
        return pool

    def _workers_of(self, name: str) -> list[WorkerInfo]:
        return [w for w in self.fleet.list() if w.pool == name
                and w.state in (WorkerState.ACTIVE, WorkerState.STARTING)]


def _describe(override: Override) -> str:
    parts = []
    if override.pinned is not None:
        parts.append(f"pin at {override.pinned} workers" +
                     (" (until unpinned)" if override.until is None else
                      f" (until {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(override.until))})"))
    if override.paused:
        parts.append("pause")
    return " and ".join(parts)
