"""Admission: which jobs enter their dependencies, and this process's shares of the limits.

A job enters every dependency it names or none (``Backend.admit``).  ``Admission`` holds
both halves of that, for one ``Store``:

- ``admit_batch``, inside the store's transaction: a batch read once, planned
  (``limits.plan_admissions``) within the owner's shares of each concurrency limit
  (``shares``), grown under the dependency's row lock when short, and written in a few
  statements;
- this process's memory, per (owner, dependency): the owner's share as last stored, the
  jobs it admitted (stored or not), and the holds admitted in memory (``admit_locally``)
  that the owner's next exchange stores (``take_pending``, ``store_pending``).  A
  transaction that fails gives its holds back (``restore_pending``); one that commits
  updates the memory (``after_admissions``).

The lifecycle (``lifecycle.Store``) decides when each runs; this module decides who gets
in.  Thread-safe: the memory is behind one lock, and a transaction's part touches it
only through the methods that take that lock.
"""

from __future__ import annotations

import collections
import threading
from typing import Iterable, Mapping, Sequence

from ..limits import DependencyLimit, nearest_rank, plan_admissions, slot_wait
from ..types import Deferral, DependencyStats
from . import shares
from .dialect import Tx
from .figures import COMING_DUE_LIMIT, DURATION_HORIZON
from .shares import Share

# Hold times behind a dependency's typical hold (the wait a refused job is told), those
# kept for dependency_stats, and how long they are kept.
TYPICAL_HOLD_SAMPLE = 100
HOLD_SAMPLE = 1000
HOLD_TIMES_RETENTION = 600.0

#: A hold admitted in memory, not stored yet: (dependency, job id, owner, since).
PendingHold = tuple[str, int, str, float]


class Admission:
    """Admission to dependency limits for one store, and this process's memory of it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shares: dict[tuple[str, str], Share] = {}
        self._holding: dict[tuple[str, str], set[int]] = {}
        self._pending: dict[str, list[PendingHold]] = {}

    def admit_locally(self, owner: str, job_id: int, dependencies: Sequence[DependencyLimit], *,
                      now: float) -> bool:
        """``Backend.admit_locally``: within the room of the owner's shares, as this process last
        stored them; the hold reaches the store with the owner's next exchange."""
        limits = distinct(dependencies)
        if any(limit.rate is not None or limit.concurrency is None for limit in limits):
            return False  # a rate's state is one number the whole fleet shares: ask the store
        with self._lock:
            holding = [self._holding.setdefault((owner, limit.name), set()) for limit in limits]
            if all(job_id in held for held in holding):
                return True  # admitted before: idempotent
            if any(shares.local_room(self._shares.get((owner, limit.name)), limit.concurrency or 0,
                                     len(held), now) < 1 for limit, held in zip(limits, holding)):
                return False
            for limit, held in zip(limits, holding):
                held.add(job_id)
                self._pending.setdefault(owner, []).append((limit.name, job_id, owner, now))
        return True

    def admit_batch(self, tx: Tx, owner: str, requests: Sequence[tuple[int, Sequence[DependencyLimit]]],
                    now: float, grants: dict[str, Share]) -> dict[int, Deferral | None]:
        """Admit a batch, each job all or nothing, in order: the state is read once (the jobs,
        their holds, the owner's shares, the rates' times), the batch planned
        (``limits.plan_admissions``) and the outcome written in a few statements.

        A concurrency limit admits within the owner's share (``shares``): only its own rows
        are read and locked.  Jobs refused for want of share grow it -- under the
        dependency's row lock, counting what every other owner reserves -- and the batch is
        planned again.  A rate's time is the dependency's row, locked (in name order) by any
        admission under it.  ``grants``: the shares this stored, for this process's memory.
        """
        answers: dict[int, Deferral | None] = {}
        ids = [job_id for job_id, _ in requests]
        # A job cannot end (settle, recovery, cancel) until this admission commits, so a hold
        # is never taken for an attempt that already ended.
        live = tx.leased_ids(owner, ids)
        held = tx.admitted_ids(owner, ids)
        todo: list[tuple[int, list[DependencyLimit]]] = []
        for job_id, dependencies in requests:
            limits = distinct(dependencies)
            if not limits or job_id in held:
                answers[job_id] = None  # nothing to enter, or admitted before: idempotent
            elif job_id not in live:
                answers[job_id] = Deferral(limits[0].name, 0.0)
            else:
                todo.append((job_id, limits))
        if not todo:
            return answers
        limit_of = {limit.name: limit for _, limits in todo for limit in limits}
        names = sorted(limit_of)
        bounded = [name for name in names if limit_of[name].concurrency is not None]
        rated = [name for name in names if limit_of[name].rate is not None]
        owned = tx.own_shares(owner, bounded) if bounded else {}
        holding = tx.owner_holds(owner, bounded) if bounded else {}
        tats = tx.lock_dependencies(rated) if rated else {}
        plan, new_tats = self._plan(todo, owned, holding, tats, now)
        short = collections.Counter(name for refused in plan.values() if refused
                                    for name, wait in refused if wait is None)
        # Grow a share this process's own admissions have outgrown too: the jobs it holds
        # slots for in memory include finished ones whose results are not stored yet.
        asked = collections.Counter(limit.name for _, limits in todo for limit in limits)
        for name in bounded:
            in_memory = self._holding_count(owner, name) + asked[name]
            share = owned.get(name)
            room = min(share.slots, limit_of[name].concurrency or 0) if share is not None and share.usable(now) else 0
            if in_memory > room:
                short[name] = max(short[name], in_memory - holding.get(name, 0))
        if short:
            tx.lock_dependencies(sorted(short))
            for name, asked in sorted(short.items()):
                everyone = tx.shares_of(name)
                taken, _ = shares.others(everyone, tx.holds_by_owner(name), owner, now)
                slots = shares.grown(limit_of[name].concurrency or 0, holding.get(name, 0), asked, taken)
                wanted = max(0, holding.get(name, 0) + asked - slots)
                owned[name] = grants[name] = Share(slots, now + shares.SHARE_TTL, wanted)
                tx.set_share(name, owner, owned[name])
            plan, new_tats = self._plan(todo, owned, holding, tats, now)
        typical: dict[str, float | None] = {}
        ages: dict[str, list[float]] = {}
        holds: list[PendingHold] = []
        admitted: collections.Counter = collections.Counter()
        deferred: collections.Counter = collections.Counter()
        for job_id, limits in todo:
            refused = plan[job_id]
            if refused is None:
                answers[job_id] = None
                holds += [(limit.name, job_id, owner, now) for limit in limits if limit.concurrency is not None]
                admitted.update(limit.name for limit in limits)
                continue
            waits = []
            for name, wait in refused:
                if wait is None:  # a full concurrency: when a slot is likely to free up
                    if name not in typical:
                        ages[name] = [now - since for _, since in tx.live_holds([name])]
                        typical[name] = nearest_rank(sorted(tx.recent_hold_times(
                            name, now - DURATION_HORIZON, TYPICAL_HOLD_SAMPLE)), 0.5)
                    wait = slot_wait(ages[name], typical[name])
                waits.append(Deferral(name, wait))
            answers[job_id] = refusal = max(waits, key=lambda r: r.wait)
            deferred[refusal.dependency] += 1
        if holds:
            tx.add_holds(holds)
        for name in names:
            if new_tats.get(name) != tats.get(name):
                tx.set_tat(name, new_tats[name])
            if admitted[name] or deferred[name]:
                tx.bump_dependency(name, int(now), admitted[name], deferred[name])
        return answers

    @staticmethod
    def _plan(todo: list[tuple[int, list[DependencyLimit]]], owned: Mapping[str, Share], holding: Mapping[str, int],
              tats: Mapping[str, float | None], now: float):
        """``plan_admissions`` with each concurrency limit bounded by the owner's live share."""
        room = {}
        for _, limits in todo:
            for limit in limits:
                if limit.concurrency is not None:
                    share = owned.get(limit.name)
                    room[limit.name] = min(share.slots, limit.concurrency) if share is not None and share.usable(now) else 0
        return plan_admissions(todo, holding, tats, now, room)

    def renew_shares(self, tx: Tx, owner: str, now: float, grants: dict[str, Share]) -> None:
        """Keep the owner's shares alive; give back what it does not hold while others want."""
        with self._lock:
            names = sorted(name for (who, name) in self._shares if who == owner)
            holding = {name: len(self._holding.get((owner, name), ())) for name in names}
        if not names:
            return
        wanted = tx.wanted_by_others(owner, names, now)
        for name, share in tx.own_shares(owner, names).items():
            if name in grants:
                continue  # stored by this exchange's admission already
            kept = shares.kept(share, holding[name], wanted.get(name, 0))
            grants[name] = Share(kept, now + shares.SHARE_TTL, 0)
            tx.set_share(name, owner, grants[name])

    def renewal_due(self, owner: str, now: float) -> bool:
        with self._lock:
            return shares.renewal_due((share for (who, _), share in self._shares.items() if who == owner), now)

    def take_pending(self, owner: str) -> list[PendingHold]:
        with self._lock:
            return self._pending.pop(owner, [])

    def restore_pending(self, owner: str, pending: list[PendingHold]) -> None:
        if pending:
            with self._lock:
                self._pending[owner] = pending + self._pending.get(owner, [])

    @staticmethod
    def store_pending(tx: Tx, pending: list[PendingHold], now: float) -> None:
        """Store the holds admitted in memory (before anything that may end their jobs)."""
        if pending:
            tx.add_holds(pending, count=True)

    def after_admissions(self, owner: str, grants: Mapping[str, Share], *, admitted: Sequence[int],
                          admit: Sequence[tuple[int, Sequence[DependencyLimit]]], ended: Sequence[int]) -> None:
        """This process's memory of the owner's shares and holds, after a commit."""
        limits_of = {job_id: distinct(limits) for job_id, limits in admit}
        with self._lock:
            for name, share in grants.items():
                self._shares[(owner, name)] = share
            for job_id in admitted:
                for limit in limits_of.get(job_id, ()):
                    if limit.concurrency is not None:
                        self._holding.setdefault((owner, limit.name), set()).add(job_id)
            if ended:
                gone = set(ended)
                for (who, _), held in self._holding.items():
                    if who == owner:
                        held -= gone

    def _holding_count(self, owner: str, name: str) -> int:
        with self._lock:
            return len(self._holding.get((owner, name), ()))

    def may_hold(self, owner: str) -> bool:
        """Whether jobs of ``owner`` may hold dependency slots this process admitted."""
        with self._lock:
            return bool(self._pending.get(owner)) or any(
                held for (who, _), held in self._holding.items() if who == owner)

    def forget_owners(self, owners: Iterable[str]) -> None:
        gone = set(owners)
        with self._lock:
            for memory in (self._shares, self._holding):
                for key in [key for key in memory if key[0] in gone]:
                    del memory[key]
            for owner in gone:
                self._pending.pop(owner, None)


def read_dependency_stats(tx: Tx, dependency: str, now: float, window: float) -> DependencyStats:
    """The dependency's use now and over the last ``window`` seconds, read in ``tx``."""
    in_use = len(tx.live_holds([dependency]))
    waiting = tx.waiting_for(dependency, COMING_DUE_LIMIT)
    holds = sorted(tx.recent_hold_times(dependency, now - window, HOLD_SAMPLE))
    admitted, deferred = tx.dependency_events(dependency, now - window)
    return DependencyStats(dependency=dependency, in_use=in_use, waiting=int(waiting),
                           hold_p50=nearest_rank(holds, 0.5), hold_p95=nearest_rank(holds, 0.95),
                           holds_ended=len(holds), admitted_rate=int(admitted) / window,
                           deferred_rate=int(deferred) / window, window=window)


def distinct(dependencies: Sequence[DependencyLimit]) -> list[DependencyLimit]:
    """One limit per dependency name (the last given), in the order first named."""
    return list({limit.name: limit for limit in dependencies}.values())
