"""When the control loop decides (flexiqd.daemon.pacing): the tick, and the wake-ups that come sooner."""

from __future__ import annotations

import math

from flexiqd.daemon import pacing


def test_with_nothing_delayed_the_next_decision_is_a_tick_after_the_last():
    assert pacing.next_tick(10.0, 1.0, None) == 11.0


def test_a_delayed_job_coming_due_before_the_tick_brings_the_decision_forward_but_not_into_a_storm():
    assert pacing.next_tick(10.0, 5.0, 12.5) == 12.5
    assert pacing.next_tick(10.0, 5.0, 10.01) == 10.0 + pacing.COMING_DUE_GAP
    assert pacing.next_tick(10.0, 1.0, 30.0) == 11.0  # the tick comes first


def test_new_work_is_decided_on_at_once_then_at_most_once_per_gap_and_once_more_after():
    first, again = pacing.after_new_work(100.0, -math.inf)
    assert (first, again) == (100.0, 100.0 + pacing.NEW_WORK_GAP)
    assert pacing.after_new_work(100.05, first)[0] == 100.0 + pacing.NEW_WORK_GAP
    assert pacing.after_new_work(101.0, first)[0] == 101.0
    # The follow-up comes before the tick, whatever else arrives.
    assert pacing.next_tick(first, 60.0, None, again) == again


def test_a_unit_change_waits_out_the_gap_after_the_last_decision():
    assert pacing.after_unit_change(10.05, 10.0) == 10.0 + pacing.UNIT_CHANGE_GAP
    assert pacing.after_unit_change(12.0, 10.0) == 12.0


def test_the_store_run_at_is_moved_onto_the_loop_clock_and_past_ones_are_dropped():
    assert pacing.due_at(1_000_005.0, 1_000_000.0, 50.0) == 55.0
    assert pacing.due_at(999_999.0, 1_000_000.0, 50.0) is None
    assert pacing.due_at(None, 1_000_000.0, 50.0) is None
