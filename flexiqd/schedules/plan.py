"""Which slots of a schedule are due, and what becomes of each: fire, or skip and why.

A *slot* is one instant the calendar fires at (UTC epoch seconds).  The ledger
holds one row per decided slot; the slots still to decide are the calendar's in
(``after``, ``now``], ``after`` being the ledger's newest slot of the schedule (or
when the schedule was first seen).  Each is judged by how late it is at ``now``:

- *on time* -- at most ``max_delay`` late (a restart, a leader-free handoff, a slow
  store): it fires, whatever ``catch_up`` says;
- *missed* -- later than that (every daemon was down, or the clock stepped
  forward): ``catch_up`` decides.  ``none``: skipped.  ``latest``: the newest of
  them fires when no slot after it is on time, the others are skipped.  ``all``:
  each fires, back to ``CATCH_UP_HORIZON``.

Skipped missed slots in a row are folded into one ledger row (at the newest of
them, counting them all), so a long outage of a fast schedule costs one row, not
one per slot.  Whether a slot that fires is then skipped after all -- the schedule
is paused, or its previous job still runs with ``overlap: skip`` -- is decided by
the store, in the slot's own transaction (``Backend.fire_slot``).

Pure: no clock reads, no I/O.
"""

from __future__ import annotations

import dataclasses

from ..settings_schema import setting
from .calendar import Calendar
from .words import CATCH_UP_HORIZON, MISSED, CatchUp

CATCH_UPS = setting("schedules.<name>.catch_up").choices
OVERLAPS = setting("schedules.<name>.overlap").choices
# Slots one plan looks at; a longer backlog is decided over several plans, oldest first.
SCAN_LIMIT = 100_000


@dataclasses.dataclass(frozen=True)
class Planned:
    """One ledger row to write: the slot ``at``; ``skip`` None to fire it (unless paused or
    overlapping), else why not; ``slots``: the calendar slots the row stands for (missed
    ones folded, this one the newest); ``late``: it is later than max_delay."""

    at: float
    skip: str | None = None
    slots: int = 1
    late: bool = False


def plan(calendar: Calendar, policy: CatchUp, after: float, now: float) -> list[Planned]:
    """The decisions for the slots in (``after``, ``now``], oldest first (see the module's rules)."""
    slots = calendar.between(after, now, SCAN_LIMIT)
    if not slots:
        return []
    # A plan cut short by SCAN_LIMIT has not reached the newest slot: none of its slots is it.
    complete = len(slots) < SCAN_LIMIT
    on_time_after = any(now - at <= policy.max_delay for at in slots)
    newest = slots[-1]
    decisions: list[Planned] = []
    folded = 0
    for at in slots:
        late = now - at > policy.max_delay
        if not late:
            fire = True
        elif policy.catch_up == "all":
            fire = now - at <= CATCH_UP_HORIZON
        elif policy.catch_up == "latest":
            fire = complete and at == newest and not on_time_after
        else:
            fire = False
        if fire:
            if folded:
                decisions.append(Planned(previous, MISSED, folded, True))
                folded = 0
            decisions.append(Planned(at, None, 1, late))
        else:
            folded += 1
            previous = at
    if folded:
        decisions.append(Planned(previous, MISSED, folded, True))
    return decisions


def next_fire(calendar: Calendar, after: float, now: float) -> float:
    """The next slot to fire: the first after ``now`` -- or after ``after``, the ledger's newest
    slot, when that is later (the clock stepped back: slots already fired do not fire again)."""
    return calendar.next_fires(max(after, now), 1)[0]
