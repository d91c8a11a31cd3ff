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
from ..policy import (Decision, FlexiqWindowHistory, History, Observation, PoolDemand, PoolMetrics,
                      compute_desired_workers_windowed, decide, share_dependencies)
from ..policy.caps import apply_caps, cap_reason, collect_caps
from ..policy.config import PoolPolicy
from ..policy.history import with_external_change
from ..policy.sharing import DependencyCap
from ..policy.types import CapValue, KneeState, SignalRecommendation

#: The signal name of a decision made by flexiq's formula.
FLEXIQ = "flexiq"
#: Reasons of decisions an operator made (see ``overrides``).
OPERATOR_REASONS = frozenset({"Pinned", "Paused"})


@dataclasses.dataclass(frozen=True)
class Decided:
    """Every pool's decision of one tick, and the flexiq pools' window memory to keep."""

    decisions: dict[str, Decision]
    windows: dict[str, FlexiqWindowHistory]


def decide_pools(config: DaemonConfig, observations: Mapping[str, Observation],
                 histories: Mapping[str, History], windows: Mapping[str, FlexiqWindowHistory],
                 now: float) -> Decided:
    """Decide every configured pool that was observed; dependencies are shared among all of them.

    Each pool's demand (what it would keep or reach, within its bounds) is shared
    out by ``share_dependencies``; pools whose metrics failed are held, and what
    their workers use is taken off the top.  Then each pool decides under its share.
    """
    pools = [pool for pool in config.pools.values() if pool.name in observations]
    demands, held = [], []
    flexiq: dict[str, tuple[int, str, FlexiqWindowHistory | None]] = {}
    for pool in pools:
        obs = observations[pool.name]
        if obs.metrics is None:
            held.append(PoolDemand(pool=pool.name, workers=obs.current, uses=pool.policy.dependencies))
            continue
        if pool.policy_kind == FLEXIQ:
            flexiq[pool.name] = _flexiq_formula(pool, obs.metrics, obs.current, windows.get(pool.name), now)
            wanted = flexiq[pool.name][0]
        else:
            # Stages 1-2 only matter here (the signals' raw count): decided again under its share below.
            wanted = decide(obs, pool.policy, histories.get(pool.name), now).raw_desired
        demand = min(max(wanted, obs.current, pool.policy.floor), pool.policy.max_workers)
        demands.append(PoolDemand(pool=pool.name, workers=demand, uses=pool.policy.dependencies))
    shares = share_dependencies(list(config.dependencies.values()), demands, held)

    decisions: dict[str, Decision] = {}
    kept: dict[str, FlexiqWindowHistory] = {}
    for pool in pools:
        obs = observations[pool.name]
        history = histories.get(pool.name) or History()
        if pool.policy_kind != FLEXIQ:
            decisions[pool.name] = decide(obs, pool.policy, history, now, shares.get(pool.name))
        elif pool.name not in flexiq:
            decisions[pool.name] = _flexiq_hold(pool, obs, history)
            if pool.name in windows:
                kept[pool.name] = windows[pool.name]
        else:
            wanted, rationale, window = flexiq.pop(pool.name)
            decisions[pool.name] = _flexiq_decision(pool, obs, wanted, rationale, history,
                                                    shares.get(pool.name), now)
            if window is not None:
                kept[pool.name] = window
    return Decided(decisions=decisions, windows=kept)


def _flexiq_formula(pool: PoolConfig, metrics: PoolMetrics, current: int,
                    window: FlexiqWindowHistory | None, now: float) -> tuple[int, str, FlexiqWindowHistory]:
    """flexiq's formula and windows, minus its defects: runnable jobs only."""
    options, policy = pool.flexiq, pool.policy
    result = compute_desired_workers_windowed(
        metrics.runnable_depth, metrics.running, current, now=now, history=window,
        scale_up_window=options.scale_up_window, scale_down_window=options.scale_down_window,
        min_workers=policy.min_workers, max_workers=policy.max_workers,
        target_queue_depth_per_worker=options.target_queue_depth_per_worker,
        target_utilisation=options.target_utilisation, concurrency_per_worker=pool.concurrency,
        tolerance=options.tolerance)
    return result.desired_workers, result.rationale, result.history


def _flexiq_decision(pool: PoolConfig, obs: Observation, wanted: int, rationale: str,
                     history: History, share: DependencyCap | None, now: float) -> Decision:
    """flexiq's count under the same ceilings as every pool: max_workers and the dependency shares
    (then its min_workers, as flexiqd's floor comes after the caps)."""
    current = obs.current
    caps = collect_caps(obs, pool.policy, KneeState(), share, now)
    capped, binding = apply_caps(wanted, caps)
    desired = max(capped, pool.policy.min_workers)
    if binding is not None and desired < wanted:
        reason = cap_reason(binding)
        message = f"{rationale}; capped by {binding.cap}={binding.workers}"
    else:
        binding = None
        reason = "ScaleUp" if desired > current else "ScaleDown" if desired < current else "Stable"
        message = rationale
    if binding is None and desired == pool.policy.max_workers and desired > current:
        binding = CapValue("max", pool.policy.max_workers)
    return Decision(
        pool=pool.name, current=current, desired=desired, raw_desired=wanted, capped=capped,
        stabilized=wanted, reason=reason, message=message,
        recommendations=(SignalRecommendation(FLEXIQ, wanted, rationale),), winner=FLEXIQ, caps=caps,
        binding_cap=binding, smoothing=(),
        history=with_external_change(history, pool.policy, now, current, desired))


def _flexiq_hold(pool: PoolConfig, obs: Observation, history: History) -> Decision:
    current = obs.current
    return Decision(
        pool=pool.name, current=current, desired=current, raw_desired=current, capped=current,
        stabilized=current, reason="HoldMetricsUnavailable", message="stable: metrics unavailable, holding",
        recommendations=(), winner=FLEXIQ, caps=(CapValue("max", pool.policy.max_workers),),
        binding_cap=None, smoothing=(), history=history)


def decision_line(decision: Decision) -> str:
    """The decision's one log line: flexiq's own wording for its formula, else ``Decision.line``."""
    if decision.winner == FLEXIQ and decision.reason not in OPERATOR_REASONS:
        return f"{decision.pool} {decision.current} -> {decision.desired}: {decision.message}"
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
    ages = [(s.running_age_mean, s.running) for s in per_queue if getattr(s, "running_age_mean", None) is not None]
    running = sum(n for _, n in ages)
    return PoolMetrics(
        runnable_depth=sum(s.runnable for s in per_queue), running=sum(s.running for s in per_queue),
        oldest_runnable_age=max(s.oldest_runnable_age for s in per_queue),
        arrival_rate=sum(s.arrival_rate for s in per_queue),
        completion_rate=sum(s.completion_rate for s in per_queue), rate_window=busiest.window,
        duration_p50=busiest.duration_p50, duration_p95=busiest.duration_p95,
        duration_p99=max((s.duration_p99 for s in per_queue if s.duration_p99 is not None), default=None),
        coming_due=sum(getattr(s, "coming_due", 0) for s in per_queue),
        coming_due_within=min((getattr(s, "coming_due_within", 0.0) for s in per_queue), default=0.0),
        running_age_mean=sum(a * n for a, n in ages) / running if running else None)
