"""The schedules' words, limits and settings that the store and the config share with the planner.

No calendar here: the store and the config model (which every worker loads) import
this without the cron parser and the time zones.
"""

from __future__ import annotations

import dataclasses

from ..settings_schema import default

# ``catch_up: all`` fires missed slots back this far at most; older ones are skipped.
# The ledger keeps its rows at least this long (``LEDGER_KEEP``).
CATCH_UP_HORIZON = 7 * 86400.0

# Why a slot was skipped, as the ledger, the journal and the metrics name it.
MISSED = "missed"       # later than max_delay, and catch_up did not fire it
OVERLAP = "overlap"     # overlap: skip, and the previous slot's job was still queued or running
PAUSED = "paused"       # flexiqctl schedule pause
SKIP_REASONS = (MISSED, OVERLAP, PAUSED)


@dataclasses.dataclass(frozen=True)
class CatchUp:
    """A schedule's answer to missed slots (the config's ``catch_up``, ``max_delay``, ``overlap``)."""

    catch_up: str = default("schedules.<name>.catch_up")
    max_delay: float = default("schedules.<name>.max_delay")
    overlap: str = default("schedules.<name>.overlap")
