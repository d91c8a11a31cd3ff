"""What a demo run recorded, put in order: the live view's timeline and the burst's start chain.

Pure: text and records in, values out; demo.py does the reading.  The start
chain of one new worker is burst enqueued -> scale decision -> unit started ->
unit ready (READY=1) -> first job claimed.
"""

from __future__ import annotations

import dataclasses
import datetime
import statistics
from typing import Iterable, Mapping, Sequence

from plot import Sample, ScaleDecision, WorkerStart

from flexiqd.queue.owners import owner_parts

Entry = Sample | ScaleDecision
# The properties demo.py asks `systemctl show --timestamp=us+utc` for.
UNIT_PROPERTIES = "Id,ActiveState,MainPID,InactiveExitTimestamp,ActiveEnterTimestamp"
_SYSTEMD_UTC = "%a %Y-%m-%d %H:%M:%S.%f %Z"
_UNIT_PREFIX, _UNIT_SUFFIX = "flexiq-worker@", ".service"


def _when(entry: Entry) -> tuple[float, int]:
    # At the same instant a decision goes first: the row after it already shows its effect.
    return entry.at, isinstance(entry, Sample)


def timeline(samples: Iterable[Sample], decisions: Iterable[ScaleDecision]) -> list[Entry]:
    """Samples and decisions merged in the order they happened."""
    return sorted([*samples, *decisions], key=_when)


def release(pending: Sequence[Entry], horizon: float) -> tuple[list[Entry], list[Entry]]:
    """(the entries up to ``horizon`` in time order, the rest to hold back).

    A printed line cannot move, and a decision is read from the journal after
    the sample that follows it: the caller passes the latest sample's time, so
    nothing later can still turn up before a line it printed.
    """
    ordered = sorted(pending, key=_when)
    return [e for e in ordered if e.at <= horizon], [e for e in ordered if e.at > horizon]


@dataclasses.dataclass(frozen=True)
class Unit:
    """One worker unit as systemd showed it; times are epoch seconds, None when not (yet) reached."""

    instance: str   # "default-3" of flexiq-worker@default-3.service
    pid: int
    active: bool
    started_at: float | None  # the start job ran (InactiveExitTimestamp)
    ready_at: float | None    # systemd took its READY=1: this start's ActiveEnterTimestamp


def _systemd_time(text: str) -> float | None:
    if not text:
        return None
    return datetime.datetime.strptime(text, _SYSTEMD_UTC).replace(tzinfo=datetime.timezone.utc).timestamp()


def parse_units(text: str) -> list[Unit]:
    """The worker units in the output of ``systemctl show --timestamp=us+utc -p UNIT_PROPERTIES``."""
    units = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        name = fields.get("Id", "")
        if not (name.startswith(_UNIT_PREFIX) and name.endswith(_UNIT_SUFFIX)):
            continue
        started = _systemd_time(fields.get("InactiveExitTimestamp", ""))
        ready = _systemd_time(fields.get("ActiveEnterTimestamp", ""))
        # A restarted instance keeps its previous run's ActiveEnterTimestamp until it is ready again.
        if ready is not None and (started is None or ready < started):
            ready = None
        units.append(Unit(instance=name[len(_UNIT_PREFIX):-len(_UNIT_SUFFIX)], pid=int(fields.get("MainPID") or 0),
                          active=fields.get("ActiveState") == "active", started_at=started, ready_at=ready))
    return units


def _after(at: float | None, origin: float) -> float | None:
    return None if at is None else at - origin


def new_worker_starts(executions: Iterable[Mapping], units: Iterable[Unit], burst_at: float) -> list[WorkerStart]:
    """The start chain of each worker the burst brought, in seconds after ``burst_at``, by first job.

    ``executions``: the store's attempts (``Backend.executions()``: worker = lease owner
    ``host:instance:pid``, started_at = claimed at).  A worker is the burst's when it
    claimed nothing before it and its unit (matched by instance and pid) was not
    already started; a worker whose unit was never seen still counts, without unit times.
    """
    first: dict[str, float] = {}
    for row in executions:
        if row.get("started_at") is not None:
            first[row["worker"]] = min(row["started_at"], first.get(row["worker"], row["started_at"]))
    by_process = {(u.instance, u.pid): u for u in units}
    starts = []
    for owner, claimed in first.items():
        parts = owner_parts(owner)
        unit = by_process.get((parts[1], parts[2])) if parts else None
        started, ready = (unit.started_at, unit.ready_at) if unit else (None, None)
        if claimed < burst_at or (started is not None and started < burst_at):
            continue
        starts.append(WorkerStart(worker=parts[1] if parts else owner, started_at=_after(started, burst_at),
                                  ready_at=_after(ready, burst_at), first_job_at=claimed - burst_at))
    return sorted(starts, key=lambda s: s.first_job_at)


def chain_summary(decisions: Iterable[ScaleDecision], starts: Sequence[WorkerStart]) -> str:
    """One line: burst -> first scale-up -> first unit ready -> first job on a new worker."""
    parts = ["burst 0s"]
    up = next((d for d in sorted(decisions, key=lambda d: d.at) if d.at >= 0 and d.desired > d.previous), None)
    if up:
        parts.append(f"decision {up.previous}\u2192{up.desired} {up.at:.2f}s")
    ready = [s.ready_at for s in starts if s.ready_at is not None]
    if ready:
        parts.append(f"first unit ready {min(ready):.2f}s")
    if not starts:
        return " \u2192 ".join(parts) + "; no new worker ran a job"
    jobs = [s.first_job_at for s in starts]
    return (" \u2192 ".join(parts) + f" \u2192 first job on a new worker {jobs[0]:.2f}s "
            f"(median {statistics.median(jobs):.2f}s, last {jobs[-1]:.2f}s of {len(jobs)})")
