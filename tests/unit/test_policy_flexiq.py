"""The flexiq compatibility mode: its eight published cases, its validation, its windows done right."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flexiqd.policy import PolicyConfigError, compute_desired_workers, compute_desired_workers_windowed

VECTORS = json.loads((Path(__file__).parent / "data" / "flexiq-vectors.json").read_text())
OPTIONS = ("min_workers", "max_workers", "target_queue_depth_per_worker", "target_utilisation",
           "concurrency_per_worker", "tolerance")


@pytest.mark.parametrize("case", VECTORS, ids=[case["id"] for case in VECTORS])
def test_published_vectors(case):
    result = compute_desired_workers(
        case["pending"], case["running"], case["current_workers"], **{key: case[key] for key in OPTIONS}
    )
    assert result.desired_workers == case["expected_desired_workers"]
    assert result.rationale == case["expected_rationale"]


def test_there_are_eight_vectors():
    assert len(VECTORS) == 8


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
    first = compute_desired_workers_windowed(0, 0, 8, now=0.0)
    assert first.desired_workers == 8
    assert first.rationale == "scale-down: depth=0 util=0 (windowed -> 8)"
    held = compute_desired_workers_windowed(0, 0, 8, now=290.0, history=first.history)
    assert held.desired_workers == 8
    after = compute_desired_workers_windowed(0, 0, 8, now=301.0, history=held.history)
    assert after.desired_workers == 1
    assert after.rationale == "scale-down: depth=0 util=0"


def test_windowed_never_scales_down_during_a_spike():
    # current 5; polls want 5, 3, 8 with a 60 s up window: flexiq itself drops to 3.
    options = dict(scale_up_window=60.0, min_workers=1, max_workers=10, target_queue_depth_per_worker=10, tolerance=0)
    history = None
    results = []
    for now, pending in ((0.0, 50), (10.0, 30), (20.0, 80)):
        result = compute_desired_workers_windowed(pending, 0, 5, now=now, history=history, **options)
        history = result.history
        results.append(result)
    assert [r.desired_workers for r in results] == [5, 5, 5]
    assert results[2].rationale == "scale-up: depth=8 util=0 overload=false (windowed -> 5)"
    assert compute_desired_workers_windowed(80, 0, 5, now=75.0, history=history, **options).desired_workers == 8
