"""The pure parts of dependency limits: validation, GCRA arithmetic, waits and jitter."""

from __future__ import annotations

import random

import pytest

from flexiqd.queue.limits import (DEFAULT_SLOT_WAIT, MIN_WAIT, DependencyLimit, LimitError, deferral_delay, gcra,
                                  limit_from_mapping, limits_for, slot_wait)


# -- validation ----------------------------------------------------------------------------

def test_a_limit_from_config_with_every_key():
    limit = limit_from_mapping("api", {"concurrency": 20, "rate": 50, "burst": 60})
    assert limit == DependencyLimit("api", concurrency=20, rate=50.0, burst=60)
    assert limit.effective_burst == 60


@pytest.mark.parametrize("rate, burst", [(50.0, 50), (2.5, 3), (0.2, 1)])
def test_the_burst_defaults_to_the_rate_rounded_up(rate, burst):
    assert DependencyLimit("api", rate=rate).effective_burst == burst


@pytest.mark.parametrize("value, key", [
    ({"concurrency": 0}, "limit.concurrency"),
    ({"concurrency": 2.5}, "limit.concurrency"),
    ({"concurrency": True}, "limit.concurrency"),
    ({"rate": 0}, "limit.rate"),
    ({"rate": -1}, "limit.rate"),
    ({"rate": "fast"}, "limit.rate"),
    ({"rate": float("inf")}, "limit.rate"),
    ({"rate": 5, "burst": 0}, "limit.burst"),
    ({"rate": 5, "burst": 1.5}, "limit.burst"),
    ({"concurrency": 3, "burst": 4}, "limit.burst"),
    ({}, "limit"),
    ({"concurency": 3}, "limit.concurency"),
    ([3], "limit"),
])
def test_a_bad_limit_names_its_key(value, key):
    with pytest.raises(LimitError) as raised:
        limit_from_mapping("api", value)
    assert raised.value.key == key


def test_limits_for_a_task_leave_out_unlimited_dependencies_and_repeats():
    limits = {"db": DependencyLimit("db", concurrency=2), "api": DependencyLimit("api", rate=1.0)}
    assert limits_for(["api", "cache", "db", "api"], limits) == (limits["api"], limits["db"])
    assert limits_for([], limits) == ()


# -- GCRA ----------------------------------------------------------------------------------

def test_gcra_grants_the_burst_then_one_per_interval():
    tat, granted, now = None, [], 100.0
    for _ in range(4):
        tat, wait = gcra(tat, now, rate=2.0, burst=3)
        granted.append(tat is not None)
        if tat is None:
            break
    assert granted == [True, True, True, False]
    assert wait == pytest.approx(0.5)


def test_gcra_answers_the_exact_wait_and_grants_after_it():
    tat = None
    for _ in range(3):
        tat, _ = gcra(tat, 0.0, rate=2.0, burst=3)
    assert tat == pytest.approx(1.5)
    assert gcra(tat, 0.49, rate=2.0, burst=3) == (None, pytest.approx(0.01))
    new_tat, wait = gcra(tat, 0.5, rate=2.0, burst=3)
    assert (new_tat, wait) == (pytest.approx(2.0), 0.0)


def test_gcra_forgets_a_quiet_spell_only_up_to_the_burst():
    tat, _ = gcra(None, 0.0, rate=1.0, burst=2)
    granted = 0
    tat_now = tat
    while True:  # an hour later: two at once, not 3600
        tat_next, _ = gcra(tat_now, 3600.0, rate=1.0, burst=2)
        if tat_next is None:
            break
        tat_now, granted = tat_next, granted + 1
    assert granted == 2


# -- waits ---------------------------------------------------------------------------------

def test_slot_wait_is_the_soonest_expected_end_of_a_hold():
    assert slot_wait([0.2, 0.9], typical_hold=1.0) == pytest.approx(0.1)
    assert slot_wait([0.0], typical_hold=1.0) == pytest.approx(1.0)


def test_slot_wait_of_overdue_holds_is_a_tenth_of_the_typical_hold():
    assert slot_wait([5.0, 7.0], typical_hold=2.0) == pytest.approx(0.2)


def test_slot_wait_without_a_measurement_and_its_floor():
    assert slot_wait([1.0], typical_hold=None) == DEFAULT_SLOT_WAIT
    assert slot_wait([0.99999], typical_hold=1.0) == MIN_WAIT


def test_deferral_delay_spreads_refused_jobs_after_their_wait():
    rng = random.Random(7)
    delays = [deferral_delay(1.0, rng) for _ in range(500)]
    assert min(delays) >= 1.0 and max(delays) <= 1.5
    assert max(delays) - min(delays) > 0.4  # spread, not one instant
    assert all(deferral_delay(0.0, rng) >= MIN_WAIT for _ in range(50))


def test_a_batch_is_planned_in_order_each_job_all_or_nothing():
    from flexiqd.queue.limits import plan_admissions

    api = DependencyLimit("api", concurrency=2)
    sms = DependencyLimit("sms", rate=1.0, burst=1)
    plan, tats = plan_admissions([(1, [api]), (2, [api, sms]), (3, [api, sms]), (4, [api])],
                                 {"api": 0}, {"sms": None}, 100.0)
    assert plan[1] is None and plan[2] is None  # two slots, one start of sms
    assert plan[3] == [("api", None), ("sms", 1.0)]  # both full: the rate says how long, exactly
    assert plan[4] == [("api", None)]
    assert tats == {"sms": 101.0}


def test_a_refused_job_takes_nothing_from_the_batch():
    from flexiqd.queue.limits import plan_admissions

    api = DependencyLimit("api", concurrency=1)
    sms = DependencyLimit("sms", rate=1.0, burst=1)
    # Job 1 wants both, sms is free but api is full: it takes no start of sms, so job 2 gets it.
    plan, tats = plan_admissions([(1, [api, sms]), (2, [sms])], {"api": 1}, {}, 50.0)
    assert plan[1] == [("api", None)] and plan[2] is None and tats == {"sms": 51.0}
