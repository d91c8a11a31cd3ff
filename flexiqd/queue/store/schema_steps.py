"""How a store's schema changes while processes of two versions share it: expand, then contract.

During a rolling upgrade some hosts run version N and the others N-1, on one schema.
Each dialect numbers its schema changes (*steps*, ``MIGRATIONS`` in postgres/schema.py
and sqlite/schema.py) and says of each which kind it is:

- ``EXPAND`` adds what version N needs and N-1 does not see: a table, a nullable
  column or one with a default, an index, a function, a trigger that N-1's writes
  still satisfy.  Applied at once by the first process of version N to open the store.
- ``CONTRACT`` takes away or changes what N-1 uses: a dropped or renamed column or
  table, NOT NULL on an existing column, a changed meaning of existing rows.  N's code
  must work without it (it is cleanup, never something N needs), so it waits until no
  live host may run code older than the step (``older_hosts_alive``), then applies.
- ``BREAKING``: a step from before this rule, applied at once and refusing older
  code.  History only: a new step is never breaking.

Two numbers are kept.  The *level* -- the number older code compares with its own
("newer than this flexiqd understands: upgrade flexiqd") -- is the last contract (or
breaking) step applied: expand steps leave it where it was, so older code takes an
expanded schema for its own.  Which steps were applied is kept beside it, in a table
older code never reads.  A store from before that table counts every step up to its
level as applied.

Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Callable, Mapping, Sequence

from ...errors import StoreUnavailable


class Kind(enum.Enum):
    EXPAND = "expand"
    CONTRACT = "contract"
    BREAKING = "breaking"


@dataclasses.dataclass(frozen=True)
class Step:
    number: int
    kind: Kind
    statements: tuple[str, ...]

    @property
    def raises_level(self) -> bool:
        return self.kind is not Kind.EXPAND


def steps_of(migrations: Mapping[int, Sequence[str]], kinds: Mapping[int, Kind]) -> tuple[Step, ...]:
    """The steps of a dialect, in order: each migration with its declared kind (step 1, the
    first schema, has no statements of its own).  A migration without a kind is a mistake
    the dialect's tests catch at once."""
    numbers = sorted({1, *migrations})
    missing = [number for number in numbers if number not in kinds]
    if missing:
        raise ValueError(f"schema steps {missing} declare no kind (expand or contract: "
                         f"see the module docstring of flexiqd.queue.store.schema_steps)")
    return tuple(Step(number, kinds[number], tuple(migrations.get(number, ()))) for number in numbers)


def newest(steps: Sequence[Step]) -> int:
    """The newest step this code knows: the schema version it reports."""
    return max(step.number for step in steps)


def level_of(steps: Sequence[Step], applied: frozenset[int]) -> int:
    """The level of a schema with ``applied`` steps: its last contract or breaking step."""
    return max((step.number for step in steps if step.number in applied and step.raises_level), default=0)


def fresh_level(steps: Sequence[Step]) -> int:
    """The level of a store created whole by this code."""
    return level_of(steps, frozenset(step.number for step in steps))


def too_new(steps: Sequence[Step], level: int) -> bool:
    """Whether a store at ``level`` took a contract step this code does not know: it may lack
    something this code uses.  The same test older code makes with its own newest step."""
    return level > newest(steps)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What opening a store does to its schema.

    ``run``: the steps to apply now, in order; ``earlier``: the steps a store from before
    the steps were recorded took, to record as applied; ``waiting``: contract steps held back while
    older hosts live; ``level``: the level to record; ``record``: whether anything is to be
    written at all (steps to run, a level to change, or the applied steps to record for the
    first time)."""

    run: tuple[Step, ...]
    waiting: tuple[Step, ...]
    level: int
    record: bool
    earlier: tuple[Step, ...] = ()


def plan(steps: Sequence[Step], level: int, applied: frozenset[int] | None,
         older_hosts_alive: Callable[[int], bool]) -> Plan:
    """The plan for a store at ``level`` with ``applied`` steps (None: a store from before
    the steps were recorded, where every step up to ``level`` was applied).

    ``older_hosts_alive(n)``: whether a live host may run code that does not know step
    ``n``; asked only when a contract step is pending.  The caller has checked ``too_new``.
    """
    known = frozenset(step.number for step in steps)
    done = frozenset(n for n in known if n <= level) if applied is None else applied
    run, waiting = [], []
    for step in steps:
        if step.number in done:
            continue
        if step.kind is Kind.CONTRACT and older_hosts_alive(step.number):
            waiting.append(step)
        else:
            run.append(step)
    after = done | {step.number for step in run}
    # Never down a level: a newer host may have raised it, and on a store from before the
    # steps were recorded, code of that time checks for its own level exactly (lowered,
    # it would run its migrations again over tables that exist).
    new_level = max(level, level_of(steps, after))
    earlier = tuple(step for step in steps if step.number in done) if applied is None else ()
    return Plan(run=tuple(run), waiting=tuple(waiting), level=new_level,
                record=bool(run) or applied is None or new_level != level, earlier=earlier)


def opening_plan(steps: Sequence[Step], level: int, applied: Callable[[], frozenset[int] | None],
                 older_hosts_alive: Callable[[int], bool], *, store: str) -> Plan:
    """What opening a store at ``level`` has to do: every step on a fresh store (level 0), else
    ``plan`` with the steps ``applied()`` reads.  StoreUnavailable, naming ``store``, when the
    store took a contract step this code does not know."""
    if too_new(steps, level):
        raise StoreUnavailable(
            f"the queue database {store} has schema version {level}, newer than "
            f"this flexiqd understands ({newest(steps)}): upgrade flexiqd")
    if level == 0:
        return Plan(run=tuple(steps), waiting=(), level=fresh_level(steps), record=True)
    return plan(steps, level, applied(), older_hosts_alive)


def host_is_older(report: Mapping[str, object], step: int, dialect: str) -> bool:
    """Whether a host, by the report of its last beat, may run code that does not know ``step``
    of ``dialect``'s schema.  Hosts of versions before the schema was reported say nothing,
    and count as older."""
    schema = report.get("schema")
    known = schema.get(dialect) if isinstance(schema, dict) else None
    return not isinstance(known, int) or known < step


def describe_schema(level: int, applied: frozenset[int] | None) -> str:
    """The schema as ``flexiqd --check-config`` shows it: its newest step, and the level
    older code reads where the two differ."""
    if not level:
        return "schema not created yet (the first process creates it)"
    version = max(applied, default=level) if applied is not None else level
    if version == level:
        return f"schema version {version}"
    return f"schema version {version} (level {level}: flexiqd of schema version {level} or later can use it)"
