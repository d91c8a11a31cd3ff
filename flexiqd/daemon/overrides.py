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
    staggered = None
    if override.paused:
        desired, reason, why = decision.current, "Paused", "paused by an operator: holding"
    elif override.pinned is not None:
        desired, reason = override.pinned, "Pinned"
        left = "" if override.until is None else f" for {override.until - now:.0f}s more"
        why = f"pinned at {override.pinned} by an operator{left}"
        staggered = staggered_start(decision, desired)
        if staggered is not None and is_stopping(staggered):
            desired = staggered.workers
            why += (f"; workers still stopping count against {staggered.cap.partition(':')[2] or 'max_workers'}: "
                    f"starting {desired - decision.current} now, the rest as they exit")
        elif staggered is not None:
            desired = staggered.workers
            why += f"; starting {desired - decision.current} now, as {staggered.cap} allows"
    else:
        return decision
    message = f"{why} (the policy wanted {decision.desired}: {decision.reason})"
    # A pin held back by stopping workers keeps that cap as its binding one: the loop then
    # decides again soon, as they exit (``Controller.waits_on_stopping``).
    binding = staggered if staggered is not None and is_stopping(staggered) else None
    return dataclasses.replace(decision, desired=desired, reason=reason, message=message, binding_cap=binding)


def staggered_start(decision: Decision, desired: int) -> CapValue | None:
    """The ``starting:<dependency>`` or ``stopping`` cap a pin that grows the pool to ``desired``
    must wait for, if any: an operator's count starts no more workers at once than the
    dependencies' ``start_burst`` allow, like the policy's (the rest follow, tick by tick, as
    those starting become ready), nor more than the workers still stopping leave room for
    (they count against max_workers and every dependency until they exit).  No other cap
    binds a pin."""
    if desired <= decision.current:
        return None
    waits = [cap for cap in decision.caps if (cap.cap.startswith("starting:") or is_stopping(cap))
             and cap.workers < desired]
    return min(waits, key=lambda cap: cap.workers) if waits else None


def is_stopping(cap: CapValue) -> bool:
    """Whether ``cap`` is one that workers still stopping hold down (``stopping``, ``stopping:<name>``)."""
    return cap.cap.partition(":")[0] == "stopping"
