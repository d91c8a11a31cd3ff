"""From a pool's observed state to a desired count, with either policy.

The controller sees one shape, ``PoolDecision``, whatever decided it:
flexiqd's policy (``policy: flexiqd``, the default) or flexiq's
(``policy: flexiq``, kept for compatibility).  Pure: no I/O, time is an argument.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from ..config.model import DaemonConfig, PoolConfig
from ..policy import (Decision, FlexiqWindowHistory, History, Observation, PoolInput, PoolMetrics,
                      compute_desired_workers_windowed, decide_fleet)


@dataclasses.dataclass(frozen=True)
class PoolState:
    """What the controller observed of one pool this tick."""

    pool: str
    active: int
    starting: int
    draining: int
    metrics: PoolMetrics | None      # None: the read failed


@dataclasses.dataclass(frozen=True)
class PoolDecision:
    """One pool's decision, in the controller's terms."""

    pool: str
    current: int
    desired: int
    reason: str
    rationale: str                   # one readable line
    binding_cap: str | None
    pending: int | None
    running: int | None
    history: Any                     # pass back on the next call
    detail: Decision | None = None   # flexiqd's full decision, when it made it

    @property
    def changed(self) -> bool:
        return self.desired != self.current


def decide_pools(config: DaemonConfig, states: Mapping[str, PoolState],
                 histories: Mapping[str, Any], now: float) -> dict[str, PoolDecision]:
    """Decide every configured pool that has a state; dependencies are shared among them."""
    flexiqd_pools = [p for p in config.pools.values() if p.policy_kind == "flexiqd" and p.name in states]
    decisions: dict[str, PoolDecision] = {}
    inputs = [PoolInput(observation=_observation(pool, states[pool.name]), policy=pool.policy,
                        history=histories.get(pool.name) if isinstance(histories.get(pool.name), History) else None)
              for pool in flexiqd_pools]
    if inputs:
        for name, decision in decide_fleet(inputs, list(config.dependencies.values()), now).items():
            decisions[name] = _from_flexiqd(decision, states[name].metrics)
    for pool in config.pools.values():
        if pool.policy_kind == "flexiq" and pool.name in states:
            history = histories.get(pool.name)
            decisions[pool.name] = decide_flexiq(
                pool, states[pool.name], history if isinstance(history, FlexiqWindowHistory) else None, now)
    return decisions


def _observation(pool: PoolConfig, state: PoolState) -> Observation:
    return Observation(pool=pool.name, active=state.active, starting=state.starting,
                       draining=state.draining, concurrency=pool.concurrency, metrics=state.metrics)


def _from_flexiqd(decision: Decision, metrics: PoolMetrics | None) -> PoolDecision:
    cap = decision.binding_cap.cap if decision.binding_cap else None
    return PoolDecision(pool=decision.pool, current=decision.current, desired=decision.desired,
                        reason=decision.reason, rationale=decision.line(), binding_cap=cap,
                        pending=metrics.runnable_depth if metrics else None,
                        running=metrics.running if metrics else None,
                        history=decision.history, detail=decision)


def decide_flexiq(pool: PoolConfig, state: PoolState, history: FlexiqWindowHistory | None,
                  now: float) -> PoolDecision:
    """flexiq's formula and windows, minus its defects: runnable jobs only, a failed read holds."""
    current = state.active + state.starting
    if state.metrics is None:
        return PoolDecision(pool=pool.name, current=current, desired=current,
                            reason="HoldMetricsUnavailable",
                            rationale=f"{pool.name} {current} -> {current}: stable: metrics unavailable, holding",
                            binding_cap=None, pending=None, running=None, history=history)
    options = pool.flexiq
    policy = pool.policy
    result = compute_desired_workers_windowed(
        state.metrics.runnable_depth, state.metrics.running, current, now=now, history=history,
        scale_up_window=options.scale_up_window, scale_down_window=options.scale_down_window,
        min_workers=policy.min_workers, max_workers=policy.max_workers,
        target_queue_depth_per_worker=options.target_queue_depth_per_worker,
        target_utilisation=options.target_utilisation, concurrency_per_worker=pool.concurrency,
        tolerance=options.tolerance)
    desired = result.desired_workers
    reason = "ScaleUp" if desired > current else "ScaleDown" if desired < current else "Stable"
    return PoolDecision(pool=pool.name, current=current, desired=desired, reason=reason,
                        rationale=f"{pool.name} {current} -> {desired}: {result.rationale}",
                        binding_cap="max" if desired == policy.max_workers and desired > current else None,
                        pending=state.metrics.runnable_depth, running=state.metrics.running,
                        history=result.history)


def combine_metrics(per_queue: Sequence[Any]) -> PoolMetrics:
    """One pool's metrics from the stats of each queue it serves."""
    if len(per_queue) == 1:
        return PoolMetrics.from_queue_stats(per_queue[0])
    busiest = max(per_queue, key=lambda s: s.completion_rate)
    return PoolMetrics(
        runnable_depth=sum(s.runnable for s in per_queue), running=sum(s.running for s in per_queue),
        oldest_runnable_age=max(s.oldest_runnable_age for s in per_queue),
        arrival_rate=sum(s.arrival_rate for s in per_queue),
        completion_rate=sum(s.completion_rate for s in per_queue), rate_window=busiest.window,
        duration_p50=busiest.duration_p50, duration_p95=busiest.duration_p95,
        duration_p99=max((s.duration_p99 for s in per_queue if s.duration_p99 is not None), default=None))
