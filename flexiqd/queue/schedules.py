"""The schedules' ledger in the store: one row per decided slot, written with the slot's job.

A slot is keyed by (schedule, slot as a UTC instant).  Whoever fires it -- any
daemon on any host -- inserts the slot's row with ``ON CONFLICT DO NOTHING`` and,
only when that inserted a row, the job, in the same transaction
(``Backend.fire_slot``): two daemons deciding one slot at once produce one job,
and a daemon killed before its commit leaves the slot undecided for the next.
Nothing rests on leadership or on a daemon's memory.

The ledger is apart from the jobs: deleting finished jobs (retention, ``flexiq
purge``) never touches it.  Its rows are pruned once older than ``LEDGER_KEEP``
(past the catch-up horizon), except each schedule's newest, which is where the
next decision starts.  ``flexiqctl schedule run`` is recorded in it too, as a row
of kind ``run`` (never a slot's key).

``schedules`` holds one row per schedule name: when it was first seen (no slot
before it fires), whether it is paused (the same for every host), and how many
slots it fired and skipped in all.

Pure: no clock reads, no I/O.
"""

from __future__ import annotations

import dataclasses

from ..schedules.words import CATCH_UP_HORIZON
from .types import JobState, NewJob

# The ledger keeps a row this long after its slot (then only each schedule's newest).
LEDGER_KEEP = CATCH_UP_HORIZON + 86400.0

SLOT = "slot"   # a slot of the calendar
RUN = "run"     # flexiqctl schedule run: fired outside the slots
FIRED = "fired"
SKIPPED = "skipped"


@dataclasses.dataclass(frozen=True)
class SlotDecision:
    """What a firing daemon asks the store to write for one slot (see ``schedules.plan``).

    ``skip``: the planned reason to skip it (None: fire it, unless the schedule is
    paused, or ``overlap_skip`` and the job of the slot before is still queued or
    running); ``slots``: the calendar slots this row stands for.
    """

    schedule: str
    at: float
    job: NewJob
    skip: str | None = None
    slots: int = 1
    overlap_skip: bool = False
    late: bool = False


@dataclasses.dataclass(frozen=True)
class SlotOutcome:
    """What became of a slot this caller decided: ``fired`` with ``job_id``, or ``skipped``
    for ``reason`` (``slots`` of them)."""

    schedule: str
    at: float
    outcome: str
    reason: str | None
    job_id: int | None
    slots: int = 1
    late: bool = False


@dataclasses.dataclass(frozen=True)
class LedgerRow:
    """One row of the ledger, with the state of its job now (None: none, or deleted since)."""

    schedule: str
    kind: str
    at: float
    outcome: str | None
    reason: str | None
    slots: int
    job_id: int | None
    host: str
    decided_at: float
    job_state: JobState | None = None


@dataclasses.dataclass(frozen=True)
class ScheduleRecord:
    """A schedule as the store knows it: ``since`` (first seen), ``paused``, the totals,
    its newest slot row (``last``) and its newest manual run (``last_run``)."""

    name: str
    since: float
    paused: bool = False
    fired: int = 0
    skipped: int = 0
    last: LedgerRow | None = None
    last_run: LedgerRow | None = None

    @property
    def cursor(self) -> float:
        """Where the next decision starts: the newest slot decided, or when it was first seen."""
        return max(self.since, self.last.at) if self.last is not None else self.since


def ledger_row(row: tuple) -> LedgerRow:
    """A LedgerRow from (schedule, kind, slot, outcome, reason, slots, job_id, host, decided_at, job state)."""
    schedule, kind, at, outcome, reason, slots, job_id, host, decided_at, state = row
    return LedgerRow(schedule=schedule, kind=kind, at=float(at), outcome=outcome, reason=reason, slots=int(slots),
                     job_id=job_id, host=host, decided_at=float(decided_at),
                     job_state=JobState(state) if state else None)
