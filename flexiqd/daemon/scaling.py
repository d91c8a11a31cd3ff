"""From the pools' observations to their decisions, with either policy, under every cap.

Both policies answer with the policy's own ``Decision``: flexiqd's policy
(``policy: flexiqd``, the default) and flexiq's formula (``policy: flexiq``,
kept for compatibility).  Every pool, whatever its policy, is held to its
``max_workers`` and its share of the declared dependencies, and what it asks
for counts against those dependencies' capacity: the shares are computed once,
over every pool, by the policy's ``share_dependencies``.  Pure: no I/O, time
is an argument.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from ..config.model import DaemonConfig, PoolConfig
from ..policy import Decision, History, Observation, PoolDemand, PoolMetrics, decide, share_dependencies
from ..policy.caps import apply_caps, cap_reason, collect_caps
from ..policy.config import PoolPolicy
from ..policy.flexiq_compat import decide_flexiq, flexiq_log_line
from ..policy.history import with_external_change
from ..policy.sharing import DependencyCap, with_fleet_grants
from ..policy.types import KneeState

#: The `policy:` of pools sized by flexiq's formula.
FLEXIQ = "flexiq"
#: Reasons of decisions an operator made (see ``overrides``).
OPERATOR_REASONS = frozenset({"Pinned", "Paused"})


def decide_pools(config: DaemonConfig, observations: Mapping[str, Observation],
                 histories: Mapping[str, History], now: float,
                 fleet_grants: Mapping[str, Mapping[str, int]] | None = None) -> dict[str, Decision]:
    """Decide every configured pool that was observed; dependencies are shared among all of them.

    Each pool's demand (what it would keep or reach, within its bounds) is shared
    out by ``share_dependencies``; pools whose metrics failed are held, and what
    their workers use is taken off the top.  Then each pool decides under its share --
    for global caps, under ``fleet_grants`` (pool -> cap -> workers: its share of the fleet's).
    """
    pools = [pool for pool in config.pools.values() if pool.name in observations]
    demands, held = [], []
    flexiq: dict[str, Decision] = {}
    for pool in pools:
        obs = observations[pool.name]
        if pool.policy_kind == FLEXIQ:
            # flexiq's formula and windows need no share to decide; the caps come after.
            flexiq[pool.name] = decide_flexiq(obs, pool.policy, pool.flexiq, histories.get(pool.name), now)
        if obs.metrics is None:
            held.append(PoolDemand(pool=pool.name, workers=obs.current, uses=pool.policy.dependencies))
            continue
        if pool.policy_kind == FLEXIQ:
            wanted = flexiq[pool.name].desired
        else:
            # Stages 1-2 only matter here (the signals' raw count): decided again under its share below.
            wanted = decide(obs, pool.policy, histories.get(pool.name), now).raw_desired
        demand = min(max(wanted, obs.current, pool.policy.floor), pool.policy.max_workers)
        demands.append(PoolDemand(pool=pool.name, workers=demand, uses=pool.policy.dependencies))
    shares = share_dependencies(list(config.dependencies.values()), demands, held)

    for pool_name, grants in (fleet_grants or {}).items():
        if pool_name in shares or grants:
            shares[pool_name] = with_fleet_grants(shares.get(pool_name), pool_name, grants)
    decisions: dict[str, Decision] = {}
    for pool in pools:
        obs = observations[pool.name]
        if pool.policy_kind != FLEXIQ:
            decisions[pool.name] = decide(obs, pool.policy, histories.get(pool.name) or History(), now,
                                          shares.get(pool.name))
        elif obs.metrics is None:
            decisions[pool.name] = flexiq[pool.name]  # holds: nothing to cap
        else:
            decisions[pool.name] = _under_caps(pool, obs, flexiq[pool.name], shares.get(pool.name), now)
    return decisions


def _under_caps(pool: PoolConfig, obs: Observation, decision: Decision, share: DependencyCap | None,
                now: float) -> Decision:
    """flexiq's count under the same ceilings as every pool: max_workers and the dependency shares
    (then its min_workers, as flexiqd's floor comes after the caps)."""
    caps = collect_caps(obs, pool.policy, KneeState(), share, now)
    capped, binding = apply_caps(decision.desired, caps)
    desired = max(capped, pool.policy.min_workers)
    if binding is None or desired >= decision.desired:
        return dataclasses.replace(decision, caps=caps)
    return dataclasses.replace(
        decision, desired=desired, capped=capped, caps=caps, binding_cap=binding, reason=cap_reason(binding),
        message=f"{decision.message}; capped by {binding.cap}={binding.workers}")


def decision_line(decision: Decision, observation: Observation | None = None, policy_kind: str = "") -> str:
    """The decision's one log line: flexiq's own line for its formula (byte for byte, as
    flexiq 2.1 logs it), else ``Decision.line``."""
    if policy_kind == FLEXIQ and observation is not None and decision.reason not in OPERATOR_REASONS:
        return flexiq_log_line(observation, decision)
    return decision.line()


def entered_by_others(decision: Decision, before: History | None, policy: PoolPolicy, now: float,
                      workers: int) -> History:
    """The history after the pool went to ``workers`` by an operator's hand (or by being created),
    not by the policy's: its change replaces the one the decision would have recorded."""
    base = dataclasses.replace(decision.history, changes=before.changes if before else ())
    return with_external_change(base, policy, now, decision.current, workers)


def combine_metrics(per_queue: Sequence) -> PoolMetrics:
    """One pool's metrics from the stats of each queue it serves."""
    if len(per_queue) == 1:
        return PoolMetrics.from_queue_stats(per_queue[0])
    busiest = max(per_queue, key=lambda s: s.completion_rate)
    ages = [(s.running_age_mean, s.running) for s in per_queue if s.running_age_mean is not None]
    running = sum(n for _, n in ages)
    return PoolMetrics(
        runnable_depth=sum(s.runnable for s in per_queue), running=sum(s.running for s in per_queue),
        oldest_runnable_age=max(s.oldest_runnable_age for s in per_queue),
        arrival_rate=sum(s.arrival_rate for s in per_queue),
        completion_rate=sum(s.completion_rate for s in per_queue), rate_window=busiest.window,
        duration_p50=busiest.duration_p50, duration_p95=busiest.duration_p95,
        duration_p99=max((s.duration_p99 for s in per_queue if s.duration_p99 is not None), default=None),
        coming_due=sum(s.coming_due for s in per_queue),
        coming_due_within=min(s.coming_due_within for s in per_queue),
        running_age_mean=sum(a * n for a, n in ages) / running if running else None,
        recent_duration_p50=busiest.recent_duration_p50, recent_completions=busiest.recent_completions,
        recent_window=busiest.recent_window)
