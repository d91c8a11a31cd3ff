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
