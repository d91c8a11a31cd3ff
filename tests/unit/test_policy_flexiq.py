"""The flexiq compatibility mode: its eight published cases, flexiq 2.1.0's own log lines,
its validation, its windows done right, and the same decision as the policy's ``Decision``.

``data/flexiq-2.1.0-lines.json`` holds what flexiq 2.1.0's Python code wrote for the
published vectors and a grid of inputs (recorded by ``data/record_flexiq_lines.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from flexiqd.policy import (Behavior, Observation, PolicyConfigError, PoolMetrics, PoolPolicy,
                            compute_desired_workers)
from flexiqd.policy.flexiq_compat import LOG_FORMAT, decide_flexiq, flexiq_log_line
from flexiqd.policy.history import history_from_dict, history_to_dict

DATA = Path(__file__).parent / "data"
VECTORS = json.loads((DATA / "flexiq-vectors.json").read_text())
RECORDED = json.loads((DATA / "flexiq-2.1.0-lines.json").read_text())
CASES = [dict(zip(RECORDED["columns"], row)) for row in RECORDED["cases"]]
OPTIONS = ("min_workers", "max_workers", "target_queue_depth_per_worker", "target_utilisation",
           "concurrency_per_worker", "tolerance")


def flexiq_line(case, desired, rationale):
    """The line flexiq 2.1.0's autoscaler logs for a decision: its own format string."""
    return RECORDED["format"] % (case["pending"], case["running"], case["current_workers"], desired, rationale)


@pytest.mark.parametrize("case", VECTORS, ids=[case["id"] for case in VECTORS])
def test_published_vectors(case):
    result = compute_desired_workers(
        case["pending"], case["running"], case["current_workers"], **{key: case[key] for key in OPTIONS}
    )
    assert result.desired_workers == case["expected_desired_workers"]
    # The vectors spell the rationale as flexiq's other SDKs do; its Python package writes
    # Python's True/False and util_ratio -- and that is what users of it see in their logs.
    recorded = CASES[VECTORS.index(case)]
    assert flexiq_line(case, result.desired_workers, result.rationale) == recorded["line"]


def test_there_are_eight_vectors_and_the_recording_starts_with_them():
    assert len(VECTORS) == 8
    assert RECORDED["flexiq"] == "2.1.0" and RECORDED["format"] == LOG_FORMAT
    for vector, case in zip(VECTORS, CASES):
        assert {key: vector[key] for key in ("pending", "running", "current_workers", *OPTIONS)} == \
            {key: case[key] for key in ("pending", "running", "current_workers", *OPTIONS)}


@pytest.mark.parametrize(
    "rationale_part", ["overload=True", "overload=False", "util_ratio=", "scale-down: ", "stable: "])
def test_the_recording_covers_every_rationale_form(rationale_part):
    assert any(rationale_part in case["line"] for case in CASES)


def test_every_recorded_line_is_reproduced_byte_for_byte():
    mismatches = []
    for case in CASES:
        result = compute_desired_workers(
            case["pending"], case["running"], case["current_workers"], **{key: case[key] for key in OPTIONS})
        line = flexiq_line(case, result.desired_workers, result.rationale)
        if (result.desired_workers, line) != (case["desired_workers"], case["line"]):
            mismatches.append((line, case["line"]))
    assert mismatches == [], f"{len(mismatches)} of {len(CASES)} differ, first: {mismatches[:1]}"


@dataclass(frozen=True)
class Options:
    """A pool's flexiq options (the daemon's FlexiqOptions has these fields)."""

    target_queue_depth_per_worker: float = 15
    target_utilisation: float = 0.75
    tolerance: float = 0.1
    scale_up_window: float = 0.0
    scale_down_window: float = 300.0


def observe(pending, running, workers, concurrency=4, starting=0, draining=0):
    return Observation(pool="p", active=workers - starting, starting=starting, draining=draining,
                       concurrency=concurrency, metrics=PoolMetrics(runnable_depth=pending, running=running))


def test_decide_flexiq_writes_flexiqs_line_for_every_recorded_case():
    mismatches = []
    for case in CASES:
        policy = PoolPolicy(min_workers=case["min_workers"], max_workers=case["max_workers"])
        options = Options(case["target_queue_depth_per_worker"], case["target_utilisation"], case["tolerance"],
                          scale_down_window=0.0)  # flexiq's formula alone: no window to hold a scale-down
        observation = observe(case["pending"], case["running"], case["current_workers"],
                              case["concurrency_per_worker"])
        decision = decide_flexiq(observation, policy, options, None, now=100.0)
        if flexiq_log_line(observation, decision) != case["line"]:
            mismatches.append((flexiq_log_line(observation, decision), case["line"]))
    assert mismatches == [], f"{len(mismatches)} of {len(CASES)} differ, first: {mismatches[:1]}"


@pytest.mark.parametrize(
    "pending, running, workers, reason, desired, smoothing, message",
    [
        (100, 0, 1, "ScaleUp", 7, (), "scale-up: depth=7 util=0 overload=False"),
        (0, 10, 2, "ScaleUp", 4, (), "scale-up: depth=0 util=4 overload=True"),
        (0, 6, 2, "Stable", 2, (), "stable: depth=0 util=2 util_ratio=0.75"),
        # The first scale-down after a start waits a whole down window.
        (0, 0, 8, "Stable", 8, ("window down",), "scale-down: depth=0 util=0 (windowed -> 8)"),
    ],
)
def test_decide_flexiq_reasons(pending, running, workers, reason, desired, smoothing, message):
    decision = decide_flexiq(observe(pending, running, workers), PoolPolicy(min_workers=1, max_workers=10),
                             Options(), None, now=0.0)
    assert (decision.reason, decision.desired, decision.smoothing, decision.message) == \
        (reason, desired, smoothing, message)
    assert decision.current == workers and decision.history.seeded


def test_decide_flexiq_counts_starting_workers_not_draining_ones():
    decision = decide_flexiq(observe(0, 6, 2, starting=1, draining=3), PoolPolicy(min_workers=1, max_workers=10),
                             Options(), None, now=0.0)
    assert decision.current == 2 and decision.reason == "Stable"


def test_decide_flexiq_holds_without_metrics_and_says_why():
    observation = Observation(pool="p", active=3, concurrency=4, metrics=None)
    decision = decide_flexiq(observation, PoolPolicy(min_workers=1, max_workers=10), Options(), None, now=0.0)
    assert (decision.reason, decision.desired) == ("HoldMetricsUnavailable", 3)
    assert flexiq_log_line(observation, decision) == \
        "autoscale: pending=? running=? workers=3 -> 3 (stable: metrics unavailable, holding)"


def test_decide_flexiq_names_its_signals_and_the_binding_max():
    decision = decide_flexiq(observe(1000, 0, 1), PoolPolicy(min_workers=1, max_workers=10), Options(), None, now=0.0)
    assert [(r.signal, r.workers) for r in decision.recommendations] == [("depth", 67), ("utilisation", 0)]
    assert decision.winner == "depth" and decision.binding_cap.cap == "max" and decision.desired == 10
    assert (decision.raw_desired, decision.capped, decision.stabilized) == (67, 10, 10)


def test_decide_flexiq_history_survives_a_restart_and_keeps_holding():
    policy = PoolPolicy(min_workers=1, max_workers=10, behavior=Behavior())
    first = decide_flexiq(observe(0, 0, 8), policy, Options(), None, now=0.0)
    restored = history_from_dict(json.loads(json.dumps(history_to_dict(first.history))))
    held = decide_flexiq(observe(0, 0, 8), policy, Options(), restored, now=290.0)
    after = decide_flexiq(observe(0, 0, 8), policy, Options(), held.history, now=301.0)
    assert (held.desired, after.desired, after.reason) == (8, 1, "ScaleDown")
    assert after.message == "scale-down: depth=0 util=0"


def test_decide_flexiq_refuses_bad_options():
    with pytest.raises(PolicyConfigError, match="target_utilisation"):
        decide_flexiq(observe(0, 0, 1), PoolPolicy(min_workers=1, max_workers=10),
                      Options(target_utilisation=1.5), None, now=0.0)


@pytest.mark.parametrize(
    "arguments, options, message",
    [
        ((0, 0, 1), {"min_workers": 5, "max_workers": 2}, "max_workers: must be >= min_workers (5), got 2"),
        ((1.5, 0, 1), {}, "pending: must be an integer, got 1.5"),
        ((0, 0, 1), {"concurrency_per_worker": 2.0}, "concurrency_per_worker: must be an integer"),
        ((0, 0, 1), {"min_workers": True}, "min_workers: must be an integer, got True"),
        ((0, 0, 1), {"target_utilisation": 1.0}, "target_utilisation: must be in (0, 1), got 1.0"),
        ((0, 0, 1), {"target_utilisation": 0}, "target_utilisation: must be in (0, 1), got 0"),
        ((0, 0, 1), {"tolerance": 1}, "tolerance: must be in [0, 1), got 1"),
        ((0, 0, 1), {"tolerance": -0.1}, "tolerance: must be in [0, 1), got -0.1"),
        ((0, 0, 1), {"target_queue_depth_per_worker": 0}, "target_queue_depth_per_worker: must be in (0, inf)"),
        ((0, 0, 1), {"concurrency_per_worker": 0}, "concurrency_per_worker: must be >= 1, got 0"),
        ((-1, 0, 1), {}, "pending: must be >= 0, got -1"),
    ],
)
def test_invalid_options_are_refused_with_a_clear_message(arguments, options, message):
    with pytest.raises(PolicyConfigError) as raised:
        compute_desired_workers(*arguments, **options)
    assert str(raised.value).startswith(message)


def test_windowed_holds_the_first_dip_after_start_and_says_so():
    policy = PoolPolicy(min_workers=1, max_workers=10)
    first = decide_flexiq(observe(0, 0, 8), policy, Options(), None, now=0.0)
    assert first.desired == 8
    assert first.message == "scale-down: depth=0 util=0 (windowed -> 8)"
    held = decide_flexiq(observe(0, 0, 8), policy, Options(), first.history, now=290.0)
    assert held.desired == 8
    after = decide_flexiq(observe(0, 0, 8), policy, Options(), held.history, now=301.0)
    assert after.desired == 1
    assert after.message == "scale-down: depth=0 util=0"


def test_windowed_never_scales_down_during_a_spike():
    # current 5; polls want 5, 3, 8 with a 60 s up window: flexiq itself drops to 3.
    policy = PoolPolicy(min_workers=1, max_workers=10)
    options = Options(target_queue_depth_per_worker=10, tolerance=0, scale_up_window=60.0)
    history = None
    results = []
    for now, pending in ((0.0, 50), (10.0, 30), (20.0, 80)):
        result = decide_flexiq(observe(pending, 0, 5), policy, options, history, now=now)
        history = result.history
        results.append(result)
    assert [r.desired for r in results] == [5, 5, 5]
    assert results[2].message == "scale-up: depth=8 util=0 overload=False (windowed -> 5)"
    assert decide_flexiq(observe(80, 0, 5), policy, options, history, now=75.0).desired == 8


def test_decide_flexiq_counts_a_change_made_by_others_in_its_down_window():
    from flexiqd.policy.history import with_external_change

    policy = PoolPolicy(min_workers=1, max_workers=10)
    first = decide_flexiq(observe(0, 0, 2), policy, Options(scale_down_window=60.0), None, now=0.0)
    pinned = with_external_change(first.history, policy, 100.0, 2, 6)  # an operator asked for 6
    held = decide_flexiq(observe(0, 0, 6), policy, Options(scale_down_window=60.0), pinned, now=130.0)
    later = decide_flexiq(observe(0, 0, 6), policy, Options(scale_down_window=60.0), held.history, now=161.0)
    assert (held.desired, held.reason, held.smoothing) == (6, "Stable", ("window down",))
    assert (later.desired, later.reason) == (1, "ScaleDown")
