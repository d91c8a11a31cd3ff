"""The control loop's tick against a fake fleet and a real SQLite store (time injected)."""

from __future__ import annotations

import dataclasses
import os

import pytest

from flexiqd.config import parse_config
from flexiqd.daemon.compose import StateFiles, build_controller
from flexiqd.daemon.controller import choose_victims, free_indices
from flexiqd.errors import ConfigError, ControlError, FleetError, QueueError
from flexiqd.fleet.base import WorkerInfo, WorkerState
from flexiqd.queue.types import ClaimRequest, NewJob
from flexiqd.queue.url import open_backend

from fakes import Clock, FakeFleet

HOST = "testhost"


@pytest.fixture
def backend(tmp_path):
    store = open_backend(f"sqlite:///{tmp_path / 'q.db'}")
    yield store
    store.close()


def make(backend, text: str, *, alive=lambda pid: True, clock=None):
    config = parse_config(text, "test.yaml")
    fleet = FakeFleet()
    clock = clock or Clock()
    controller = build_controller(config, backend, fleet, host=HOST, clock=clock, pid_alive=alive)
    return controller, fleet, clock


POOL = "pools:\n  default:\n    max_workers: 8\n    concurrency: 2\n"


def test_a_burst_scales_the_pool_up_with_new_instance_numbers(backend):
    controller, fleet, clock = make(backend, POOL)
    fleet.add("default", 1, started_at=clock.now - 100)
    backend.enqueue([NewJob(task="t")] * 200, now=clock.now - 60)  # waiting a minute already
    decisions = controller.tick()
    decision = decisions["default"]
    assert decision.desired > decision.current == 1
    assert fleet.started == [("default", i) for i in range(2, decision.desired + 1)]
    assert controller.events[-1].previous == 1 and controller.events[-1].desired == decision.desired
    assert decision.reason.startswith("ScaleUp") or decision.reason == "RateLimited"


def test_an_idle_pool_is_brought_up_to_its_minimum(backend):
    controller, fleet, _ = make(backend, "pools:\n  default:\n    min_workers: 2\n")
    controller.tick()
    assert fleet.started == [("default", 1), ("default", 2)]


def test_a_failed_stats_read_holds_the_pool(backend, monkeypatch):
    controller, fleet, clock = make(backend, POOL)
    for index in (1, 2, 3):
        fleet.add("default", index, started_at=clock.now)

    def broken(*args, **kwargs):
        raise QueueError("the queue database is locked")

    monkeypatch.setattr(backend, "stats", broken)
    decision = controller.tick()["default"]
    assert decision.desired == decision.current == 3
    assert decision.reason == "HoldMetricsUnavailable"
    assert fleet.started == [] and fleet.stopped == []
    assert controller.status_line() == "default 3/8 stats unavailable (the queue database is locked), holding"


def test_the_leases_of_a_dead_worker_are_released_at_once(backend):
    clock = Clock()
    dead_pid, live_pid = 4242, 4343
    controller, fleet, _ = make(backend, POOL, alive=lambda pid: pid == live_pid, clock=clock)
    fleet.add("default", 1, pid=live_pid, started_at=clock.now)
    ids = backend.enqueue([NewJob(task="t")] * 3, now=clock.now)
    backend.claim(ClaimRequest(f"{HOST}:default-2:{dead_pid}", ("default",), 2, lease_seconds=300), now=clock.now)
    backend.claim(ClaimRequest(f"{HOST}:default-1:{live_pid}", ("default",), 1, lease_seconds=300), now=clock.now)
    backend.claim(ClaimRequest(f"otherhost:default-9:{dead_pid}", ("default",), 1), now=clock.now)
    controller.tick()
    owners = backend.lease_owners()
    assert f"{HOST}:default-2:{dead_pid}" not in owners       # released, long before its lease ends
    assert owners[f"{HOST}:default-1:{live_pid}"] == 1         # a live worker keeps its job
    released = [backend.get(i) for i in ids[:2]]
    assert all(job.state.value == "queued" and "worker default-2 died" in job.error for job in released)


def test_a_dead_workers_jobs_are_released_without_listing_the_fleet(backend):
    # What the daemon runs the moment systemd reports a unit change, before the next tick.
    clock = Clock()
    controller, fleet, _ = make(backend, POOL, alive=lambda pid: pid != 4242, clock=clock)
    fleet.list = lambda: pytest.fail("the fleet was listed")
    backend.enqueue([NewJob(task="t")] * 2, now=clock.now)
    backend.claim(ClaimRequest(f"{HOST}:default-2:4242", ("default",), 1, lease_seconds=300), now=clock.now)
    backend.claim(ClaimRequest(f"{HOST}:default-1:4343", ("default",), 1, lease_seconds=300), now=clock.now)
    assert controller.release_dead_workers() == {"default-1": 1}
    assert list(backend.lease_owners()) == [f"{HOST}:default-1:4343"]


def test_failed_workers_are_forgotten_and_replaced_below_the_minimum(backend):
    controller, fleet, clock = make(backend, "pools:\n  default:\n    min_workers: 2\n")
    fleet.add("default", 1, started_at=clock.now)
    fleet.add("default", 2, WorkerState.FAILED)
    controller.tick()
    assert fleet.forgotten == [("default", 2)]
    assert fleet.started == [("default", 2)]  # the number is free again


def test_workers_of_a_pool_no_longer_configured_are_drained(backend):
    controller, fleet, clock = make(backend, POOL)
    fleet.add("default", 1, started_at=clock.now)
    fleet.add("images", 1, started_at=clock.now)
    controller.tick()
    assert ("images", 1) in fleet.stopped and ("default", 1) not in fleet.stopped


def test_victims_are_starting_then_idle_then_newest():
    workers = [WorkerInfo("p", 1, WorkerState.ACTIVE, 11, 100.0),
               WorkerInfo("p", 2, WorkerState.ACTIVE, 12, 200.0),
               WorkerInfo("p", 3, WorkerState.ACTIVE, 13, 300.0),
               WorkerInfo("p", 4, WorkerState.STARTING, 14, None)]
    busy = {"p-3": 2, "p-2": 0}
    order = [w.index for w in choose_victims(workers, 4, busy)]
    assert order == [4, 2, 1, 3]  # starting; idle newest, idle older; the busy one last


def test_free_indices_fill_gaps_from_one():
    assert free_indices({1, 3}, 3) == [2, 4, 5]


def test_scale_in_waits_for_the_down_window_then_stops_idle_workers(backend):
    text = "pools:\n  default:\n    max_workers: 8\n    behavior: {down_window: 60s}\n"
    controller, fleet, clock = make(backend, text)
    for index in range(1, 5):
        fleet.add("default", index, started_at=clock.now + index)
    first = controller.tick()["default"]
    assert first.desired == 4  # the first dip after a start is held for the down window
    clock.now += 61
    for _ in range(5):
        controller.tick()
        clock.now += 61
    assert fleet.stopped, "an idle pool never shrank"
    assert fleet.stopped[0] == ("default", 4)  # the newest idle worker goes first


def test_reload_keeps_the_history_of_pools_that_stay(backend):
    controller, fleet, clock = make(backend, POOL)
    controller.tick()
    assert "default" in controller.histories
    controller.reconfigure(parse_config("pools:\n  default: {}\n  other: {}\n", "x"))
    assert "default" in controller.histories
    controller.reconfigure(parse_config("pools:\n  other: {}\n", "x"))
    assert "default" not in controller.histories


def test_the_flexiq_policy_reproduces_its_rationale(backend):
    text = ("pools:\n  default:\n    policy: flexiq\n    max_workers: 20\n"
            "    flexiq: {target_queue_depth_per_worker: 10, tolerance: 0}\n")
    controller, fleet, clock = make(backend, text)
    fleet.add("default", 1, started_at=clock.now)
    backend.enqueue([NewJob(task="t")] * 100, now=clock.now)
    backend.enqueue([NewJob(task="t", delay=3600)] * 500, now=clock.now)  # delayed: not counted
    decision = controller.tick()["default"]
    assert decision.desired == 10
    # The line flexiq 2.1 logs for the same inputs, byte for byte.
    assert controller.views["default"].line == \
        "autoscale: pending=100 running=0 workers=1 -> 10 (scale-up: depth=10 util=0 overload=False)"


def test_status_line_summarises_each_pool(backend):
    controller, fleet, clock = make(backend, POOL)
    fleet.add("default", 1, started_at=clock.now)
    backend.enqueue([NewJob(task="t")], now=clock.now - 2.1)
    controller.tick()
    assert controller.status_line().startswith("default ")
    assert "/8 age 2.1s ttd" in controller.status_line()


def test_a_p99_above_the_drain_budget_is_warned_about_once(backend, caplog):
    controller, fleet, clock = make(backend, "pools:\n  default:\n    drain_timeout: 5s\n")
    fleet.add("default", 1, started_at=clock.now)
    ids = backend.enqueue([NewJob(task="t")] * 3, now=clock.now - 20)
    backend.claim(ClaimRequest(f"{HOST}:default-1:1", ("default",), 3), now=clock.now - 20)
    from flexiqd.queue.types import Outcome

    backend.settle(f"{HOST}:default-1:1", [Outcome.ack(i) for i in ids], now=clock.now - 1)  # 19 s jobs
    controller.tick()
    controller.tick()
    warnings = [r for r in caplog.records if "exceeds drain_timeout" in r.getMessage()]
    assert len(warnings) == 1 and "p99 job duration 19.0s" in warnings[0].getMessage()


def test_finished_jobs_past_their_retention_are_removed_once_a_minute(backend):
    from flexiqd.queue.types import Outcome

    clock = Clock()
    controller, fleet, _ = make(backend, "retention: 1h\ndead_retention: 2h\n" + POOL, clock=clock)
    old, recent = backend.enqueue([NewJob(task="t"), NewJob(task="t")], now=clock.now - 7200)
    backend.claim(ClaimRequest("w", ("default",), 2), now=clock.now - 7200)
    backend.settle("w", [Outcome.ack(old)], now=clock.now - 3700)
    backend.settle("w", [Outcome.dead(recent, "bad")], now=clock.now - 3700)
    controller.tick()
    remaining = {job.id for job in backend.list_jobs(limit=10)}
    assert remaining == {recent}  # the done job is past 1h; the dead one is within 2h


def test_the_process_fleet_shuts_down_workers_that_already_exited():
    import sys

    from flexiqd.fleet.base import WorkerSpec
    from flexiqd.fleet.process import ProcessFleet, _Child

    fleet = ProcessFleet()
    spec = WorkerSpec(pool="p", app="a:q", queues=("q",), concurrency=1, drain_timeout=1,
                      lease_seconds=30, store_url="sqlite:////nonexistent.db")
    import subprocess

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    fleet._children[("p", 1)] = _Child(spec, 1, gone, 0.0)
    fleet.shutdown()  # must not trip over a worker that is no longer there
    assert fleet.pids() == []


# -- operators' intent: kept across restarts, published for workers -------------------------------

def restarted(backend, text, tmp_path, clock, fleet=None):
    """A new controller (a restarted daemon) over the same state folder."""
    fleet = fleet or FakeFleet()
    controller = build_controller(parse_config(text, "test.yaml"), backend, fleet, host=HOST, clock=clock,
                                  pid_alive=lambda pid: True,
                                  files=StateFiles(intent=str(tmp_path / "intent.json"),
                                                   paused=str(tmp_path / "paused.json")))
    return controller, fleet


def test_a_drain_a_pin_and_a_pause_survive_a_restart_and_an_ended_pin_does_not(backend, tmp_path):
    text = "pools:\n  default:\n    max_workers: 8\n  images: {}\n  mail: {}\n"
    clock = Clock()
    first, _ = restarted(backend, text, tmp_path, clock)
    first.operators.drain("default")
    first.operators.pin("images", 3, 60)
    first.operators.pause("mail")
    assert oct((tmp_path / "intent.json").stat().st_mode & 0o777) == "0o600"

    clock.now += 30
    second, fleet = restarted(backend, text, tmp_path, clock)
    fleet.add("default", 1, started_at=clock.now)
    decisions = second.tick()
    assert decisions["default"].desired == 0 and ("default", 1) in fleet.stopped  # still drained
    assert decisions["images"].desired == 3 and decisions["images"].reason == "Pinned"
    assert second.operators.overrides["images"].until == clock.now + 30  # the same absolute end
    assert decisions["mail"].reason == "Paused"

    clock.now += 31
    third, _ = restarted(backend, text, tmp_path, clock)
    assert "images" not in third.operators.overrides and third.operators.overrides["default"].pinned == 0


def test_a_damaged_intent_file_is_one_warning_not_a_failure(backend, tmp_path, caplog):
    (tmp_path / "intent.json").write_text("{not json")
    controller, _ = restarted(backend, POOL, tmp_path, Clock())
    assert controller.operators.overrides == {}
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "intent.json" in warnings[0] and "damaged" in warnings[0]


def test_a_paused_pool_is_published_and_workers_that_become_ready_are_paused(backend, tmp_path):
    from flexiqd.runtime_files import is_paused

    clock = Clock()
    controller, fleet = restarted(backend, POOL, tmp_path, clock)
    fleet.add("default", 1, started_at=clock.now)
    starting = fleet.add("default", 2, WorkerState.STARTING)
    controller.operators.pause("default")
    assert is_paused(str(tmp_path / "paused.json"), "default")
    assert fleet.signalled == [(("default", 1), True)]  # not the one still starting
    fleet.workers[("default", 2)] = WorkerInfo("default", 2, WorkerState.ACTIVE, starting.pid, clock.now)
    controller.tick()
    controller.tick()
    assert fleet.signalled == [(("default", 1), True), (("default", 2), True)]  # each once

    fleet.add("default", 3, WorkerState.STARTING)  # read paused.json while it said paused
    controller.operators.resume("default")
    assert not is_paused(str(tmp_path / "paused.json"), "default")
    fleet.workers[("default", 3)] = WorkerInfo("default", 3, WorkerState.ACTIVE, 999, clock.now)
    controller.tick()
    controller.tick()
    resumed = [who for who, paused in fleet.signalled if not paused]
    assert resumed == [("default", 1), ("default", 2), ("default", 3)]


def test_a_paused_pool_stays_paused_for_a_restarted_daemon(backend, tmp_path):
    clock = Clock()
    first, _ = restarted(backend, POOL, tmp_path, clock)
    first.operators.pause("default")
    second, fleet = restarted(backend, POOL, tmp_path, clock)
    fleet.add("default", 1, started_at=clock.now)
    second.tick()
    assert fleet.signalled == [(("default", 1), True)]


def test_the_tick_says_what_it_is_doing_while_it_runs(backend, monkeypatch):
    controller, fleet, clock = make(backend, POOL)
    seen = []

    def stats(queue, *, now, window=60.0, horizon=0.0):
        seen.append(controller.activity)
        return original(queue, now=now, window=window, horizon=horizon)

    original = backend.stats
    monkeypatch.setattr(backend, "stats", stats)
    controller.tick()
    assert seen == ["reading the queue stats of pool default"] and controller.activity is None


def test_a_reload_configures_the_fleet_with_the_new_specs(backend):
    controller, fleet, _ = make(backend, POOL)
    controller.reconfigure(parse_config("pools:\n  default:\n    drain_timeout: 2m\n", "x"))
    assert fleet.specs["default"].stop_timeout == 120 + 10


# -- the daemon's pure parts --------------------------------------------------------------------

def test_a_reload_that_changes_the_store_or_the_fleet_needs_a_restart():
    from flexiqd.daemon.service import restart_needed

    old = parse_config("store: sqlite:////a.db\n", "x")
    assert restart_needed(old, parse_config("store: sqlite:////a.db\ntick: 5s\n", "x")) is None
    why = restart_needed(old, parse_config("store: sqlite:////b.db\n", "x"))
    assert "'store' changed from sqlite:////a.db to sqlite:////b.db" in why and "restart" in why
    assert "'fleet' changed" in restart_needed(old, parse_config("store: sqlite:////a.db\nfleet: process\n", "x"))


def test_a_refused_store_change_shows_neither_password():
    from flexiqd.daemon.service import restart_needed

    old = parse_config("store: postgresql://flexiq:old-s3cret@db/flexiq\n", "x")
    new = parse_config("store: postgresql://flexiq@db2/flexiq?password=new-s3cret\n", "x")
    why = restart_needed(old, new)
    assert "postgresql://flexiq:***@db/flexiq" in why and "password=***" in why
    assert "s3cret" not in why


@pytest.mark.parametrize("url, shown", [
    ("postgresql://u:pw@h/db", "postgresql://u:***@h/db"),
    ("postgresql://u:p@ss@h:5432/db", "postgresql://u:***@h:5432/db"),  # an unescaped "@" in it
    ("postgresql://u:pw@[::1]:5432/db", "postgresql://u:***@[::1]:5432/db"),
    ("postgresql://u@h/db?sslmode=require&password=pw", "postgresql://u@h/db?sslmode=require&password=***"),
    ("postgresql:/u:pw@h/db", "postgresql:/u:***@h/db"),  # malformed: hidden all the same
    ("mysql://u:pw@h/db", "mysql://u:***@h/db"),
    ("u:pw@h/db", "u:***@h/db"),
    ("sqlite:////var/lib/flexiq/queue.db?busy_timeout=5", "sqlite:////var/lib/flexiq/queue.db?busy_timeout=5"),
    ("postgresql://u@[::1]:5432/db", "postgresql://u@[::1]:5432/db"),
])
def test_safe_url_hides_a_password_however_the_url_is_written(url, shown):
    from flexiqd.queue.url import safe_url

    assert safe_url(url) == shown


@pytest.mark.parametrize("store", ["mysql://u:pw-s3cret@h/db", "postgresql:/u:pw-s3cret@h/db"])
def test_a_rejected_store_url_is_shown_without_its_password(store):
    with pytest.raises(ConfigError) as caught:
        parse_config(f"store: '{store}'\n", "x")
    assert "pw-s3cret" not in str(caught.value) and "***" in str(caught.value)


def test_a_blocked_tick_is_reported_with_what_it_waits_for():
    from flexiqd.daemon.service import blocked_status

    assert blocked_status(42.3, "reading the queue stats of pool default", "default 1/4 age 0ms ttd 0ms") == \
        "tick blocked 42s reading the queue stats of pool default; default 1/4 age 0ms ttd 0ms"


def test_process_fleet_workers_start_with_the_pause_signals_blocked():
    import signal
    import subprocess
    import sys

    from flexiqd.fleet.process import spawn_with_signals_blocked

    probe = "print(open('/proc/self/status').read())"
    child = spawn_with_signals_blocked([sys.executable, "-c", probe], env={}, output=subprocess.PIPE)
    status = child.stdout.read().decode()
    child.wait()
    blocked = int(next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1], 16)
    assert blocked & (1 << (signal.SIGUSR1 - 1)) and blocked & (1 << (signal.SIGUSR2 - 1))
    assert not signal.pthread_sigmask(signal.SIG_BLOCK, []) & {signal.SIGUSR1, signal.SIGUSR2}  # ours untouched


# -- start cost, measured ------------------------------------------------------------------------

def _ready(fleet, pool, index, ready_after=None):
    """The fake worker ``pool-index`` became ready (as systemd reports it)."""
    import dataclasses

    worker = fleet.workers[(pool, index)]
    fleet.workers[(pool, index)] = dataclasses.replace(worker, state=WorkerState.ACTIVE, ready_after=ready_after)
    return fleet.workers[(pool, index)]


def _claim_as(backend, worker, now):
    from flexiqd.queue.owners import owner_name

    return backend.claim(ClaimRequest(owner_name(worker.instance, worker.pid, HOST), ("default",), 1), now=now)


def test_the_start_cost_runs_from_the_decision_to_the_workers_first_claim(backend):
    controller, fleet, clock = make(backend, POOL)
    fleet.add("default", 1, started_at=clock.now - 100)
    backend.enqueue([NewJob(task="t")] * 50, now=clock.now - 30)
    assert controller.tick()["default"].desired >= 2
    assert controller.views["default"].start_cost is None
    decided = clock.now
    new = _ready(fleet, "default", 2, ready_after=0.4)
    _claim_as(backend, new, decided + 0.7)
    clock.now += 1
    controller.tick()
    cost = controller.views["default"].start_cost
    assert (cost.seconds, cost.ready, cost.samples) == (pytest.approx(0.7), 0.4, 1)


def test_workers_asked_for_together_are_one_sample_the_first_to_claim():
    # Twenty units starting at once wait for each other: one start does not cost what the
    # twentieth's does, and a hold sized on that would keep idle workers for minutes.
    from flexiqd.daemon.startcost import StartCosts

    tracker = StartCosts()
    tracker.started("default", [f"default-{i}" for i in range(2, 22)], now=100.0)
    owners = {f"{HOST}:default-{i}:{1000 + i}": WorkerInfo("default", i, WorkerState.ACTIVE, 1000 + i, 101.0)
              for i in range(2, 22)}
    tracker.claimed({owner: 100.5 + 0.3 * n for n, owner in enumerate(owners)}, owners)
    assert tracker.estimate("default").as_dict() == {"seconds": 0.5, "ready": None, "samples": 1}
    tracker.started("default", ["default-30"], now=200.0)
    later = {f"{HOST}:default-30:2000": WorkerInfo("default", 30, WorkerState.ACTIVE, 2000, 201.0)}
    tracker.claimed({next(iter(later)): 200.7}, later)
    assert tracker.estimate("default").samples == 2  # a later decision is a sample of its own


def test_a_worker_started_with_nothing_waiting_is_not_measured(backend):
    controller, fleet, clock = make(backend, "pools:\n  default:\n    min_workers: 1\n")
    controller.tick()  # brought up to its minimum, idle
    worker = _ready(fleet, "default", 1)
    backend.enqueue([NewJob(task="t")], now=clock.now + 50)
    _claim_as(backend, worker, clock.now + 50)  # its first claim came with the first job
    clock.now += 51
    controller.tick()
    assert controller.views["default"].start_cost is None


@pytest.mark.parametrize("costs, expected", [
    ([0.5], 0.5),
    ([0.5, 0.7, 9.0], 0.7),                  # one slow start does not move the median
    ([0.4] * 9 + [2.0, 2.0, 2.0], 0.4),      # the last nine: 6 of 0.4 and 3 of 2.0
    ([5.0] * 5 + [0.3] * 9, 0.3),            # older starts leave the window
])
def test_the_start_cost_is_the_median_of_the_last_starts(costs, expected):
    from flexiqd.daemon.startcost import StartCosts

    tracker = StartCosts()
    for cost in costs:
        tracker.record("default", cost, None)
    assert tracker.estimate("default").seconds == pytest.approx(expected)
    assert tracker.estimate("other") is None


def test_start_costs_kept_by_a_previous_daemon_are_read_skipping_malformed_samples():
    from flexiqd.daemon.startcost import StartCosts

    tracker = StartCosts()
    tracker.load({"default": [[0.5, 0.2], [0.7, None], ["x", 1], [-1, None], [0.6]], "other": "junk"})
    assert tracker.estimate("default").as_dict() == {"seconds": 0.6, "ready": 0.2, "samples": 2}
    assert tracker.estimate("other") is None
    assert StartCosts().load(None) is None


# -- histories: operators' changes and a pool's creation enter them, and a restart keeps them ------

def _history_controller(backend, tmp_path, text=POOL, clock=None):
    config = parse_config(text, "test.yaml")
    fleet = FakeFleet()
    clock = clock or Clock()
    controller = build_controller(config, backend, fleet, host=HOST, clock=clock, pid_alive=lambda pid: True,
                                  files=StateFiles(intent=str(tmp_path / "intent.json"),
                                                   history=str(tmp_path / "history.json")))
    return controller, fleet, clock


def test_a_pin_enters_the_history_as_the_change_it_made(backend, tmp_path):
    controller, fleet, clock = _history_controller(backend, tmp_path)
    for index in (1, 2):
        fleet.add("default", index, started_at=clock.now - 100)
    backend.enqueue([NewJob(task="t")] * 200, now=clock.now - 60)  # the policy wants more
    controller.operators.pin("default", 5, None)
    decision = controller.tick()["default"]
    assert (decision.current, decision.desired, decision.reason) == (2, 5, "Pinned")
    assert [c.change for c in controller.histories["default"].changes] == [3]
    assert "Pinned: pinned at 5 by an operator (the policy wanted" in controller.events[-1].rationale


def test_a_pin_that_grows_the_pool_starts_no_more_at_once_than_its_dependencys_start_burst(backend, tmp_path):
    config = ("dependencies:\n  db: {capacity: 100, start_burst: 3}\n"
              "pools:\n  default:\n    max_workers: 20\n    uses: {db: {per_worker: 1}}\n")
    controller, fleet, clock = _history_controller(backend, tmp_path, config)
    fleet.add("default", 1, started_at=clock.now - 100)
    controller.operators.pin("default", 10, None)
    decision = controller.tick()["default"]
    assert (decision.current, decision.desired, decision.reason) == (1, 4, "Pinned")
    assert "starting 3 now, as starting:db allows" in decision.message
    clock.now += 1
    assert controller.tick()["default"].desired == 4  # the three are still starting
    for worker in fleet.list():
        fleet.add(worker.pool, worker.index, WorkerState.ACTIVE, started_at=clock.now)
    clock.now += 1
    assert controller.tick()["default"].desired == 7  # ready: the next three start


def test_a_pin_that_holds_the_count_records_no_change_the_policy_wanted(backend, tmp_path):
    controller, fleet, clock = _history_controller(backend, tmp_path)
    for index in (1, 2):
        fleet.add("default", index, started_at=clock.now - 100)
    backend.enqueue([NewJob(task="t")] * 200, now=clock.now - 60)
    controller.operators.pin("default", 2, None)
    assert controller.tick()["default"].changed is False
    assert controller.histories["default"].changes == ()


def test_a_new_pools_first_workers_enter_its_history_as_its_creation(backend, tmp_path, monkeypatch):
    import flexiqd.policy.history as history

    entered = []
    original = history.with_external_change
    monkeypatch.setattr(history, "with_external_change",
                        lambda history, policy, now, current, workers: entered.append((current, workers))
                        or original(history, policy, now, current, workers))
    controller, fleet, clock = _history_controller(backend, tmp_path, "pools:\n  default:\n    min_workers: 2\n")
    assert controller.tick()["default"].desired == 2
    assert entered == [(0, 2)]
    assert [c.change for c in controller.histories["default"].changes] == [2]


def test_a_restart_keeps_every_pools_history_and_start_cost(backend, tmp_path):
    from flexiqd.policy.history import history_to_dict

    controller, fleet, clock = _history_controller(backend, tmp_path)
    fleet.add("default", 1, started_at=clock.now - 100)
    backend.enqueue([NewJob(task="t")] * 200, now=clock.now - 60)
    controller.tick()
    controller.start_costs.record("default", 0.6, 0.3)
    controller.save_state()
    before = history_to_dict(controller.histories["default"])
    assert before["changes"]  # it scaled up: a rate limit's budget is in use

    again, _, _ = _history_controller(backend, tmp_path, clock=clock)
    assert history_to_dict(again.histories["default"]) == before
    assert again.start_costs.estimate("default").seconds == 0.6
    assert os.stat(tmp_path / "history.json").st_mode & 0o777 == 0o600


def test_a_restart_keeps_a_flexiq_pools_windows(backend, tmp_path):
    text = "pools:\n  default:\n    policy: flexiq\n    max_workers: 20\n    flexiq: {scale_down_window: 5m}\n"
    controller, fleet, clock = _history_controller(backend, tmp_path, text)
    fleet.add("default", 1, started_at=clock.now - 100)
    backend.enqueue([NewJob(task="t")] * 100, now=clock.now)
    controller.tick()
    controller.save_state()
    again, _, _ = _history_controller(backend, tmp_path, text, clock=clock)
    assert again.histories == controller.histories and again.histories["default"].seeded


def test_a_damaged_history_file_starts_afresh_in_one_line(backend, tmp_path, caplog):
    (tmp_path / "history.json").write_text("{not json")
    controller, _, _ = _history_controller(backend, tmp_path)
    assert controller.histories == {}
    [record] = [r for r in caplog.records if "history.json" in r.getMessage()]
    assert "Starting every pool's history afresh" in record.getMessage() and "damaged" in record.getMessage()


# -- every policy under every cap ------------------------------------------------------------------

FLEXIQ_AND_FLEXIQD = """dependencies:
  db: {capacity: 6}
pools:
  legacy:
    queues: [legacy]
    policy: flexiq
    max_workers: 20
    flexiq: {target_queue_depth_per_worker: 10, tolerance: 0}
    uses: {db: {per_worker: 1}}
  modern:
    queues: [modern]
    max_workers: 20
    uses: {db: {per_worker: 1}}
"""


@pytest.mark.parametrize("legacy_jobs, modern_jobs, expected", [
    # (legacy desired, reason), (modern desired <= , reason)
    (100, 0, ((5, "CappedByDependency"), (1, None))),     # what the idle pool's one worker leaves, no more
    (40, 0, ((4, "ScaleUp"), (1, None))),                  # under its share: flexiq's own count
    (100, 200, ((3, "CappedByDependency"), (3, None))),    # both want more: equal shares of 6
])
def test_a_flexiq_pool_keeps_to_dependency_shares_and_counts_against_them(backend, legacy_jobs, modern_jobs,
                                                                           expected):
    controller, fleet, clock = make(backend, FLEXIQ_AND_FLEXIQD)
    fleet.add("legacy", 1, started_at=clock.now - 100)
    fleet.add("modern", 1, started_at=clock.now - 100)
    backend.enqueue([NewJob(task="t", queue="legacy")] * legacy_jobs, now=clock.now - 60)
    backend.enqueue([NewJob(task="t", queue="modern")] * modern_jobs, now=clock.now - 60)
    decisions = controller.tick()
    (legacy, legacy_reason), (modern, _) = expected
    assert (decisions["legacy"].desired, decisions["legacy"].reason) == (legacy, legacy_reason)
    assert decisions["modern"].desired <= modern
    assert decisions["legacy"].desired + decisions["modern"].desired <= 6
    if legacy_reason == "CappedByDependency":
        assert decisions["legacy"].binding_cap.cap == "dependency:db"
        assert decisions["legacy"].message.endswith(f"; capped by dependency:db={legacy}")


# -- work coming due -------------------------------------------------------------------------------

@pytest.mark.parametrize("lead_time, expected", [("3s", 1), ("20s", 2)])
def test_the_pool_sees_the_delayed_jobs_coming_due_within_its_lead_time(backend, lead_time, expected):
    controller, fleet, clock = make(backend, POOL + f"    targets: {{age: 60s, lead_time: {lead_time}}}\n")
    backend.enqueue([NewJob(task="t", run_at=clock.now + s) for s in (2, 15, 3600)], now=clock.now)
    controller.tick()
    metrics = controller.views["default"].metrics
    assert (metrics.coming_due, metrics.coming_due_within) == (expected, float(lead_time[:-1]))


# -- decide_fleet, pure, from the config: both policies share one dependency ------------------------------------------

def _observation(pool, current, runnable=None, running=0):
    from flexiqd.policy import Observation, PoolMetrics

    metrics = None if runnable is None else PoolMetrics(runnable_depth=runnable, running=running,
                                                         oldest_runnable_age=30.0 if runnable else 0.0)
    return Observation(pool=pool, active=current, concurrency=1, metrics=metrics)


@pytest.mark.parametrize("legacy, modern, expected", [
    # legacy (flexiq) held at 4 by a failed read: its workers come off the top of db's 6
    ((4, None), (1, 200), {"legacy": (4, "HoldMetricsUnavailable"), "modern": (2, "ScaleUpAge")}),
    # modern held at 5: legacy (flexiq wants 10) gets what is left, and says so
    ((1, 100), (5, None), {"legacy": (1, "CappedByDependency"), "modern": (5, "HoldMetricsUnavailable")}),
    # modern idle at 1: legacy gets the other 5
    ((1, 100), (1, 0), {"legacy": (5, "CappedByDependency"), "modern": (1, "ScaleDownStabilized")}),
])
def test_decide_fleet_shares_a_dependency_between_the_two_policies(legacy, modern, expected):
    from flexiqd.policy import decide_fleet

    config = parse_config(FLEXIQ_AND_FLEXIQD, "test.yaml")
    observations = {"legacy": _observation("legacy", *legacy), "modern": _observation("modern", *modern)}
    inputs = [config.pools[name].decision_input(obs, None) for name, obs in observations.items()]
    decided = decide_fleet(inputs, list(config.dependencies.values()), 1000.0)
    got = {name: (d.desired, d.reason) for name, d in decided.items()}
    assert got == expected
    assert sum(desired for desired, _ in got.values()) <= 6
    for name, decision in decided.items():
        if decision.reason != "HoldMetricsUnavailable":
            assert decision.desired <= dict(decision.caps)["dependency:db"]  # each policy under its share


def test_an_operator_clears_a_measured_ceiling_and_it_is_measured_again(backend):
    from flexiqd.policy.types import KneeState, ThroughputSample

    controller, fleet, clock = make(backend, POOL)
    fleet.add("default", 1, started_at=clock.now - 100)
    controller.tick()
    knee = KneeState(samples=(ThroughputSample(2, 80.0, 0.05, clock.now, 160),), held_at=2, held_since=clock.now)
    controller.histories["default"] = dataclasses.replace(controller.histories["default"], knee=knee)
    controller.operators.clear_ceiling("default")
    clock.now += 1
    controller.tick()
    assert controller.histories["default"].knee.held_at is None
    assert controller.histories["default"].knee.samples == ()
    with pytest.raises(ControlError, match="nosuchpool"):
        controller.operators.clear_ceiling("nosuchpool")


def test_workers_that_cannot_be_listed_hold_every_pool_and_say_so_once_per_reason(backend, monkeypatch, caplog):
    controller, fleet, clock = make(backend, POOL)
    for index in (1, 2, 3):
        fleet.add("default", index, started_at=clock.now)
    controller.tick()
    backend.enqueue([NewJob(task="t")] * 500, now=clock.now - 60)  # what would grow the pool
    listing = fleet.list

    def unreachable():
        raise FleetError("cannot connect to systemd over the system bus: Connection refused")

    monkeypatch.setattr(fleet, "list", unreachable)
    caplog.set_level("INFO")
    for _ in range(4):
        clock.now += 0.5
        assert controller.tick() == {}
    assert fleet.started == [] and fleet.stopped == []
    assert controller.status_line().startswith(
        "holding every pool, workers cannot be listed: cannot connect to systemd over the system bus")
    holding = [r for r in caplog.records if "Holding every pool" in r.getMessage()]
    assert len(holding) == 1  # not one a tick
    clock.now += 31
    controller.tick()
    assert len([r for r in caplog.records if "Holding every pool" in r.getMessage()]) == 2

    monkeypatch.setattr(fleet, "list", listing)
    clock.now += 0.5
    assert controller.tick()["default"].desired > 3  # sized again, on fresh figures
    assert controller.fleet_problem is None and not controller.status_line().startswith("holding")
    assert any("Listing the workers again after 33.0s" in r.getMessage() for r in caplog.records)


def test_a_reload_while_systemd_is_out_of_reach_configures_the_workers_at_the_next_tick_that_reaches_it(
        backend, monkeypatch):
    controller, fleet, clock = make(backend, POOL)
    fleet.add("default", 1, started_at=clock.now)
    configured = []

    def unreachable(specs):
        raise FleetError("cannot connect to systemd over the system bus: Connection refused")

    monkeypatch.setattr(fleet, "configure", unreachable)
    monkeypatch.setattr(fleet, "list", lambda: (_ for _ in ()).throw(FleetError("the bus is away")))
    reloaded = parse_config(POOL.replace("max_workers: 8", "max_workers: 6"), "test.yaml")
    controller.reconfigure(reloaded)          # nothing raised: the daemon goes on
    assert controller.config is reloaded      # in force, though not yet on the running workers
    clock.now += 1
    assert controller.tick() == {}            # still away: every pool held
    monkeypatch.undo()                        # the bus is back
    monkeypatch.setattr(fleet, "configure", lambda specs: configured.append([s.pool for s in specs]))
    clock.now += 1
    controller.tick()
    clock.now += 1
    controller.tick()
    assert configured == [["default"]]      # once, at the first tick that reached systemd


def test_closing_the_controller_ends_its_probes_threads(backend):
    import threading

    # Port 1 on the loopback refuses at once: the probe's thread runs rounds that fail quickly.
    controller, _, _ = make(backend, "fleet: process\ndependencies: {db: {capacity: 10, probe: {tcp: '127.0.0.1:1'}}}\n"
                               "pools: {default: {uses: {db: {per_worker: 1}}}}\n")
    probes = [t for t in threading.enumerate() if t.name == "probe-db"]
    assert probes and all(t.is_alive() for t in probes)
    controller.close()
    for thread in probes:
        thread.join(timeout=5)
    assert not any(t.is_alive() for t in probes)
