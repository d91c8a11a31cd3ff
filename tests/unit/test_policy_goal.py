"""flexiqd's policy against the goal on a fixed sample of workloads drawn at random.

One workload of each family (``sim.families``), drawn with a fixed seed, run
through the simulator with flexiqd's policy and the oracle (and KEDA's depth
rule where the dependency is undeclared: the goal there is a quarter of its
time over capacity).  The simulator is deterministic, so this is not a timed
test: the same workloads give the same verdicts on any machine.  The goal is
``report.check_goal``'s: seconds over the age target at most 1.1 x the
oracle's + 5 s, none over a declared capacity, at most 1.25 x the oracle's
worker-seconds, no busy worker killed.  Where the policy does not meet it
yet, the case is a strict expected failure naming what it misses, so that
both a regression and an improvement show here.
"""

from __future__ import annotations

import pytest

from flexiqd.sim.engine import run
from flexiqd.sim.families import FAMILIES, sample
from flexiqd.sim.oracle import Oracle
from flexiqd.sim.policies import Flexiqd, KedaDepth
from flexiqd.sim.report import TraceReport, check_goal
from flexiqd.sim.trace import realise

# Minutes of simulation: `make test` runs it, `make check` (not slow) does not.
pytestmark = pytest.mark.slow

SEED = 7
WORKLOADS = {trace.name: trace for trace in sample(len(FAMILIES), SEED)}

# What the policy does not meet yet, measured: the workload and the part of the goal.
NOT_YET = {
    "square_wave-927330": ("2.14 x the oracle's worker-seconds: a start and a tick (10 s) take the whole 10 s "
                           "target, so the pool holds through each trough; the oracle starts workers for free"),
}


def report_for(name: str) -> TraceReport:
    trace = WORKLOADS[name]
    workload = realise(trace)
    policies = [Flexiqd(), Oracle()]
    if trace.dependency is not None and not trace.dependency.declared:
        policies.insert(0, KedaDepth())
    return TraceReport(trace=trace, results=tuple(run(trace, workload, policy) for policy in policies))


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=NOT_YET[name])) if name in NOT_YET else name
    for name in WORKLOADS
])
def test_flexiqd_meets_the_goal_on_a_workload_it_was_not_tuned_on(name):
    report = report_for(name)
    goal = check_goal(report)
    flexiqd = report.result("flexiqd")
    assert goal.met, (f"{name}: {', '.join(goal.shortfalls())}: {flexiqd.slo_seconds:.0f} s over target "
                      f"(oracle {report.result('oracle').slo_seconds:.0f}), {report.cost_ratio(flexiqd):.2f} x, "
                      f"{flexiqd.killed} killed, {flexiqd.over_capacity_seconds:.0f} s over capacity")
