"""Every pool's decision at once: the one decision path of the daemon and the simulator.

``decide_fleet`` takes each pool's observation, policy (flexiqd's, or flexiq's
formula kept for compatibility), history and -- with hosts sharing global
caps -- its grants of the fleet's caps, and the declared dependencies.  It

1. runs each pool's signals (``decide.combine_signals``; flexiq's formula for
   ``kind="flexiq"``) to learn what it would keep or reach;
2. shares the dependencies' capacity among those demands
   (``sharing.share_dependencies``; held pools' workers off the top), then
   replaces the global entries by the fleet's grants;
3. hands out each dependency's ``start_burst`` among its users, in pool
   order, so that no more of their workers start at once than it allows;
4. hands out, in pool order, the room that stopping workers leave: a worker
   asked to stop counts against max_workers and every dependency until its
   process has exited (``_Stopping``: caps ``stopping``, ``stopping:<name>``);
5. caps, smooths and clamps each pool (``decide.finish``).

The daemon's controller and the simulator's ``Flexiqd`` policy call nothing
else, so what the benchmarks measure is what the product runs.  Pure.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .caps import apply_caps, cap_reason, collect_caps, starting_allowance
from .config import Dependency, PoolPolicy
from .decide import Combined, combine_signals, finish, hold
from .flexiq_compat import decide_flexiq, flexiq_log_line
from .history import entered_by_others
from .sharing import DependencyCap, PoolDemand, share_dependencies, with_fleet_grants
from .types import Decision, History, Observation

#: ``PoolInput.kind`` of pools sized by flexiqd's policy (the default) and by flexiq's formula.
FLEXIQD, FLEXIQ = "flexiqd", "flexiq"
#: Reasons of decisions an operator made (the daemon's overrides), not a policy.
OPERATOR_REASONS = frozenset({"Pinned", "Paused"})


@dataclass(frozen=True, kw_only=True)
class PoolInput:
    """One pool's arguments to ``decide_fleet``.

    ``flexiq``: the flexiq options (``config.FlexiqOptions``) when ``kind`` is
    ``"flexiq"``.  ``fleet_grants``: this host's share of each global cap
    (cap name -> workers), when hosts share them; None when the host is alone.
    ``stopping``: those of the observation's ``draining`` workers that were asked
    to stop and whose processes have not exited yet (a retiring worker, paused
    but not stopped, can be taken back and is not one of them).  They still
    hold their connections, so they count against max_workers and every
    dependency cap until they exit: growth waits for them.
    """

    observation: Observation
    policy: PoolPolicy
    history: History | None = None
    kind: str = FLEXIQD
    flexiq: Any = None
    fleet_grants: Mapping[str, int] | None = None
    stopping: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.stopping <= self.observation.draining:
            raise ValueError(f"pool {self.observation.pool}: stopping must be within 0..draining "
                             f"({self.observation.draining}), got {self.stopping}")
        if self.kind not in (FLEXIQD, FLEXIQ):
            raise ValueError(f"pool {self.observation.pool}: kind must be {FLEXIQD!r} or {FLEXIQ!r}, got {self.kind!r}")
        if self.kind == FLEXIQ and self.flexiq is None:
            raise ValueError(f"pool {self.observation.pool}: a flexiq pool needs its flexiq options")

    @property
    def name(self) -> str:
        return self.observation.pool


def decide_fleet(pools: Sequence[PoolInput], dependencies: Sequence[Dependency], now: float) -> dict[str, Decision]:
    """Decide every pool at ``now``; returns the decisions keyed by pool name (in ``pools`` order)."""
    stages: dict[str, Combined | Decision] = {}
    demands, held = [], []
    for item in pools:
        obs = item.observation
        if obs.metrics is None:
            held.append(PoolDemand(pool=item.name, workers=obs.current, uses=item.policy.dependencies))
            continue
        stage: Combined | Decision
        if item.kind == FLEXIQ:
            stage = decide_flexiq(obs, item.policy, item.flexiq, item.history, now)
            wanted = stage.desired
        else:
            stage = combine_signals(obs, item.policy, item.history or History(), now)
            wanted = stage.raw
        stages[item.name] = stage
        demand = min(max(wanted, obs.current, item.policy.floor), item.policy.max_workers)
        demands.append(PoolDemand(pool=item.name, workers=demand, uses=item.policy.dependencies))
    shares = share_dependencies(dependencies, demands, held)
    for item in pools:
        if item.fleet_grants is not None and (item.name in shares or item.fleet_grants):
            shares[item.name] = with_fleet_grants(shares.get(item.name), item.name, item.fleet_grants)

    starts = _StartBursts(dependencies, pools)
    stopping = _Stopping(dependencies, pools)
    decisions: dict[str, Decision] = {}
    for item in pools:
        stage = stages.get(item.name)
        if stage is None:
            decisions[item.name] = _held(item, now)
            stopping.grant(item, decisions[item.name].desired - item.observation.current)
            continue
        allowances = starts.allowances(item)
        share = _with_stopping(shares.get(item.name), item.name, stopping.caps(item))
        if isinstance(stage, Combined):
            decision = finish(stage, share, allowances)
        else:
            decision = _flexiq_under_caps(item, stage, share, allowances, now)
        decision = stopping.explain(item, decision)
        starts.grant(item, max(0, decision.desired - item.observation.current))
        stopping.grant(item, decision.desired - item.observation.current)
        decisions[item.name] = _with_creation(item, decision, now)
    return decisions


class _StartBursts:
    """Each dependency's ``start_burst`` shared out, pool by pool, within one decision."""

    def __init__(self, dependencies: Sequence[Dependency], pools: Sequence[PoolInput]) -> None:
        self.bursts = {dep.name: dep.start_burst for dep in dependencies}
        self.starting = {name: 0 for name in self.bursts}
        self.granted = {name: 0 for name in self.bursts}
        for item in pools:
            for name in self._used(item):
                self.starting[name] += item.observation.starting

    def _used(self, item: PoolInput) -> list[str]:
        return [use.dependency for use in item.policy.dependencies if use.dependency in self.bursts]

    def allowances(self, item: PoolInput) -> tuple[tuple[str, int], ...]:
        """(dependency, new starts allowed now) for each declared dependency the pool uses."""
        return tuple((name, starting_allowance(self.bursts[name], self.starting[name], self.granted[name]))
                     for name in self._used(item))

    def grant(self, item: PoolInput, started: int) -> None:
        for name in self._used(item):
            self.granted[name] += started


class _Stopping:
    """What stopping workers still hold, and the growth it leaves room for, pool by pool.

    A worker asked to stop holds its connections until its process has exited, so
    until then it counts against max_workers and every dependency cap.  Caps, never
    below a pool's current count (stopping workers hold growth back; they never
    shrink a pool):

    - ``stopping``: max_workers less the pool's stopping workers;
    - ``stopping:<global cap>``: this host's grant of it less the same (the grant
      counts every worker the pool runs: its claim includes them);
    - ``stopping:<dependency>``, while workers of its users are stopping: the
      current count, the retiring workers the pool can take back (they start no
      process) and what the capacity left leaves room for: the dependency's
      available capacity less what every live worker of its users holds (running,
      starting, retiring, stopping) and what the pools decided before this one
      start this tick.
    """

    def __init__(self, dependencies: Sequence[Dependency], pools: Sequence[PoolInput]) -> None:
        self.free = {dep.name: float(dep.available) for dep in dependencies}
        self.stopping = {name: 0 for name in self.free}
        for item in pools:
            obs = item.observation
            for use in self._local(item):
                self.free[use.dependency] -= (obs.current + obs.draining) * use.per_worker
                self.stopping[use.dependency] += item.stopping

    def _local(self, item: PoolInput) -> list:
        """The declared dependencies the pool uses whose capacity is this host's (not a grant)."""
        grants = item.fleet_grants or {}
        return [use for use in item.policy.dependencies if use.dependency in self.free and use.dependency not in grants]

    def caps(self, item: PoolInput) -> tuple[tuple[str, int], ...]:
        obs, current = item.observation, item.observation.current
        caps = []
        if item.stopping:
            caps.append(("stopping", max(current, item.policy.max_workers - item.stopping)))
            caps.extend((f"stopping:{name}", max(current, granted - item.stopping))
                        for name, granted in sorted((item.fleet_grants or {}).items()))
        retiring = obs.draining - item.stopping
        for use in self._local(item):
            if self.stopping[use.dependency]:
                room = math.floor(max(0.0, self.free[use.dependency]) / use.per_worker + 1e-9)
                caps.append((f"stopping:{use.dependency}", current + retiring + room))
        return tuple(caps)

    def grant(self, item: PoolInput, grown: int) -> None:
        """The pool grows by ``grown``: what it starts (beyond the retiring workers it takes back)
        is no longer free for the pools after it."""
        started = max(0, grown - (item.observation.draining - item.stopping))
        for use in self._local(item):
            self.free[use.dependency] -= started * use.per_worker

    def explain(self, item: PoolInput, decision: Decision) -> Decision:
        """A decision that stopping workers hold back says so, and how many of them."""
        cap = decision.binding_cap
        if cap is None or not (cap.cap == "stopping" or cap.cap.startswith("stopping:")):
            return decision
        name = cap.cap.partition(":")[2]
        local = name and name in self.stopping and name not in (item.fleet_grants or {})
        count = self.stopping[name] if local else item.stopping
        held = f"{count} workers still stopping hold {name}" if local else f"{count} workers still stopping"
        grown = max(0, decision.desired - decision.current)
        return dataclasses.replace(decision, message=f"{decision.message}; {held}: starting {grown} now, "
                                                     f"the rest as they exit")


def _with_stopping(share: DependencyCap | None, pool: str,
                   stopping: tuple[tuple[str, int], ...]) -> DependencyCap | None:
    if not stopping:
        return share
    if share is None:
        return DependencyCap(pool=pool, workers=None, dependency=None, stopping=stopping)
    return dataclasses.replace(share, stopping=stopping)


def _with_creation(item: PoolInput, decision: Decision, now: float) -> Decision:
    """A new pool's first workers (up to its floor) enter its history as its creation, made by
    others (``history.entered_by_others``), not as a scale-up of the policy's own: creating the
    pool uses up no rate limit's budget."""
    if item.history is None and decision.current == 0 and 0 < decision.desired <= item.policy.floor:
        history = entered_by_others(decision, None, item.policy, now, decision.desired)
        return dataclasses.replace(decision, history=history)
    return decision


def _held(item: PoolInput, now: float) -> Decision:
    """A pool whose metrics could not be read: held, whatever its policy."""
    if item.kind == FLEXIQ:
        return decide_flexiq(item.observation, item.policy, item.flexiq, item.history, now)
    return hold(item.observation, item.policy, item.history or History())


def _flexiq_under_caps(item: PoolInput, decision: Decision, share: DependencyCap | None,
                       allowances: tuple[tuple[str, int], ...], now: float) -> Decision:
    """flexiq's count under the same ceilings as every pool: max_workers, the dependency shares
    and staggered starts (then its min_workers, as flexiqd's floor comes after the caps)."""
    caps = collect_caps(item.observation, item.policy, None, share, allowances)
    capped, binding = apply_caps(decision.desired, caps)
    desired = max(capped, item.policy.min_workers)
    if binding is None or desired >= decision.desired:
        return dataclasses.replace(decision, caps=caps)
    return dataclasses.replace(
        decision, desired=desired, capped=capped, caps=caps, binding_cap=binding, reason=cap_reason(binding),
        message=f"{decision.message}; capped by {binding.cap}={binding.workers}")


def decision_line(decision: Decision, observation: Observation | None = None, kind: str = FLEXIQD) -> str:
    """The decision's one log line: flexiq's own line for its formula (byte for byte, as
    flexiq 2.1 logs it), else ``Decision.line``."""
    if kind == FLEXIQ and observation is not None and decision.reason not in OPERATOR_REASONS:
        return flexiq_log_line(observation, decision)
    return decision.line()
