"""Schedules in the store: the ledger and the firing loop, the same on every backend
(see conftest.BACKENDS).  Time is ``now=``; jobs are counted per slot from the jobs
themselves (their idempotency key names the slot), never from the ledger."""

from __future__ import annotations

import collections
import threading

import pytest

from flexiqd.config import parse_config
from flexiqd.config.model import slot_key
from flexiqd.daemon.schedules import ScheduleFirer
from flexiqd.queue import JobState
from flexiqd.queue.schedules import LEDGER_KEEP, SlotDecision
from flexiqd.schedules.calendar import Calendar
from flexiqd.schedules.plan import Planned, plan
from flexiqd.schedules.words import CATCH_UP_HORIZON, MISSED, CatchUp

from conftest import open_test_backend

from flexiqd.queue import open_backend

T0 = 1_800_000_000.0  # a whole minute


def schedules(text: str):
    return parse_config("schedules:\n" + text).schedules


def jobs_per_slot(backend, task: str = "tick") -> collections.Counter:
    return collections.Counter(job.idempotency_key for job in backend.list_jobs(task=task, limit=100_000))


@pytest.fixture
def same_store(backend_kind, tmp_path, request):
    """Opens another connection to one store each call (as another process or host would)."""
    if backend_kind == "sqlite":
        url = f"sqlite:///{tmp_path.resolve()}/queue.db?synchronous=normal"
    else:
        url = request.getfixturevalue("pg_server").fresh_url()
    opened = []

    def opener():
        opened.append(open_backend(url))
        return opened[-1]

    yield opener
    for store in opened:
        store.close()


EVERY_SECOND = "  tick: {task: tick, cron: '* * * * * *', queue: sched}\n"


# -- the plan (pure) ----------------------------------------------------------------------------

def every_minute() -> Calendar:
    return Calendar("* * * * *", "UTC")


@pytest.mark.parametrize("catch_up,expected", [
    # At T0+600 with max_delay 60s, the slots of T0+540 (60s late) and T0+600 are on time.
    ("none", [Planned(T0 + 480, MISSED, 8, True), Planned(T0 + 540), Planned(T0 + 600)]),
    ("latest", [Planned(T0 + 480, MISSED, 8, True), Planned(T0 + 540), Planned(T0 + 600)]),
    ("all", [Planned(T0 + 60 * i, None, 1, True) for i in range(1, 9)] + [Planned(T0 + 540), Planned(T0 + 600)]),
])
def test_on_time_slots_fire_and_catch_up_decides_the_missed_ones(catch_up, expected):
    policy = CatchUp(catch_up=catch_up, max_delay=60.0)
    assert plan(every_minute(), policy, T0, T0 + 600) == expected


@pytest.mark.parametrize("catch_up,fires", [("none", False), ("latest", True), ("all", True)])
def test_after_an_outage_latest_fires_the_newest_missed_slot_once(catch_up, fires):
    daily = Calendar("0 3 * * *", "UTC")
    after = daily.next_fires(T0, 1)[0] - 1
    decisions = plan(daily, CatchUp(catch_up=catch_up, max_delay=300.0), after, after + 3 * 86400 + 3600)
    fired = [d for d in decisions if d.skip is None]
    assert len(fired) == {"none": 0, "latest": 1, "all": 4}[catch_up]
    assert sum(d.slots for d in decisions) == 4   # four days' slots, each late by an hour or more
    if fires:
        assert fired[-1].at == decisions[-1].at and fired[-1].late


def test_all_catches_up_no_further_back_than_the_horizon():
    decisions = plan(Calendar("0 * * * *", "UTC"), CatchUp(catch_up="all", max_delay=60.0), T0,
                     T0 + CATCH_UP_HORIZON + 10 * 3600)
    assert decisions[0].skip == MISSED and decisions[0].slots == 9   # T0+1h..T0+9h: more than a week late
    assert all(d.skip is None for d in decisions[1:])


# -- the ledger ---------------------------------------------------------------------------------

def test_a_slot_is_decided_once_and_its_job_enqueued_with_it(backend):
    job = schedules(EVERY_SECOND)["tick"].new_job(T0 + 1)
    first = backend.fire_slot(SlotDecision("tick", T0 + 1, job), host="a", now=T0 + 1)
    again = backend.fire_slot(SlotDecision("tick", T0 + 1, job), host="b", now=T0 + 1.5)
    assert first.outcome == "fired" and again is None
    assert jobs_per_slot(backend) == {slot_key("tick", T0 + 1): 1}
    assert backend.get(first.job_id).queue == "sched"


def test_a_transaction_that_dies_before_its_commit_leaves_the_slot_to_the_next(backend, monkeypatch):
    job = schedules(EVERY_SECOND)["tick"].new_job(T0 + 1)
    tx_class = type(backend.database).__module__

    def crash(*args, **kwargs):
        raise RuntimeError("killed between the decision and the commit")

    with monkeypatch.context() as patch:
        import flexiqd.queue.store.lifecycle as core

        patch.setattr(core.Store, "_insert_scheduled", staticmethod(crash))
        with pytest.raises(RuntimeError):
            backend.fire_slot(SlotDecision("tick", T0 + 1, job), host="a", now=T0 + 1)
    assert tx_class and jobs_per_slot(backend) == {}
    assert backend.schedule_ledger("tick") == []
    assert backend.fire_slot(SlotDecision("tick", T0 + 1, job), host="b", now=T0 + 2).outcome == "fired"
    assert jobs_per_slot(backend) == {slot_key("tick", T0 + 1): 1}


def test_two_firing_loops_on_one_store_enqueue_each_slot_exactly_once(same_store):
    config = schedules(EVERY_SECOND + "  other: {task: tick, cron: '* * * * * */3', overlap: skip}\n")
    backends = [same_store(), same_store()]
    firers = [ScheduleFirer(b, f"host{i}", lambda: config) for i, b in enumerate(backends)]
    for firer in firers:
        firer.pass_once(T0)
    start = threading.Barrier(2)

    def run(firer):
        start.wait()
        for step in range(1, 121):
            firer.pass_once(T0 + step * 0.5)

    threads = [threading.Thread(target=run, args=(f,)) for f in firers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counts = jobs_per_slot(backends[0])
    expected = {slot_key("tick", T0 + s) for s in range(1, 61)}
    assert {key for key in counts if key.startswith("schedule:tick:")} == expected
    assert set(counts.values()) == {1}, [key for key, n in counts.items() if n > 1]
    decided = {firer.host: sum(firer.counters.fired.values()) for firer in firers}
    print(f"\nfired per loop: {decided}; slots: {len(expected)}")
    assert sum(decided.values()) == len(counts)


def test_a_clock_step_back_refires_nothing_and_one_forward_fires_per_catch_up(backend):
    config = schedules("  tick: {task: tick, cron: '* * * * *', max_delay: 2m, catch_up: latest}\n")
    firer = ScheduleFirer(backend, "a", lambda: config)
    firer.pass_once(T0)
    for minute in range(1, 4):
        firer.pass_once(T0 + minute * 60 + 1)
    assert len(jobs_per_slot(backend)) == 3
    # Back an hour: nothing fired again, and the next fire stays where the ledger is.
    assert firer.pass_once(T0 - 3600) == []
    assert firer.views()["tick"].next_fire == T0 + 240
    assert firer.pass_once(T0 + 3 * 60 + 30) == []
    # Forward an hour: of the 60 slots since, the last 2 minutes' are on time, 58 missed.
    outcomes = firer.pass_once(T0 + 63 * 60 + 1)
    assert [(o.outcome, o.reason, o.slots) for o in outcomes] == [("skipped", "missed", 58), ("fired", None, 1),
                                                                  ("fired", None, 1)]
    counts = jobs_per_slot(backend)
    assert set(counts.values()) == {1} and len(counts) == 5
    record = backend.schedule_records(["tick"])["tick"]
    assert (record.fired, record.skipped) == (5, 58)


def test_a_restarted_loop_starts_from_the_ledger_not_from_memory(same_store):
    config = schedules(EVERY_SECOND)
    ScheduleFirer(same_store(), "a", lambda: config).pass_once(T0)
    ScheduleFirer(same_store(), "a", lambda: config).pass_once(T0 + 3.5)
    # A new process (no memory) three seconds later: the three slots in between fire, once.
    ScheduleFirer(same_store(), "a", lambda: config).pass_once(T0 + 6.5)
    counts = jobs_per_slot(same_store())
    assert sorted(counts) == [slot_key("tick", T0 + s) for s in range(1, 7)] and set(counts.values()) == {1}


def test_overlap_skip_waits_for_the_previous_job_and_says_so(backend):
    config = schedules("  tick: {task: tick, cron: '* * * * * *', overlap: skip}\n")
    firer = ScheduleFirer(backend, "a", lambda: config)
    firer.pass_once(T0)
    [first] = firer.pass_once(T0 + 1)
    [second] = firer.pass_once(T0 + 2)
    assert (second.outcome, second.reason) == ("skipped", "overlap")
    backend.cancel(first.job_id, now=T0 + 2.5)
    [third] = firer.pass_once(T0 + 3)
    assert third.outcome == "fired"
    assert firer.counters.skipped[("tick", "overlap")] == 1


def test_a_pause_in_the_store_holds_every_host_until_resumed(same_store):
    config = schedules(EVERY_SECOND)
    here, there = (ScheduleFirer(same_store(), host, lambda: config) for host in ("a", "b"))
    here.pass_once(T0)
    assert here.pause("tick", True) and not here.pause("tick", True)
    outcomes = there.pass_once(T0 + 2)
    assert [(o.outcome, o.reason) for o in outcomes] == [("skipped", "paused")] * 2
    assert there.backend.schedule_records(["tick"])["tick"].paused
    there.pause("tick", False)
    assert [o.outcome for o in here.pass_once(T0 + 3)] == ["fired"]
    with pytest.raises(KeyError):
        here.pause("nosuch", True)


def test_a_run_enqueues_outside_the_slots_and_is_recorded_apart(backend):
    config = schedules(EVERY_SECOND)
    firer = ScheduleFirer(backend, "a", lambda: config, clock=lambda: T0 + 0.25)
    job_id = firer.run_now("tick")
    again = firer.run_now("tick")
    assert job_id != again and backend.get(job_id).idempotency_key is None
    record = backend.schedule_records(["tick"])["tick"]
    assert record.last is None and record.last_run.job_id == again
    # A run takes no slot: the slot of that second still fires.
    assert [o.outcome for o in firer.pass_once(T0 + 1)] == ["fired"]


def test_deleting_finished_jobs_leaves_the_ledger_and_pruning_keeps_each_newest_row(backend):
    config = schedules(EVERY_SECOND)
    firer = ScheduleFirer(backend, "a", lambda: config)
    firer.pass_once(T0)
    outcomes = firer.pass_once(T0 + 5)
    for outcome in outcomes:
        backend.cancel(outcome.job_id, now=T0 + 6)
    assert backend.purge(states=[JobState.CANCELLED], finished_before=T0 + 7) == 5
    assert len(backend.schedule_ledger("tick")) == 5
    assert firer.pass_once(T0 + 5.5) == []  # the slots' jobs are gone; the ledger still holds them
    assert backend.prune_ledger(now=T0 + 1 + LEDGER_KEEP) == 0   # the oldest row is just LEDGER_KEEP old
    assert backend.prune_ledger(now=T0 + 5 + LEDGER_KEEP + 10) == 4
    [newest] = backend.schedule_ledger("tick")
    assert newest.at == T0 + 5 and newest.job_state is None


def test_the_ledger_survives_reopening_the_store(backend_kind, tmp_path, request):
    if backend_kind != "sqlite":
        pytest.skip("the SQLite file reopened")
    config = schedules(EVERY_SECOND)
    first = open_test_backend("sqlite", tmp_path)
    ScheduleFirer(first, "a", lambda: config).pass_once(T0)
    ScheduleFirer(first, "a", lambda: config).pass_once(T0 + 2)
    first.close()
    again = open_test_backend("sqlite", tmp_path)
    assert ScheduleFirer(again, "a", lambda: config).pass_once(T0 + 2) == []
    assert len(jobs_per_slot(again)) == 2
