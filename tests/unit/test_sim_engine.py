"""The simulation: deterministic, conserves jobs, counts kills, integrates costs."""

from __future__ import annotations

import pytest

from flexiqd.sim.bench import policies_for
from flexiqd.sim.engine import FleetModel, Simulation, run
from flexiqd.sim.metrics import percentile, time_weighted_percentile
from flexiqd.sim.policies import Flexiq, Flexiqd, KedaDepth
from flexiqd.sim.trace import parse_trace, realise

from test_sim_support import small_data, small_trace

ONE_LONG_JOB = {"kind": "constant", "value": 50.0}


def conserved(result) -> bool:
    return result.enqueued == (result.completed + result.queued + result.running
                               + result.requeue_pending + result.delayed)


@pytest.mark.parametrize("index", range(6), ids=["fixed-peak", "hpa-cpu", "keda-depth", "flexiq", "flexiqd", "oracle"])
def test_every_enqueued_job_is_accounted_for_under_every_policy(index):
    trace = small_trace()
    workload = realise(trace)
    result = run(trace, workload, policies_for(workload)[index])
    assert conserved(result)
    assert result.enqueued == len([at for at in workload.enqueued_at if at < trace.duration])
    assert result.completed > 0


def test_a_jobs_completion_time_counts_its_wait_and_its_run():
    from flexiqd.sim.engine import Simulation

    trace = small_trace()
    workload = realise(trace)
    policy = KedaDepth()
    result = run(trace, workload, policy)
    # Each completed job waited, then ran: done comes no sooner than its start.
    assert result.completed > 0 and result.completion_p95 > 0
    assert result.completion_p95 >= result.wait_p95
    sim = Simulation(trace, workload, policy.fleet(trace), 1)
    sim.run_until(trace.duration)
    assert len(sim.turnarounds) == sim.completed
    assert all(done >= 0 for done in sim.turnarounds)


def test_a_look_ahead_adds_nothing_to_the_runs_completion_times():
    # The oracle runs forks of the simulation ahead; their completions are not the run's.
    trace = small_trace()
    workload = realise(trace)
    sim = Simulation(trace, workload, KedaDepth().fleet(trace), 2)
    sim.run_until(60.0)
    done = list(sim.turnarounds)
    twin = sim.fork()
    twin.run_until(120.0)
    assert twin.turnarounds and sim.turnarounds == done


def test_jobs_not_done_when_the_run_ends_count_with_the_time_they_have_been_runnable():
    # Ten-minute jobs on a five-minute run: none completes, and the p95 still says how long
    # they have been runnable (a policy that starts them late is not judged on no jobs at all).
    trace = small_trace(jobs={"duration": {"kind": "constant", "value": 600.0}}, dependency=None)
    result = run(trace, realise(trace), KedaDepth())
    assert result.completed == 0
    assert 200.0 < result.completion_p95 < trace.duration


def test_a_run_is_deterministic():
    trace = small_trace()
    workload = realise(trace)
    assert run(trace, workload, Flexiqd()) == run(trace, realise(trace), Flexiqd())


def test_different_policies_see_the_same_jobs():
    trace = small_trace()
    workload = realise(trace)
    assert run(trace, workload, KedaDepth()).enqueued == run(trace, workload, Flexiqd()).enqueued


def _long_jobs_simulation(fleet: FleetModel, workers: int = 4) -> Simulation:
    data = small_data(arrivals=[{"kind": "burst", "at": 0, "jobs": 8, "duration": ONE_LONG_JOB}], dependency=None)
    trace = parse_trace(data)
    sim = Simulation(trace, realise(trace), fleet, workers)
    sim.run_until(1.0)
    assert len(sim.running) == 8
    return sim


def test_draining_waits_for_jobs_within_the_stop_timeout():
    sim = _long_jobs_simulation(FleetModel("patient", victims="idle_first", drain_timeout=100.0))
    sim.scale_to(2)
    assert sim.counts() == (0, 2, 2)
    sim.run_until(60.0)
    assert sim.killed == 0 and sim.completed == 8
    assert sim.counts() == (0, 2, 0)


def test_jobs_past_the_drain_timeout_are_killed_counted_and_requeued_at_once():
    sim = _long_jobs_simulation(FleetModel("flexiqd", victims="idle_first", drain_timeout=10.0))
    sim.scale_to(2)
    sim.run_until(12.0)
    assert sim.killed == 4
    # Released jobs are runnable again at once; the two survivors are full, so they wait.
    assert len(sim.queue) == 4 and sim.requeue_pending == 0
    sim.run_until(300.0)
    assert sim.completed == 8


def test_flexiq_stops_a_draining_worker_again_and_that_kills_it():
    sim = _long_jobs_simulation(FleetModel("flexiq", victims="oldest_first", counts_draining=True,
                                           resignal_kills=True, drain_timeout=35.0, requeue_delay=37.7))
    sim.scale_to(3)  # drains the oldest worker; it still counts as current
    assert sim.current() == 4
    sim.run_until(5.0)
    sim.scale_to(3)  # picks the same oldest worker again: second SIGTERM
    assert sim.killed == 2
    assert sim.requeue_pending == 2 and len(sim.queue) == 0
    sim.run_until(45.0)
    assert sim.requeue_pending == 0


def test_worker_seconds_count_booting_active_and_draining_workers():
    data = small_data(arrivals=[{"kind": "burst", "at": 0, "jobs": 1, "duration": ONE_LONG_JOB}], dependency=None)
    trace = parse_trace(data)
    sim = Simulation(trace, realise(trace), FleetModel("f", victims="idle_first"), 1)
    sim.scale_to(3)  # two more boot for 3 s
    sim.run_until(10.0)
    assert sim.worker_seconds == pytest.approx(30.0)


def test_seconds_over_target_and_over_capacity_are_integrated():
    data = small_data(arrivals=[{"kind": "burst", "at": 0, "jobs": 40, "duration": {"kind": "constant", "value": 20}}])
    trace = parse_trace(data)
    sim = Simulation(trace, realise(trace), FleetModel("f", victims="idle_first"), 1)
    sim.run_until(100.0)
    # Two slots, 20 s jobs: the 3rd job waits 20 s, ..., the oldest is past 30 s from t=30 on.
    assert sim.slo_seconds == pytest.approx(70.0)
    assert sim.over_capacity_seconds == 0.0  # 2 jobs x 0.5 + 2 < 10
    crowded = Simulation(trace, realise(trace), FleetModel("f", victims="idle_first"), 12)
    crowded.run_until(10.0)
    assert crowded.over_capacity_seconds == pytest.approx(10.0)  # 24 x 0.5 + 2 = 14 > 10
    assert max(crowded.inflation) > 1.0


def test_the_dependency_stretches_jobs_past_its_capacity():
    dep = small_trace().dependency
    assert dep.slowdown(0.5) < 1.1
    assert dep.slowdown(2.0) > 2 * dep.slowdown(1.0)


def test_flexiq_counts_delayed_jobs_as_pending_and_flexiqd_does_not():
    data = small_data(arrivals=[{"kind": "steady", "rate": 5.0, "delay": 1000, "duration": ONE_LONG_JOB}],
                      dependency=None)
    trace = parse_trace(data)
    workload = realise(trace)
    assert run(trace, workload, Flexiq()).worker_seconds > 2 * run(trace, workload, Flexiqd()).worker_seconds


def test_percentiles():
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert percentile([], 0.5) is None
    assert time_weighted_percentile({1.0: 90.0, 5.0: 10.0}, 0.95) == 5.0
    assert time_weighted_percentile({1.0: 90.0, 5.0: 10.0}, 0.5) == 1.0


# --- parity with the job store ---------------------------------------------------------------

def _scripted_run(requeue_delay):
    """A small pool under a burst, steady work and scheduled work, with a scale-in that kills.

    Returns the simulation's snapshots at checkpoints, the trace's jobs, and the journal of
    what ran when: the same script then drives the store.
    """
    trace = parse_trace(small_data(duration=200, dependency=None))
    workload = realise(trace)
    fleet = FleetModel("test", victims="oldest_first", drain_timeout=2.0, requeue_delay=requeue_delay)
    sim = Simulation(trace, workload, fleet, 3)
    sim.journal = []
    snapshots, orphans = [], 0
    for at in [1.5 + 6.7 * i for i in range(30)]:
        sim.run_until(at)
        snapshots.append(sim.snapshot())
        orphans += len(sim.orphaned)
        if 120 < at < 128:
            sim.scale_to(1)  # busy workers killed 2 s later: their jobs go back to the queue
        elif 140 < at < 148:
            sim.scale_to(3)
    assert sim.killed > 0 and sim.completed > 100
    assert (orphans > 0) == (requeue_delay > 0)  # a checkpoint sees killed jobs still leased
    return trace, workload, sim.journal, snapshots


def _store_stats_along(backend, workload, journal, checkpoints, requeue_delay):
    """The store's stats at each checkpoint, with the same jobs enqueued, claimed, finished and
    lost at the same instants as in the simulation.  A killed worker's jobs come back at once, or
    after the fleet's re-queue delay (as the lease of a gone worker expires)."""
    from flexiqd.queue.types import ClaimRequest, NewJob, Outcome

    script = [(at, 0, "enqueue", job, -1) for job, at in enumerate(workload.enqueued_at) if at < 200]
    script += [(at, 1, kind, job, worker) for at, kind, job, worker in journal]
    script += [(at, 2, "stats", index, -1) for index, at in enumerate(checkpoints)]
    script.sort(key=lambda step: step[:2])  # stable: the journal keeps its own order on a tie
    ids, stats, killed = {}, [], {}
    for at, _, kind, job, worker in script:
        if kind == "enqueue":
            run_at = workload.runnable_at[job]
            [ids[job]] = backend.enqueue([NewJob(task="t", run_at=run_at, max_attempts=100)], now=at)
        elif kind == "start":
            request = ClaimRequest(owner=f"w{worker}", queues=("default",), limit=1, lease_seconds=1e6)
            [claimed] = backend.claim(request, now=at)
            ids[job] = claimed.id  # the store's oldest runnable job: it stands in for this one
        elif kind == "finish":
            assert backend.settle(f"w{worker}", [Outcome.ack(ids[job])], now=at) == [ids[job]]
        elif kind == "kill":
            killed[job] = f"w{worker}"
            if requeue_delay == 0:
                backend.recover_owner(killed[job], now=at, reason="killed")
        elif kind == "requeue":
            backend.recover_owner(killed[job], now=at, reason="lease expired")
        else:
            stats.append(backend.stats("default", now=at))
    return stats


@pytest.mark.parametrize("requeue_delay", [0.0, 9.0], ids=["released", "lease-expiry"])
def test_the_simulator_sees_what_the_store_reports_for_the_same_jobs(sqlite_backend, requeue_delay):
    trace, workload, journal, snapshots = _scripted_run(requeue_delay)
    stats = _store_stats_along(sqlite_backend, workload, journal, [s.now for s in snapshots], requeue_delay)
    compared = 0
    for snap, store in zip(snapshots, stats):
        seen = (snap.runnable, snap.delayed, snap.running, snap.arrival_rate, snap.completion_rate,
                snap.rate_window, snap.duration_p50, snap.duration_p95, snap.duration_p99)
        reported = (store.runnable, store.delayed, store.running, store.arrival_rate, store.completion_rate,
                    store.window, store.duration_p50, store.duration_p95, store.duration_p99)
        assert seen == reported, f"at t={snap.now}"
        assert snap.oldest_age == pytest.approx(store.oldest_runnable_age, abs=1e-9), f"at t={snap.now}"
        if hasattr(store, "running_age_mean"):
            assert snap.running_age_mean == pytest.approx(store.running_age_mean, abs=1e-9), f"at t={snap.now}"
        if hasattr(store, "coming_due"):  # the store's forecast of scheduled work, by the same definition
            assert coming_due(workload, snap.now, store.coming_due_within) == store.coming_due, f"at t={snap.now}"
        compared += 1
    # The scenario must exercise what it compares: a backlog, delayed jobs, kills, the first minute.
    assert compared == 30
    assert max(s.runnable for s in snapshots) > 20 and max(s.delayed for s in snapshots) > 5
    assert any(kind == "kill" for _, kind, _, _ in journal)
    assert 0 < snapshots[0].arrival_rate < 1.0  # a few arrivals over 60 s, not over 1.5 s


def coming_due(workload, now, within):
    """Jobs enqueued by ``now`` whose run-at is still ahead, at most ``within`` s away."""
    return sum(1 for run_at, enqueued in zip(workload.runnable_at, workload.enqueued_at)
               if enqueued <= now < run_at <= now + within)


@pytest.mark.parametrize("within", [0.0, 10.0, 60.0, 99.0, 100.0, 1000.0])
def test_coming_due_counts_the_delayed_jobs_whose_run_at_is_near(within):
    trace = small_trace()
    workload = realise(trace)
    sim = Simulation(trace, workload, FleetModel("test", victims="idle_first"), 2)
    sim.coming_due_within = within
    counts = []
    for at in (0.0, 50.5, 150.0, 299.0):
        sim.run_until(at)
        assert sim.coming_due(within) == coming_due(workload, at, within), f"at t={at}"
        assert sim.snapshot().coming_due == sim.coming_due(within)
        counts.append(sim.coming_due(within))
    assert sim.coming_due(1000.0) == sim.delayed()  # every delayed job is due within its 100 s delay
    if within >= 60:
        assert max(counts) > 0


def test_the_running_jobs_age_and_the_start_cost_are_seen():
    data = small_data(arrivals=[{"kind": "burst", "at": 0, "jobs": 2, "duration": ONE_LONG_JOB},
                                {"kind": "burst", "at": 10, "jobs": 2, "duration": ONE_LONG_JOB}],
                      dependency=None)
    trace = parse_trace(data)
    sim = Simulation(trace, realise(trace), FleetModel("test", victims="idle_first"), 2)
    assert sim.snapshot().running_age_mean is None
    sim.run_until(20.0)
    snap = sim.snapshot()
    assert snap.running == 4 and snap.running_age_mean == pytest.approx((20 + 20 + 10 + 10) / 4)
    assert snap.start_cost == trace.workers.cold_start == 3.0
    instant = Simulation(trace, realise(trace), FleetModel("oracle", victims="idle_first", instant_start=True), 1)
    assert instant.snapshot().start_cost == 0.0


def test_a_quiescing_fleet_pauses_busy_workers_instead_of_killing_them_and_takes_them_back():
    sim = _long_jobs_simulation(FleetModel("flexiqd", victims="idle_first", drain_timeout=10.0, quiesce=True))
    sim.scale_to(2)
    assert sim.counts() == (0, 2, 2)  # two busy workers stopped claiming
    sim.run_until(12.0)
    assert sim.killed == 0  # the stop timeout does not cut a paused worker's jobs
    sim.scale_to(3)  # a scale-up resumes a paused worker before starting a unit
    assert sim.counts() == (0, 3, 1)
    sim.run_until(300.0)
    assert sim.killed == 0 and sim.completed == 8


def test_the_simulated_daemon_asks_for_work_coming_due_within_its_lead_time():
    from flexiqd.policy.economics import lead_time

    trace = small_trace()
    sim = Simulation(trace, realise(trace), FleetModel("flexiqd", victims="idle_first"), 1)
    policy = Flexiqd()
    policy.start(trace, sim)
    expected = lead_time(policy.policy.targets, trace.workers.cold_start, trace.tick_interval)
    assert sim.coming_due_within == expected < 60.0
