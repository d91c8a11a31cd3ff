"""Direct evidence of a ceiling: a dependency's timed probe, the pool's cgroup pressure (PSI).

The knee (``knee``) infers a ceiling from throughput; where the operator can
give more, the daemon reads it each tick and this module judges it.  Two kinds
of source, each a reading per decision (``EvidenceReading``):

- ``probe:<dependency>``: how long a statement, a TCP connect or an HTTP GET
  took on the dependency -- the request path's latency.  It is *high* when it
  exceeds ``factor`` x its **baseline** and by at least ``MIN_RISE`` seconds.
  The baseline is the median of the last ``BASELINE_READINGS`` readings taken
  while the pool ran no job (the dependency unloaded by this pool); a pool that
  has not been idle since the daemon started uses the readings taken while at
  most one worker's slots were busy; with neither, there is no baseline and the
  probe decides nothing.
- ``pressure:<resource>`` (cpu, io, memory): the share of time the pool's
  workers stalled on that resource since the previous tick (PSI ``some``, percent).
  It is *high* at or above the pool's threshold.

Judged on the median of the last ``RECENT_READINGS`` readings, so one slow
probe or one spike is no rise.  The rule, the same for every source:

1. while the latest reading is within bounds, the source remembers the workers
   at work (running jobs in whole workers: one just started loads nothing yet),
   the fewer of those at this reading and at the previous one (a reading tells
   of the load since the previous), at least one -- the count before any rise;
2. once the median is high, the pool is **held** at the fewer of its current
   count and that count before the rise (and, while a step of the knee is under
   way, the count the step grew from: the rise is the step's doing): it stops
   adding workers, and shrinks
   back to where the dependency (or the host) was still fine.  Cap
   ``probe:<dependency>`` or ``pressure:<resource>``;
3. the hold lasts while the source stays high and ``hold`` seconds more (the
   knee's ``reprobe_interval``; twice its ``settle_time`` while the oldest job
   is late): then growth may try again, and a new rise holds it again.

A reading of None (the probe failed or timed out, no PSI on this host) is no
information, never "no load": it changes nothing, neither holding nor
releasing the pool; a hold already made runs its course.

Pure: time is an argument, nothing is read or remembered outside ``EvidenceTrack``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

from .config import EvidenceRule, KneeConfig
from .types import CapValue, EvidenceTrack, Observation

# A rise must also be this many seconds above the baseline: a probe of a few milliseconds
# triples when the host's CPU is busy (the workers' own starts and claims), with no ceiling.
MIN_RISE = 0.010

# Readings kept for the judgement (its median) and for a probe's baseline.
RECENT_READINGS = 3
BASELINE_READINGS = 15

# The sources' kinds, as the cap names and the readings spell them.
PROBE = "probe"
PRESSURE = "pressure"


def kind_of(source: str) -> str:
    return source.split(":", 1)[0]


def baseline(track: EvidenceTrack) -> float | None:
    """A probe's unloaded latency: the median of its idle readings, else of its small-pool ones."""
    if track.unloaded:
        return statistics.median(track.unloaded)
    if len(track.small) >= RECENT_READINGS:
        return statistics.median(track.small)
    return None


def bound(track: EvidenceTrack, rule: EvidenceRule) -> float | None:
    """The reading above which the source is high (None: not known yet)."""
    if kind_of(rule.source) == PRESSURE:
        return rule.threshold
    base = baseline(track)
    if base is None:
        return None
    return max(base * rule.threshold, base + MIN_RISE)


def level(track: EvidenceTrack) -> float | None:
    """What the source is judged on: the median of its recent readings."""
    return statistics.median(track.recent) if track.recent else None


def is_high(track: EvidenceTrack, rule: EvidenceRule) -> bool:
    limit, now_level = bound(track, rule), level(track)
    if limit is None or now_level is None:
        return False
    return now_level >= limit if kind_of(rule.source) == PRESSURE else now_level > limit


def hold_for(knee: KneeConfig, late: bool) -> float:
    """How long a hold outlasts the last high reading: the knee's ``reprobe_interval``, and
    ``2 x settle_time`` while late (not bounded by the age target as the knee's late re-probe
    is: a probe's reading is no noisy count)."""
    return 2 * knee.settle_time if late else knee.reprobe_interval


def update_evidence(tracks: tuple[EvidenceTrack, ...], obs: Observation, rules: tuple[EvidenceRule, ...],
                    knee: KneeConfig, now: float, late: bool,
                    step_from: int | None = None) -> tuple[EvidenceTrack, ...]:
    """Every rule's track after this decision's readings (tracks of sources no longer heeded are dropped).

    ``step_from``: the count a step of the knee under way grew from (None: none under way); a rise
    during the step is the step's doing, so the count before it is at most that."""
    readings = {reading.source: reading.value for reading in obs.evidence}
    known = {track.source: track for track in tracks}
    return tuple(_update(known.get(rule.source) or EvidenceTrack(source=rule.source), readings.get(rule.source),
                         rule, obs, hold_for(knee, late), now, step_from)
                 for rule in rules)


def busy_workers(obs: Observation) -> int:
    """The workers at work: their running jobs in whole workers, at most the active ones (a worker
    that has just started loads nothing yet)."""
    if obs.metrics is None:
        return obs.active
    return min(obs.active, math.ceil(obs.metrics.running / obs.concurrency))


def _update(track: EvidenceTrack, value: float | None, rule: EvidenceRule, obs: Observation,
            hold: float, now: float, step_from: int | None = None) -> EvidenceTrack:
    if track.held_at is not None and track.high_at is not None and now - track.high_at > hold:
        track = replace(track, held_at=None)
    if value is None:
        # No information: nothing is learned, the count before a rise is not moved.
        return track
    working = busy_workers(obs)
    # The reading was taken since the previous one: it tells of the load of the fewer workers.
    before = working if track.before is None else min(working, track.before)
    track = replace(track, recent=(track.recent + (value,))[-RECENT_READINGS:], before=working)
    if kind_of(rule.source) == PROBE and obs.metrics is not None:
        running = obs.metrics.running
        if running == 0:
            track = replace(track, unloaded=(track.unloaded + (value,))[-BASELINE_READINGS:])
        elif running <= obs.concurrency:
            track = replace(track, small=(track.small + (value,))[-BASELINE_READINGS:])
    limit = bound(track, rule)
    if limit is None:
        return track
    if is_high(track, rule):
        held = min(obs.current, track.last_good if track.last_good is not None else obs.current,
                   max(1, step_from) if step_from is not None else obs.current)
        return replace(track, high_at=now, held_at=held if track.held_at is None else min(track.held_at, obs.current))
    if value <= limit and track.held_at is None:
        # An idle pool's count before a rise is one worker: it loaded nothing, and was fine.
        track = replace(track, last_good=max(1, before))
    return track


def evidence_caps(tracks: tuple[EvidenceTrack, ...]) -> tuple[CapValue, ...]:
    """A cap per source that holds the pool now."""
    return tuple(CapValue(track.source, track.held_at) for track in tracks if track.held_at is not None)


def describe(track: EvidenceTrack, rule: EvidenceRule) -> str:
    """A held source in words, with its figures: what the decision's sentence says."""
    now_level = level(track)
    if kind_of(rule.source) == PRESSURE:
        resource = rule.source.split(":", 1)[1]
        shown = "no reading" if now_level is None else f"{now_level:.0f}%"
        return (f"the workers' {resource} pressure {shown} (share of time stalled), at or above {rule.threshold:g}%"
                f" since {track.last_good if track.last_good is not None else track.held_at} workers")
    base = baseline(track)
    if now_level is None or base is None:
        return "the probe's latency rose"
    return (f"the probe's latency {now_level * 1000:.1f} ms against a baseline of {base * 1000:.1f} ms"
            f" ({now_level / base:.1f}x, over {rule.threshold:g}x); fine at "
            f"{track.last_good if track.last_good is not None else track.held_at} workers")
