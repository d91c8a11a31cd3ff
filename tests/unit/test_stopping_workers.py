"""A worker counts against max_workers and every dependency cap until its process has exited.

A stopped worker (a unit still ``deactivating``, a child process still draining) holds its
connections until it is gone.  Three layers keep the rule: the policies' caps (``stopping``,
``stopping:<name>``, in ``policy.fleet``) so a decision says what it waits for; an operator's
pin, which waits for the same caps; and the start itself (``daemon.room.StartRoom``), which
holds whatever decided the count.  Pure code here, and the controller against a fake fleet.
"""

from __future__ import annotations

import logging

import pytest

from flexiqd.config import parse_config
from flexiqd.daemon import pacing
from flexiqd.daemon.compose import build_controller
from flexiqd.daemon.overrides import Override, apply_override
from flexiqd.daemon.room import StartRoom
from flexiqd.fleet.base import WorkerState
from flexiqd.policy import (Behavior, Dependency, DependencyUse, KneeConfig, Observation, PoolInput, PoolPolicy,
                            decide_fleet)
from flexiqd.queue.types import NewJob

from fakes import Clock, FakeFleet
from test_policy_support import metrics

UNSMOOTHED = Behavior(down_window=0.0, up_limit=None, down_limit=None)
FLOODED = dict(runnable_depth=5000, oldest_runnable_age=60.0)


def policy(max_workers: int = 8, *uses: DependencyUse) -> PoolPolicy:
    return PoolPolicy(max_workers=max_workers, behavior=UNSMOOTHED, knee=KneeConfig(enabled=False),
                      dependencies=tuple(uses))


def flooded(pool: str, active: int, draining: int = 0) -> Observation:
    """Pool ``pool`` with a backlog no count under the caps would drain in time."""
    return Observation(pool=pool, active=active, draining=draining, concurrency=4, metrics=metrics(**FLOODED))


def named(cap):
    """A cap as (name, workers)."""
    return None if cap is None else (cap.cap, cap.workers)


def flexiq_options():
    return parse_config("pools:\n  p:\n    policy: flexiq\n", "t.yaml").pools["p"].flexiq


# -- the policies' caps -------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["flexiqd", "flexiq"])
def test_a_scale_up_waits_for_the_stopping_workers_and_says_so(kind):
    extra = {"kind": kind, "flexiq": flexiq_options()} if kind == "flexiq" else {}
    decide = lambda draining, stopping: decide_fleet(  # noqa: E731
        [PoolInput(observation=flooded("p", 1, draining), policy=policy(8), stopping=stopping, **extra)],
        [], 100.0)["p"]

    held = decide(7, 7)   # a burst 0.1 s after a scale-in 8 -> 1: seven still exiting
    assert (held.current, held.desired, held.reason) == (1, 1, "WaitingForStopping")
    assert named(held.binding_cap) == ("stopping", 1)
    assert "7 workers still stopping: starting 0 now, the rest as they exit" in held.message

    some_gone = decide(3, 3)  # four of them exited: four start now
    assert (some_gone.desired, some_gone.reason) == (5, "WaitingForStopping")
    assert "3 workers still stopping: starting 4 now, the rest as they exit" in some_gone.message

    gone = decide(0, 0)
    assert gone.desired == 8 and not any(cap.cap.startswith("stopping") for cap in gone.caps)


def test_retiring_workers_are_taken_back_not_waited_for():
    # Draining but not stopping: paused to retire, their processes run and can claim again.
    decision = decide_fleet([PoolInput(observation=flooded("p", 1, 7), policy=policy(8), stopping=0)],
                            [], 100.0)["p"]
    assert decision.desired == 8
    # Four retiring, three stopping: growth up to max_workers less the three that are leaving.
    decision = decide_fleet([PoolInput(observation=flooded("p", 1, 7), policy=policy(8), stopping=3)],
                            [], 100.0)["p"]
    assert (decision.desired, named(decision.binding_cap)) == (5, ("stopping", 5))


def test_stopping_workers_hold_growth_back_but_never_shrink_a_pool():
    decision = decide_fleet([PoolInput(observation=flooded("p", 5, 7), policy=policy(8), stopping=7)],
                            [], 100.0)["p"]
    assert decision.desired == 5 and ("stopping", 5) in map(named, decision.caps)


def test_a_dependencys_stopping_users_hold_its_room_for_every_pool_in_order():
    db = Dependency(name="db", capacity=8)
    use = DependencyUse(dependency="db", per_worker=1)
    pools = [PoolInput(observation=flooded("a", 1, 4), policy=policy(10, use), stopping=4),
             PoolInput(observation=flooded("b", 2), policy=policy(10, use))]
    decisions = decide_fleet(pools, [db], 100.0)
    # 8 connections: a's 1 + 4 stopping, b's 2 leave one; a takes it, nothing is left for b.
    assert (decisions["a"].desired, named(decisions["a"].binding_cap)) == (2, ("stopping:db", 2))
    assert "4 workers still stopping hold db: starting 1 now" in decisions["a"].message
    assert (decisions["b"].desired, named(decisions["b"].binding_cap)) == (2, ("stopping:db", 2))
    assert decisions["b"].reason == "WaitingForStopping"
    # Without the stopping workers the two would share all 8.
    pools[0] = PoolInput(observation=flooded("a", 1), policy=policy(10, use))
    decisions = decide_fleet(pools, [db], 100.0)
    assert decisions["a"].desired + decisions["b"].desired == 8


def test_a_global_caps_grant_counts_the_pools_stopping_workers():
    db = Dependency(name="db", capacity=100)
    item = PoolInput(observation=flooded("p", 3, 2), policy=policy(10, DependencyUse(dependency="db", per_worker=1)),
                     fleet_grants={"db": 6}, stopping=2)
    decision = decide_fleet([item], [db], 100.0)["p"]
    assert (decision.desired, named(decision.binding_cap)) == (4, ("stopping:db", 4))


def test_stopping_workers_must_be_draining_ones():
    with pytest.raises(ValueError, match="stopping must be within 0..draining"):
        PoolInput(observation=flooded("p", 1, 2), policy=policy(8), stopping=3)


def test_an_operators_pin_waits_for_the_stopping_workers_too():
    decision = decide_fleet([PoolInput(observation=flooded("p", 1, 5), policy=policy(8), stopping=5)],
                            [], 100.0)["p"]
    pool = parse_config("pools:\n  p: {max_workers: 8}\n", "t.yaml").pools["p"]
    pinned = apply_override(decision, Override(pinned=8), pool, 100.0)
    assert (pinned.desired, pinned.reason, named(pinned.binding_cap)) == (3, "Pinned", ("stopping", 3))
    assert "workers still stopping count against max_workers: starting 2 now, the rest as they exit" in pinned.message


# -- the start itself ---------------------------------------------------------------------------

CONFIG = """
dependencies:
  db: {capacity: 10}
pools:
  a: {max_workers: 8, uses: {db: {per_worker: 1}}}
  b: {max_workers: 8, uses: {db: {per_worker: 2}}}
  c: {max_workers: 3}
"""


def test_the_room_to_start_counts_every_live_worker_against_every_cap():
    config = parse_config(CONFIG, "t.yaml")
    room = StartRoom(config, alive={"a": 4, "b": 1, "c": 3}, stopping={"a": 3, "c": 2}, grants=None)
    # db: 10 - 4*1 - 1*2 = 4 free.  a: max leaves 4, db 4; c: max_workers 3, all alive.
    assert room.allow("c", 2).allowed == 0
    assert "2 workers still stopping: starting 0 of 2 now" in room.allow("c", 2).sentence("c")
    got = room.allow("b", 5)
    assert (got.allowed, got.limit, got.stopping) == (2, "dependency db", 3)
    room.started("b", 2)
    got = room.allow("a", 6)
    assert (got.allowed, got.held) == (0, True)  # b's two new workers took what was left
    assert room.allow("a", 0).held is False


def test_the_room_to_start_takes_a_grant_for_a_global_cap():
    config = parse_config(CONFIG.replace("{capacity: 10}", "{capacity: 10, global: true}"), "t.yaml")
    room = StartRoom(config, alive={"a": 4}, stopping={"a": 2}, grants={"a": {"db": 5}})
    got = room.allow("a", 3)
    assert (got.allowed, got.stopping) == (1, 2) and "grant of db" in got.limit


def test_a_held_scale_up_looks_again_soon():
    assert pacing.stopping_follow_up(10.0, None) == 10.0 + pacing.STOPPING_GAP
    assert pacing.stopping_follow_up(10.0, 10.1) == 10.1


# -- the controller: the rule holds whatever decided the count ------------------------------------

FLEXIQ = "    policy: flexiq\n    flexiq: {target_queue_depth_per_worker: 1}\n"  # 200 jobs: it wants all 8
POOLS = {"flexiq": "pools:\n  default:\n    max_workers: 8\n" + FLEXIQ,
         "flexiqd": "pools:\n  default:\n    max_workers: 8\n"}


def controller(backend, text):
    clock = Clock()
    fleet = FakeFleet()
    made = build_controller(parse_config(text, "test.yaml"), backend, fleet, host="testhost", clock=clock,
                            pid_alive=lambda pid: True)
    return made, fleet, clock


def alive(fleet, pool="default") -> int:
    return sum(1 for (name, _), w in fleet.workers.items() if name == pool and w.state is not WorkerState.FAILED)


def scaled_in(fleet, clock, pool="default", stopping=range(2, 9)) -> None:
    """One worker left running and the ones a scale-in just stopped, still exiting."""
    fleet.add(pool, 1, started_at=clock.now - 100)
    for index in stopping:
        fleet.add(pool, index, WorkerState.DRAINING, started_at=clock.now - 100)


@pytest.mark.parametrize("kind", ["flexiq", "flexiqd"])
def test_a_burst_right_after_a_scale_in_starts_only_what_the_stopping_workers_leave(sqlite_backend, kind):
    control, fleet, clock = controller(sqlite_backend, POOLS[kind])
    scaled_in(fleet, clock)
    sqlite_backend.enqueue([NewJob(task="t")] * 200, now=clock.now - 60)

    decision = control.tick()["default"]
    assert fleet.started == [] and alive(fleet) == 8
    assert (decision.desired, decision.reason) == (1, "WaitingForStopping")
    assert control.waits_on_stopping

    exits = [(2, 3, 4), (5, 6, 7, 8)]
    for gone in exits:
        for index in gone:
            del fleet.workers[("default", index)]
        clock.now += 0.25
        control.tick()
        assert alive(fleet) <= 8
    if kind == "flexiq":  # it wants all 8: three start once three exit, the rest with the others
        assert len(fleet.started) == 7 and alive(fleet) == 8
    assert not control.waits_on_stopping


def test_the_start_holds_the_rule_when_the_decision_did_not(sqlite_backend, caplog):
    control, fleet, clock = controller(sqlite_backend, POOLS["flexiq"])
    scaled_in(fleet, clock)
    sqlite_backend.enqueue([NewJob(task="t")] * 200, now=clock.now - 60)
    # A decision made without knowing which workers are stopping (as a policy of its own would).
    blind = control.decide_and_steer
    control.decide_and_steer = lambda observations, now, stopping=None: blind(observations, now, None)
    with caplog.at_level(logging.INFO, logger="flexiqd.daemon.controller"):
        decision = control.tick()["default"]
    assert decision.desired == 8 and fleet.started == [] and alive(fleet) == 8
    assert "Pool default: 7 workers still stopping: starting 0 of 7 now, the rest as they exit" in caplog.text
    assert control.waits_on_stopping

    del fleet.workers[("default", 2)]
    control.tick()
    assert len(fleet.started) == 1 and alive(fleet) == 8


def test_an_operators_pin_starts_no_more_than_the_stopping_workers_leave(sqlite_backend):
    control, fleet, clock = controller(sqlite_backend, POOLS["flexiqd"])
    scaled_in(fleet, clock, stopping=range(2, 6))   # 1 running, 4 stopping
    control.operators.pin("default", 8, None)
    decision = control.tick()["default"]
    assert (decision.desired, decision.reason) == (4, "Pinned")
    assert len(fleet.started) == 3 and alive(fleet) == 8
    assert control.waits_on_stopping


def test_a_dependency_shared_by_two_pools_is_not_overrun_by_their_starts(sqlite_backend):
    text = ("dependencies:\n  db: {capacity: 6}\npools:\n"
            "  a:\n    max_workers: 6\n    queues: [qa]\n    uses: {db: {per_worker: 1}}\n" + FLEXIQ +
            "  b:\n    max_workers: 6\n    queues: [qb]\n    uses: {db: {per_worker: 1}}\n" + FLEXIQ)
    control, fleet, clock = controller(sqlite_backend, text)
    scaled_in(fleet, clock, "a", stopping=(2, 3, 4))
    fleet.add("b", 1, started_at=clock.now - 100)
    for queue in ("qa", "qb"):
        sqlite_backend.enqueue([NewJob(task="t", queue=queue)] * 200, now=clock.now - 60)
    decisions = control.tick()
    # a's 1 + 3 stopping and b's 1 hold five of six connections: one start, no more.
    assert alive(fleet, "a") + alive(fleet, "b") == 6 and len(fleet.started) == 1
    assert {d.reason for d in decisions.values()} == {"WaitingForStopping"}
    for index in (2, 3, 4):
        del fleet.workers[("a", index)]
    control.tick()
    assert alive(fleet, "a") + alive(fleet, "b") == 6 and len(fleet.started) == 4
