"""A pool's decision ``History`` across daemon restarts, and changes the policy did not decide.

``history_to_dict``/``history_from_dict`` turn a History into JSON-able data and
back, so the daemon can keep it with the operators' intent; an unreadable or
older shape comes back as a fresh ``History()`` (the cost: one down window of
caution), never an error.  ``with_external_change`` enters a change someone else
made (an operator's pin, a drain, the pool's creation) as if the policy had
decided it, so windows and rate limits account for it.  Pure.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from .config import PoolPolicy
from .economics import LONGEST_HOLD
from .smoothing import record, record_change
from .types import Decision, EvidenceTrack, History, KneeState, KneeTrim, LoadSample, ScaleChange, ThroughputSample, TimedCount


def history_to_dict(history: History) -> dict[str, Any]:
    return {
        "seeded": history.seeded,
        "recommendations": [list(r) for r in history.recommendations],
        "changes": [list(c) for c in history.changes],
        "load": [list(s) for s in history.load],
        "knee": {"samples": [list(s) for s in history.knee.samples],
                 "backlog_since": history.knee.backlog_since, "held_at": history.knee.held_at,
                 # a step under way (or the start an unclear one handed on) is not kept: judged afresh
                 "held_since": history.knee.held_since, "held_rate": history.knee.held_rate,
                 "trim": list(history.knee.trim) if history.knee.trim else None},
        # A probe's baseline outlives a restart; a hold does not (judged afresh on new readings).
        "evidence": [{"source": t.source, "unloaded": list(t.unloaded), "small": list(t.small)}
                     for t in history.evidence],
    }


def history_from_dict(data: Mapping[str, Any] | None) -> History:
    if not isinstance(data, Mapping):
        return History()
    try:
        knee = data.get("knee") or {}
        return History(
            seeded=bool(data.get("seeded", False)),
            recommendations=tuple(TimedCount(*r) for r in data.get("recommendations", ())),
            changes=tuple(ScaleChange(*c) for c in data.get("changes", ())),
            load=tuple(LoadSample(*s) for s in data.get("load", ())),
            knee=KneeState(samples=tuple(_throughput_sample(s) for s in knee.get("samples", ())),
                           backlog_since=knee.get("backlog_since"), held_at=knee.get("held_at"),
                           held_since=knee.get("held_since"), held_rate=knee.get("held_rate"),
                           trim=KneeTrim(*knee["trim"]) if knee.get("trim") else None),
            evidence=tuple(EvidenceTrack(source=str(t["source"]), unloaded=tuple(float(v) for v in t["unloaded"]),
                                         small=tuple(float(v) for v in t["small"]))
                           for t in data.get("evidence", ())),
        )
    except (TypeError, ValueError, AttributeError, KeyError):
        return History()


def _throughput_sample(saved: Any) -> ThroughputSample:
    # A state saved by an older version may carry fields this one no longer has (in-flight ages).
    return ThroughputSample(*list(saved)[:len(ThroughputSample._fields)])


def with_external_change(history: History | None, policy: PoolPolicy, now: float,
                         current: int, workers: int) -> History:
    """``history`` after the pool went from ``current`` to ``workers`` by someone else's hand."""
    history = history or History()
    if workers == current:
        return history
    down = LONGEST_HOLD if policy.behavior.down_window is None else policy.behavior.down_window
    keep = max(down, policy.behavior.up_window)
    return History(
        seeded=True,
        recommendations=record(history.recommendations, now, workers, keep),
        changes=record_change(history.changes, now, current, workers, policy.behavior),
        load=history.load,
        knee=history.knee,
        evidence=history.evidence,
    )


def entered_by_others(decision: Decision, before: History | None, policy: PoolPolicy, now: float,
                      workers: int) -> History:
    """The history after the pool went to ``workers`` by an operator's hand (or by being created),
    not by the policy's: its change replaces the one ``decision`` would have recorded."""
    base = replace(decision.history, changes=before.changes if before else ())
    return with_external_change(base, policy, now, decision.current, workers)
