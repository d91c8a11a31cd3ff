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
4. caps, smooths and clamps each pool (``decide.finish``).

The daemon's controller and the simulator's ``Flexiqd`` policy call nothing
else, so what the benchmarks measure is what the product runs.  Pure.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .caps import apply_caps, cap_reason, collect_caps, starting_allowance
from .config import Dependency, PoolPolicy
from .decide import Combined, combine_signals, finish, hold
from .flexiq_compat import decide_flexiq, flexiq_log_line
from .history import entered_by_others
from .sharing import DependencyCap, PoolDemand, share_dependencies, with_fleet_grants
from .types import Decision, History, KneeState, Observation

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
    """

    observation: Observation
    policy: PoolPolicy
    history: History | None = None
    kind: str = FLEXIQD
    flexiq: Any = None
    fleet_grants: Mapping[str, int] | None = None

    def __post_init__(self) -> None:
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
    decisions: dict[str, Decision] = {}
    for item in pools:
        stage = stages.get(item.name)
        if stage is None:
            decisions[item.name] = _held(item, now)
            continue
        allowances = starts.allowances(item)
        if isinstance(stage, Combined):
            decision = finish(stage, shares.get(item.name), allowances)
        else:
            decision = _flexiq_under_caps(item, stage, shares.get(item.name), allowances, now)
        starts.grant(item, max(0, decision.desired - item.observation.current))
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
    caps = collect_caps(item.observation, item.policy, KneeState(), share, now, allowances)
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
