"""What a start costs, and the rules that follow from it.

A flexiqd worker is a systemd unit: it starts in well under a second and
drains without losing work.  Holding an idle worker costs its slot time;
giving it back and starting one later costs one start.  These functions turn
that into numbers the decision uses: the start cost (measured, or the
configured fallback), how long an idle worker is worth holding (rent or
buy), the age signal's lead time, and what a reversal cost.  Pure.
"""

from __future__ import annotations

from .config import Behavior, Targets
from .types import Observation, ScaleChange

# One decision interval of the daemon (``interval``'s default): a worker asked
# for now is noticed by the queue at the earliest a start cost later, and the
# next decision that can see it comes up to a tick after that.
DEFAULT_TICK = 5.0

# A start that does not fit in the age target at all (start cost >= age) is
# never cheap to repeat: the idle worker is held this long, the HPA's window.
LONGEST_HOLD = 300.0


def start_cost(obs: Observation, behavior: Behavior) -> float:
    """Seconds from a start decision to the worker's first claim: measured, else ``behavior.start_cost``."""
    return start_cost_or_default(obs.start_cost, behavior)


def start_cost_or_default(measured: float | None, behavior: Behavior) -> float:
    return behavior.start_cost if measured is None else measured


def break_even_hold(cost: float, age_target: float, tick: float = DEFAULT_TICK) -> float:
    """How long an idle worker is held before it is given back (the rent-or-buy break-even time).

    Holding an idle worker for as long as one start costs and then giving it
    back is never worse than twice the offline optimum (Karlin et al., 1988).
    A start is only that cheap while a restarted worker still claims the
    oldest job within its target: a job that arrives after the worker left
    waits for the next decision (up to a ``tick``) and then a start.  Where
    that reaction fits in the age target, the hold is the start cost; the age
    signal's lead time already asks for workers that long before a job is due.
    Where it does not fit at all, every restart makes a job late, and the idle
    worker is held for ``LONGEST_HOLD``.
    """
    if cost <= 0:
        return 0.0
    if cost + tick >= age_target:
        return LONGEST_HOLD
    return cost


def tick(obs: Observation) -> float:
    """Seconds between decisions: the observation's, else the daemon's default."""
    return DEFAULT_TICK if obs.tick is None else obs.tick


def down_hold(obs: Observation, behavior: Behavior, targets: Targets) -> float:
    """The down window in force: the operator's ``behavior.down_window``, else the break-even hold."""
    if behavior.down_window is not None:
        return behavior.down_window
    return break_even_hold(start_cost(obs, behavior), targets.age, tick(obs))


def lead_time(targets: Targets, cost: float, interval: float = DEFAULT_TICK) -> float:
    """How long before a job reaches its target the age signal acts.

    ``targets.lead_time`` when set; otherwise the start cost plus one decision
    ``interval``, never more than half the age target (so a short target alone
    is valid).
    """
    if targets.lead_time is not None:
        return targets.lead_time
    return min(cost + interval, targets.age / 2)


def reversal(changes: tuple[ScaleChange, ...], now: float, change: int, window: float) -> int:
    """Workers a scale-up restarts that a scale-down gave back less than ``window`` seconds ago.

    Such a reversal is what the break-even hold trades against holding: it
    is allowed (the hold already waited as long as a start costs) and
    reported with its cost, workers x start cost.  A scale-down after a
    scale-up costs nothing more (the starts were paid) and is not counted.
    """
    if change <= 0:
        return 0
    given_back = -sum(c.change for c in changes if c.at > now - window and c.change < 0)
    return min(change, given_back)
