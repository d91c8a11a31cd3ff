"""Builders shared by the policy tests (this module holds no tests itself)."""

from __future__ import annotations

from typing import Iterable

from flexiqd.policy import Decision, History, Observation, PoolMetrics, PoolPolicy, decide


def metrics(**fields) -> PoolMetrics:
    """Queue metrics of a quiet pool, with ``fields`` overriding."""
    values = dict(runnable_depth=0, running=0, oldest_runnable_age=0.0, arrival_rate=0.0,
                  completion_rate=0.0, rate_window=60.0, duration_p50=1.0, duration_p95=2.0,
                  duration_p99=3.0)
    values.update(fields)
    return PoolMetrics(**values)


def observe(active: int, *, starting: int = 0, draining: int = 0, concurrency: int = 4,
            failed: bool = False, **metric_fields) -> Observation:
    """An observation of pool ``default``; ``failed`` makes the metrics read fail."""
    return Observation(pool="default", active=active, starting=starting, draining=draining,
                       concurrency=concurrency, metrics=None if failed else metrics(**metric_fields))


def busy(workers: int, concurrency: int = 4, *, fraction: float = 1.0) -> dict:
    """Metric fields of a pool whose ``workers`` run ``fraction`` of their slots, steady."""
    running = round(workers * concurrency * fraction)
    return dict(running=running, completion_rate=running / 1.0, arrival_rate=running / 1.0)


def run(policy: PoolPolicy, ticks: Iterable[tuple[float, Observation]],
        history: History | None = None) -> list[Decision]:
    """Decide every ``(now, observation)`` in turn, passing each history on."""
    decisions = []
    for now, observation in ticks:
        decision = decide(observation, policy, history, now)
        history = decision.history
        decisions.append(decision)
    return decisions
