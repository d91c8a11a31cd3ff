"""One decision: observation + policy + history + now -> Decision (with the next history).

The stages, in order, each its own function:

1. signals  -- every signal's recommendation (``signals``), the age, drain
               and utilisation signals at most the fewest workers that keep
               the age target (``lean``);
2. combine  -- the largest recommendation wins, as in the HPA: the raw
               (prenormalized) count;
3. cap      -- max_workers, dependency shares, dependency latency,
               staggered starts of a dependency's users, the knee,
               direct evidence (a dependency's probe, the pool's cgroup
               pressure: ``evidence``) (``caps``) -> capped; this is what the windows record (with
               its sustained part: what keeping up with arrivals takes,
               without draining the backlog);
4. smooth   -- the down window (by default the start cost's break-even
               hold, ``economics.break_even_hold``: an idle worker is kept
               only while that is cheaper than starting one again; an
               operator's ``behavior.down_window`` replaces it), the up
               window, the tolerance band (no change of 10 % or less,
               unless the pool is overloaded), rate limits for the noisy
               signals only (``smoothing``) -> stabilized;
5. clamp    -- the caps again as hard ceilings, then the floor (min_workers;
               one worker while jobs wait or run) -> desired.

The tolerance comes before the clamp, so it can never hold a pool below its
minimum; nor does it hold back growth to a cap that bounds what the signals
want (a capped wish is not noise).  The windows record the capped count, not
the one the tolerance held: a band that holds 11 workers while the signals
want 10 must not keep asking for 11 for the next five minutes.  Likewise, once the backlog has been
gone for ``DRAINED_BACKLOG_HOLD``, the down window counts only the sustained
part of each recommendation: the workers added to drain a backlog have done
that work, and keeping them for the rest of the window would keep a
burst-sized pool for a load that is no longer there.  A failed metrics read
(``metrics is None``) skips every stage: the pool is held and nothing is
recorded that could later pass for a low recommendation.  A scale-up that
restarts workers given back within ``REVERSAL_WINDOW`` is reported (tag
``reversal``, and its cost in starts in the sentence).

Pure: no clock, no I/O, no logging; the same arguments give the same Decision.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .caps import apply_caps, cap_reason, collect_caps, tightest
from .config import PoolPolicy
from .economics import down_hold, reversal, start_cost
from .evidence import describe as describe_evidence, evidence_caps, update_evidence
from .knee import describe, knee_cap, update_knee
from .lean import cap_to_lean, lean_count
from .sharing import DependencyCap
from .signals import backlog_is_late, jobs_of_active_workers, record_load, recommend_all, signal_inputs, sustained_need
from .smoothing import rate_limit, record, record_change, stabilize
from .types import CapValue, Decision, History, LoadSample, Observation, SignalRecommendation, TimedCount


# 11 / 10 - 1 is 0.10000000000000009 in floating point: a ratio exactly at the
# tolerance must count as inside it.
_EPSILON = 1e-9

# How long the pool keeps what it grew to for a backlog once the backlog is
# gone, before the down window counts only what keeping up with arrivals takes.
# It matters only with a long down window: an operator's ``behavior.down_window``,
# or the longest hold, where a restart does not fit in the age target; the
# break-even hold is otherwise one start's cost.
DRAINED_BACKLOG_HOLD = 120.0

# Changes are remembered this long to report reversals (a scale-up that
# restarts workers given back less than this ago, or the other way round).
REVERSAL_WINDOW = 120.0

# The signals that can be noise: the up rate limit applies when one of these
# wins.  A backlog's age and drain (and work coming due) start what they need
# at once, up to the caps.
NOISY_SIGNALS = frozenset({"util", "cpu", "saturation", "depth"})


@dataclass(frozen=True, kw_only=True)
class Combined:
    """Stages 1-2 of one pool: enough to state its demand on shared dependencies."""

    obs: Observation
    policy: PoolPolicy
    history: History
    now: float
    recommendations: tuple[SignalRecommendation, ...]
    winner: SignalRecommendation | None
    raw: int
    sustained: int
    late: bool
    lean: int | None = None  # the lean count (``lean``); None: the pool does not run lean

    @property
    def demand(self) -> int:
        """Workers the pool would keep or reach, for sharing dependencies with others."""
        return min(max(self.raw, self.obs.current, self.policy.floor), self.policy.max_workers)


def decide(
    observation: Observation,
    policy: PoolPolicy,
    history: History | None,
    now: float,
    dependency_cap: DependencyCap | None = None,
) -> Decision:
    """Decide one pool's worker count at ``now`` (seconds, any epoch).

    ``history`` is the one returned by this pool's previous decision (None or
    ``History()`` at start).  ``dependency_cap`` is this pool's entry of
    ``share_dependencies``; without it declared dependencies do not cap (use
    ``decide_fleet`` to share them).  Pure and deterministic.
    """
    history = history or History()
    if observation.metrics is None:
        return hold(observation, policy, history)
    return finish(combine_signals(observation, policy, history, now), dependency_cap)


def combine_signals(obs: Observation, policy: PoolPolicy, history: History, now: float) -> Combined:
    """Stages 1 and 2: signals, the largest wins."""
    assert obs.metrics is not None
    load = record_load(history.load, now, obs)
    inputs = signal_inputs(obs, policy, load)
    wanted = recommend_all(inputs)
    lean = lean_count(inputs, load)
    recommendations = cap_to_lean(wanted, lean)
    # Held or shrunk on the lean count: a backlog kept on purpose is no ceiling's evidence.
    kept = lean is not None and lean <= obs.current and recommendations != wanted
    history = replace(history, load=load,
                      knee=update_knee(history.knee, obs, policy.knee, now, load, policy.targets.age, kept,
                                       policy.max_workers))
    raw, winner = combine(recommendations)
    return Combined(
        obs=obs, policy=policy, history=history, now=now, recommendations=recommendations, winner=winner, raw=raw,
        sustained=sustained_need(inputs, raw), late=backlog_is_late(inputs), lean=lean,
    )


def combine(recommendations: tuple[SignalRecommendation, ...]) -> tuple[int, SignalRecommendation | None]:
    """The largest recommendation and the one that made it (0 and None when no signal has an opinion)."""
    if not recommendations:
        return 0, None
    best = max(recommendations, key=lambda rec: rec.workers)  # max() keeps the first of equals
    return best.workers, best


def within_tolerance(raw: int, current: int, tolerance: float, overloaded: bool) -> int:
    """``current`` while ``|raw / current - 1| <= tolerance`` and not overloaded, else ``raw``."""
    if current > 0 and not overloaded and abs(raw / current - 1) <= tolerance + _EPSILON:
        return current
    return raw


def down_window_view(
    recommendations: tuple[TimedCount, ...], load: tuple[LoadSample, ...], now: float
) -> tuple[TimedCount, ...] | None:
    """What the down window takes its maximum over, when not the recommendations themselves.

    While jobs wait, and for ``DRAINED_BACKLOG_HOLD`` seconds after the last
    tick that saw a backlog (``load`` includes this tick's sample), every
    recommendation counts in full (None).  After that each counts only its
    sustained part.  The seed, and recommendations made without a backlog,
    have no separate sustained part and count in full.
    """
    if any(sample.runnable > 0 and sample.at > now - DRAINED_BACKLOG_HOLD for sample in load):
        return None
    if all(rec.sustained is None for rec in recommendations):
        return None
    return tuple(TimedCount(rec.at, rec.after_drain) for rec in recommendations)


def floor_for(obs: Observation, policy: PoolPolicy, lean: int | None = None) -> int:
    """The fewest workers allowed: the policy's floor, and one while jobs wait or run -- unless
    none keeps every job within the age target (``lean``: the lean count)."""
    assert obs.metrics is not None
    busy = obs.metrics.runnable_depth > 0 or obs.metrics.running > 0
    return max(policy.floor, 1 if busy and lean != 0 else 0)


def finish(
    stage: Combined, dependency_cap: DependencyCap | None, start_allowances: tuple[tuple[str, int], ...] = ()
) -> Decision:
    """Stages 3 to 5: cap, smooth, clamp; then the reason and the next history."""
    obs, policy, history, now = stage.obs, stage.policy, stage.history, stage.now
    # The down window in force: the operator's, else the start cost's break-even hold.
    behavior = replace(policy.behavior, down_window=down_hold(obs, policy.behavior, policy.targets))
    current = obs.current
    assert obs.metrics is not None

    knee = knee_cap(history.knee, policy.knee, now, stage.late, obs, policy.targets.age)
    step = history.knee.probe
    history = replace(history, evidence=update_evidence(history.evidence, obs, policy.evidence, policy.knee,
                                                        now, stage.late, step.start.workers if step else None))
    caps = collect_caps(obs, policy, knee[0] if knee else None, dependency_cap, start_allowances,
                        evidence_caps(history.evidence))
    capped, cap_bound = apply_caps(stage.raw, caps)
    sustained = min(apply_caps(stage.sustained, caps)[0], capped)

    if not history.seeded:
        # As the HPA does: the first decision remembers the current count, so
        # a restart cannot scale down before a whole down window has passed.
        history = replace(history, seeded=True, recommendations=record((), now, current, 0.0))
    down_view = down_window_view(history.recommendations, history.load, now)
    windowed, window_tag = stabilize(current, capped, history.recommendations, now, behavior, down_view)
    overloaded = jobs_of_active_workers(obs) > obs.active * obs.concurrency
    if cap_bound is not None and windowed > current:
        # The band is for noise in the signals; a cap that holds their wish down is none.  Growth
        # up to it is taken however small: staggered starts end in one step of a few workers
        # (36 -> 38 -> 40), which the band would otherwise hold off as long as the wish lasts.
        stabilized = windowed
    else:
        stabilized = within_tolerance(windowed, current, behavior.tolerance, overloaded)
    noisy = stage.winner is None or stage.winner.signal in NOISY_SIGNALS
    limits = behavior if noisy or stabilized <= current else replace(behavior, up_limit=None)
    limited, rate_tag = rate_limit(current, stabilized, history.changes, now, limits)

    ceiling = tightest(caps)
    desired = min(limited, ceiling.workers)
    hard_cap = ceiling if desired < limited else None
    floor = floor_for(obs, policy, stage.lean)
    raised = desired < floor
    desired = max(desired, floor)

    keep = max(behavior.up_window, behavior.down_window)
    history = replace(
        history,
        recommendations=record(
            history.recommendations, now, capped, keep, sustained if sustained < capped else None
        ),
        changes=record_change(history.changes, now, current, desired, behavior, REVERSAL_WINDOW),
    )
    reversed_workers = reversal(stage.history.changes, now, desired - current, REVERSAL_WINDOW)
    outcome = _Outcome(
        capped=capped, windowed=windowed, stabilized=stabilized, limited=limited, desired=desired,
        cap=hard_cap or cap_bound, raised=raised, floor=floor,
        rules=_cap_rules(history, policy, knee),
    )
    reason, message = _explain(stage, outcome)
    if reversed_workers:
        cost = reversed_workers * start_cost(obs, policy.behavior)
        message += (f"; restarts {reversed_workers} of the workers given back in the last {REVERSAL_WINDOW:g}s"
                    f" (a reversal: about {cost:.1f} worker-seconds of starts)")
    tolerance_tag = "tolerance" if stabilized != windowed else None
    tags = ("overload",) if overloaded else ()
    tags += tuple(tag for tag in (window_tag, tolerance_tag, rate_tag) if tag)
    if reversed_workers:
        tags += ("reversal",)
    return Decision(
        pool=obs.pool, current=current, desired=desired, raw_desired=stage.raw, capped=capped,
        stabilized=stabilized, reason=reason, message=message, recommendations=stage.recommendations,
        winner=stage.winner.signal if stage.winner else None, caps=caps, binding_cap=outcome.cap,
        smoothing=tags, history=history,
    )


@dataclass(frozen=True, kw_only=True)
class _Outcome:
    """The values of stages 3 to 5, for explaining the decision."""

    capped: int
    windowed: int
    stabilized: int
    limited: int
    desired: int
    cap: CapValue | None
    raised: bool
    floor: int
    rules: dict[str, str]  # cap name -> its rule in words, with its measurements (the knee, evidence)


def _cap_rules(history: History, policy: PoolPolicy, knee: tuple[int, str] | None) -> dict[str, str]:
    rules = {"knee": describe(history.knee, knee[1], knee[0])} if knee else {}
    by_source = {rule.source: rule for rule in policy.evidence}
    for track in history.evidence:
        if track.held_at is not None and track.source in by_source:
            rules[track.source] = describe_evidence(track, by_source[track.source])
    return rules


def _explain(stage: Combined, out: _Outcome) -> tuple[str, str]:
    """The reason token and sentence, from the last stage that changed the count.

    The sentence starts with what the winning signal saw, then says which
    stage set the count when it was not the signals.
    """
    obs = stage.obs
    current = obs.current
    metrics = obs.metrics
    assert metrics is not None
    winner = stage.winner
    why = winner.detail if winner is not None else "no runnable or running jobs"
    if current == 0 and out.desired > 0 and metrics.runnable_depth > 0:
        return "ScaleFromZero", f"{metrics.runnable_depth} runnable jobs and no workers"
    idle = metrics.runnable_depth == 0 and metrics.running == 0
    if out.raised and idle and out.desired < current:
        return "ScaleDownIdle", f"no runnable or running jobs; the floor is {out.floor} workers"
    if out.raised:
        return "RaisedToMinimum", f"{why}; the floor is {out.floor} workers"
    if out.cap is not None and out.desired == out.cap.workers and (
        out.desired < out.limited or out.capped < stage.raw
    ):
        rule = f" ({out.rules[out.cap.cap]})" if out.cap.cap in out.rules else ""
        return cap_reason(out.cap), f"{why}; signals want {stage.raw}, {out.cap.cap} caps at {out.cap.workers}{rule}"
    if out.limited != out.stabilized:
        return "RateLimited", f"{why}; {out.stabilized} wanted, the rate limit allows {out.limited} now"
    if out.stabilized != out.windowed:
        tolerance = stage.policy.behavior.tolerance
        return "DesiredWithinRange", f"{why}; {out.windowed} is within the tolerance of {tolerance:g} around {current}"
    if out.windowed != out.capped:
        if out.capped < current:
            return "ScaleDownStabilized", (
                f"{why}; signals want {out.capped}, the down window's highest recommendation is {out.windowed}"
            )
        return "ScaleUpStabilized", f"{why}; signals want {out.capped}, the up window's lowest is {out.windowed}"
    if out.desired == current:
        return "DesiredWithinRange", f"{why}; signals agree with the current {current} workers"
    if winner is None or (out.desired < current and idle and out.desired <= out.floor):
        # Only when the pool goes down to its floor: an idle reading that keeps workers names its signal.
        return "ScaleDownIdle", "no runnable or running jobs"
    direction = "ScaleUp" if out.desired > current else "ScaleDown"
    return f"{direction}{_SIGNAL_TOKENS[winner.signal]}", why


# Signal -> the word in its reason token (ScaleUpAge, ScaleDownUtilisation, ...).
_SIGNAL_TOKENS = {
    "age": "Age", "drain": "Drain", "depth": "Depth", "util": "Utilisation", "cpu": "CPU", "zero": "FromZero",
    "saturation": "Saturation", "due": "ComingDue", "safety": "SafetyNet",
}


def hold(obs: Observation, policy: PoolPolicy, history: History) -> Decision:
    """A failed metrics read: keep the current count (within the configured bounds), record nothing."""
    desired = min(max(obs.current, policy.floor), policy.max_workers)
    return Decision(
        pool=obs.pool, current=obs.current, desired=desired, raw_desired=obs.current, capped=desired,
        stabilized=desired, reason="HoldMetricsUnavailable",
        message=f"metrics could not be read; holding {desired} workers",
        recommendations=(), winner=None, caps=(CapValue("max", policy.max_workers),), binding_cap=None,
        smoothing=(), history=history,
    )

