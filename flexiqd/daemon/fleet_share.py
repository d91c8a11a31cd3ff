"""This host's side of the caps it shares with the other hosts (daemon.hosts): pure, from the config.

    global_caps   the caps shared: global dependencies' capacities, ``max_workers:<pool>``
    pool_uses     what one worker of a pool uses of each shared cap (per worker, weight)
    granted       each pool's grants of its shared caps, as the policy reads them
    host_report   what this host publishes with its beat: wants, workers, uses
"""

from __future__ import annotations

from typing import Mapping

from ..config.model import DaemonConfig, PoolConfig
from ..fleet.base import WorkerInfo
from ..policy import Decision, Observation


def global_caps(config: DaemonConfig) -> dict[str, float]:
    """The caps shared with the other hosts: global dependencies, ``max_workers:<pool>``."""
    caps = {name: config.dependencies[name].available for name in config.global_dependencies
            if name in config.dependencies}
    caps.update({f"max_workers:{pool}": float(count) for pool, count in config.global_max_workers.items()})
    return caps


def pool_uses(config: DaemonConfig, pool: PoolConfig) -> dict[str, list[float]]:
    """Per shared cap the pool draws on: [what one worker uses, its weight]."""
    uses = {use.dependency: [use.per_worker, use.weight] for use in pool.policy.dependencies
            if use.dependency in config.global_dependencies}
    if pool.name in config.global_max_workers:
        uses[f"max_workers:{pool.name}"] = [1.0, 1.0]
    return uses


def granted(config: DaemonConfig, observations: Mapping[str, Observation],
            grants: Mapping[str, Mapping[str, int]] | None) -> dict[str, dict[str, int]]:
    """Each pool's grants of its global caps: its share as of the last beat (``grants``); before
    the first beat (no share for it yet) it holds its count; with failing beats (``grants``
    None) it gets none."""
    caps = {}
    for name, obs in observations.items():
        wanted = pool_uses(config, config.pools[name])
        if not wanted:
            continue
        share = {} if grants is None else grants.get(name, {})
        caps[name] = {cap: (0 if grants is None else share.get(cap, obs.current)) for cap in wanted}
    return caps


def host_report(config: DaemonConfig, decisions: Mapping[str, Decision], observations: Mapping[str, Observation],
                workers: Mapping[str, list[WorkerInfo]]) -> dict:
    """What this host publishes with its beat: per pool with global caps, its uncapped want
    (within its bounds), the workers it runs (draining ones too) and what one of them uses.

    The want is the policy's ``raw_desired``, which an operator's override leaves as it was."""
    pools = {}
    for name, decision in decisions.items():
        pool, obs = config.pools[name], observations[name]
        uses = pool_uses(config, pool)
        if not uses:
            continue
        wants = min(max(decision.raw_desired, obs.current, pool.policy.floor), pool.policy.max_workers)
        pools[name] = {"wants": wants, "current": obs.current + obs.draining, "uses": uses}
    # When the oldest worker became active: one from before this daemon may run older code
    # (one not active yet has no time, and is one this daemon is starting).
    since = min((worker.started_at for running in workers.values() for worker in running
                 if worker.started_at is not None), default=None)
    return {"pools": pools, "workers_since": since}
