"""The scaling policy: pure decision code, metrics in, desired worker count and reason out.

A decision runs these stages in order (see ``decide``):
signals -> combine -> cap -> smooth -> clamp.

Typical use, once per tick and pool::

    metrics = PoolMetrics.from_queue_stats(queue_stats)          # None if the read failed
    obs = Observation(pool="default", active=3, starting=1, draining=0,
                      concurrency=4, metrics=metrics)
    decision = decide(obs, policy, history, now)                  # policy: PoolPolicy
    history = decision.history                                    # keep for the next tick
    log.info("%s", decision.line())

``decide_fleet`` decides every pool at once -- sharing the dependencies, the
fleet's global caps and the starts a dependency allows -- and is what the
daemon and the simulator run.  No I/O, no clock reads, no logging; standard library only
(and ``flexiqd.settings_schema``, the settings' defaults, which is data).
"""

from .config import (
    Behavior,
    Dependency,
    DependencyUse,
    KneeConfig,
    PoolPolicy,
    RateLimit,
    Targets,
    pool_policy_from_mapping,
)
from .decide import decide
from .errors import PolicyConfigError
from .fleet import FLEXIQ, FLEXIQD, PoolInput, decide_fleet, decision_line
from .flexiq_compat import (
    FlexiqResult,
    compute_desired_workers,
)
from .sharing import DependencyCap, PoolDemand, share_dependencies, water_fill
from .types import (
    CapValue,
    Decision,
    DependencyObservation,
    History,
    Observation,
    PoolMetrics,
    SignalRecommendation,
)

__all__ = [
    "Behavior", "CapValue", "Decision", "Dependency", "DependencyCap", "DependencyObservation",
    "DependencyUse", "FlexiqResult", "History", "KneeConfig", "Observation",
    "PolicyConfigError", "PoolDemand", "PoolInput", "PoolMetrics", "PoolPolicy", "RateLimit",
    "SignalRecommendation", "Targets", "compute_desired_workers",
    "FLEXIQ", "FLEXIQD", "decide", "decide_fleet", "decision_line", "pool_policy_from_mapping",
    "share_dependencies", "water_fill",
]
