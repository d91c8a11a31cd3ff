"""Stage 3, caps: ceilings on the worker count, and which one binds.

``max`` is the configured maximum; ``dependency:<name>`` the pool's share of
a declared dependency (see ``sharing``); ``latency:<name>`` holds the pool at
its current count while that dependency is slower than the pool's
``max_latency`` for it; ``starting:<name>`` keeps the workers of a
dependency's users that start at once within its ``start_burst`` (see
``starting_allowance``); ``knee`` is the discovered ceiling (see ``knee``);
``stopping`` and ``stopping:<name>`` hold growth while workers that were asked to
stop have not exited yet: they still count against max_workers and hold what
one worker uses of each dependency (the pool's ``DependencyCap.stopping``, set
by ``fleet.decide_fleet``).  ``probe:<name>`` and ``pressure:<resource>`` hold the
pool at the count before a dependency's probe or the pool's cgroup pressure rose
(see ``evidence``).
Caps are applied to the signals' recommendation and again after smoothing,
so a stabilisation window can never keep a pool above a ceiling.
"""

from __future__ import annotations

from .config import PoolPolicy
from .sharing import DependencyCap
from .types import CapValue, Observation

# Cap name -> the reason token when it binds.
CAP_REASONS = {
    "max": "CappedByMax",
    "dependency": "CappedByDependency",
    "latency": "CappedByLatency",
    "knee": "CappedByKnee",
    "starting": "StartStaggered",
    "stopping": "WaitingForStopping",
    "probe": "CappedByProbe",
    "pressure": "CappedByPressure",
}


def starting_allowance(burst: int, starting: int, granted: int = 0) -> int:
    """New starts a pool may add now: ``burst`` less the users' workers already ``starting`` and
    the starts ``granted`` to pools decided before it this tick (never negative)."""
    return max(0, burst - starting - granted)


def collect_caps(
    obs: Observation, policy: PoolPolicy, knee: int | None, dependency_cap: DependencyCap | None,
    start_allowances: tuple[tuple[str, int], ...] = (), evidence: tuple[CapValue, ...] = (),
) -> tuple[CapValue, ...]:
    """Every ceiling that applies to this pool now, ``max`` first.

    ``knee``: the knee's cap (``knee.knee_cap``), None when nothing holds growth.
    ``start_allowances``: ``(dependency, new starts allowed now)`` per
    declared dependency the pool uses (see ``starting_allowance``).
    ``evidence``: the caps of direct evidence (``evidence.evidence_caps``).
    """
    caps = [CapValue("max", policy.max_workers)]
    caps.extend(CapValue(f"starting:{name}", obs.current + allowed) for name, allowed in start_allowances)
    if dependency_cap is not None:
        caps.extend(CapValue(f"dependency:{name}", workers) for name, workers in dependency_cap.per_dependency)
        caps.extend(CapValue(name, workers) for name, workers in dependency_cap.stopping)
    if obs.metrics is not None:
        for use in policy.dependencies:
            latency = obs.metrics.dependency_latency(use.dependency)
            if use.max_latency is not None and latency is not None and latency > use.max_latency:
                caps.append(CapValue(f"latency:{use.dependency}", obs.current))
    if knee is not None:
        caps.append(CapValue("knee", knee))
    caps.extend(evidence)
    return tuple(caps)


def tightest(caps: tuple[CapValue, ...]) -> CapValue:
    """The lowest cap (the first of equals, so ``max`` wins a tie)."""
    return min(caps, key=lambda cap: cap.workers)


def apply_caps(workers: int, caps: tuple[CapValue, ...]) -> tuple[int, CapValue | None]:
    """``workers`` under every cap, and the cap that lowered it (None if none did)."""
    lowest = tightest(caps)
    if lowest.workers < workers:
        return lowest.workers, lowest
    return workers, None


def cap_reason(cap: CapValue) -> str:
    return CAP_REASONS[cap.cap.split(":", 1)[0]]
