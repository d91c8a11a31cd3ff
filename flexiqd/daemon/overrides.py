"""Operators' overrides of the policy (pin, drain, pause), applied to a decision.  Pure."""

from __future__ import annotations

import dataclasses

from ..config.model import PoolConfig
from ..policy import CapValue, Decision


@dataclasses.dataclass(frozen=True)
class Override:
    """``pinned``: hold this count (None: the policy decides) until ``until`` (None: until unpinned).
    ``paused``: workers claim nothing and the pool is held at its current count."""

    pinned: int | None = None
    until: float | None = None
    paused: bool = False

    def expired(self, now: float) -> bool:
        return self.pinned is not None and self.until is not None and now >= self.until and not self.paused


def apply_override(decision: Decision, override: Override, pool: PoolConfig, now: float) -> Decision:
    """The decision the fleet should follow; the policy's own stays in its message."""
    if override.paused:
        desired, reason, why = decision.current, "Paused", "paused by an operator: holding"
    elif override.pinned is not None:
        desired, reason = override.pinned, "Pinned"
        left = "" if override.until is None else f" for {override.until - now:.0f}s more"
        why = f"pinned at {override.pinned} by an operator{left}"
        staggered = staggered_start(decision, desired)
        if staggered is not None:
            desired = staggered.workers
            why += f"; starting {desired - decision.current} now, as {staggered.cap} allows"
    else:
        return decision
    message = f"{why} (the policy wanted {decision.desired}: {decision.reason})"
    return dataclasses.replace(decision, desired=desired, reason=reason, message=message, binding_cap=None)


def staggered_start(decision: Decision, desired: int) -> CapValue | None:
    """The ``starting:<dependency>`` cap a pin that grows the pool to ``desired`` must wait for,
    if any: an operator's count starts no more workers at once than the dependencies'
    ``start_burst`` allow, like the policy's (the rest follow, tick by tick, as those
    starting become ready).  No other cap binds a pin."""
    if desired <= decision.current:
        return None
    starting = [cap for cap in decision.caps if cap.cap.startswith("starting:") and cap.workers < desired]
    return min(starting, key=lambda cap: cap.workers) if starting else None
