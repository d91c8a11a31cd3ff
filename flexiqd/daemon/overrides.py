"""Operators' overrides of the policy (pin, drain, pause), applied to a decision.  Pure."""

from __future__ import annotations

import dataclasses

from ..config.model import PoolConfig
from ..policy import Decision


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
    else:
        return decision
    message = f"{why} (the policy wanted {decision.desired}: {decision.reason})"
    return dataclasses.replace(decision, desired=desired, reason=reason, message=message, binding_cap=None)
