"""The oracle: meets the age target at the least cost it can find, within the dependency's ceiling."""

from __future__ import annotations

from flexiqd.sim.engine import run
from flexiqd.sim.oracle import Oracle, dependency_ceiling
from flexiqd.sim.policies import FixedPeak, Flexiqd
from flexiqd.sim.trace import parse_trace, realise

from test_sim_support import small_data, small_trace


def test_the_oracle_meets_the_target_cheaper_than_a_fleet_sized_for_peak():
    trace = small_trace(dependency=None)
    workload = realise(trace)
    oracle = run(trace, workload, Oracle())
    fixed = run(trace, workload, FixedPeak(workload.runnable_at, workload.base_duration))
    assert oracle.slo_seconds == 0.0
    assert oracle.wait_max <= trace.target_age
    assert oracle.worker_seconds < fixed.worker_seconds
    assert oracle.worker_seconds <= run(trace, workload, Flexiqd()).worker_seconds


def test_the_oracle_never_passes_the_dependency_ceiling():
    trace = small_trace()
    # (10 - 2 reserved) / (2 slots x 1 x 0.5) = 8 workers
    assert dependency_ceiling(trace) == 8
    result = run(trace, realise(trace), Oracle())
    assert result.over_capacity_seconds == 0.0
    assert max(point.workers for point in result.timeline) <= 8


def test_without_a_dependency_the_ceiling_is_max_workers():
    assert dependency_ceiling(parse_trace(small_data(dependency=None))) == 12
