"""The daemon and the simulator decide alike: one decision path (DESIGN.md, principle 7).

A simulated run of the ``Flexiqd`` policy is recorded -- every tick's Observation
and Decision, as the simulator's driver passed them through ``decide_fleet`` --
and the same observations are fed, in order, through the decision step of a
daemon's ``Controller`` (``decide_and_steer``, what ``tick`` runs between
observing and applying) configured from YAML for the same pool.  Every decision
(count, reason, binding cap, start allowances, all of it) and the histories they
leave must be identical.  The two translations of the pool -- the config
loader's and the simulator's ``flexiqd_pool_policy`` -- must agree too, so a
drift in either fails here.
"""

from __future__ import annotations

import dataclasses

import pytest

import flexiqd.sim.policies as sim_policies
from flexiqd.config import parse_config
from flexiqd.daemon.compose import build_controller
from flexiqd.daemon.controller import Controller
from flexiqd.policy import Decision, History, Observation
from flexiqd.sim.engine import run
from flexiqd.sim.trace import Trace, parse_trace, realise
from flexiqd.queue.url import open_backend

from fakes import FakeFleet


def burst_trace(min_workers: int, initial: int) -> Trace:
    """A backlog big enough that the pool wants far more than ``start_burst`` (8) new workers
    at once, on a declared database: the ``starting:db`` cap must bind."""
    return parse_trace({
        "name": "burst_db", "seed": 11, "duration": 900, "tick_interval": 5, "target_age": 30,
        "workers": {"concurrency": 4, "cold_start": 5, "min": min_workers, "max": 40, "initial": initial,
                    "stop_timeout": 60},
        "jobs": {"duration": {"kind": "lognormal", "median": 2.0, "p99": 8.0}},
        "arrivals": [{"kind": "steady", "rate": 2.0},
                     {"kind": "burst", "at": 120, "jobs": 2000, "spread": 10},
                     {"kind": "burst", "at": 600, "jobs": 1000, "spread": 5}],
        # per worker: 4 slots x 1 connection x 0.5 of the time = 2 connections, exact in binary.
        "dependency": {"name": "db", "capacity": 100, "per_job": 1, "share": 0.5, "request_load": 10,
                       "declared": True},
    }, source="burst_db")


def daemon_yaml(min_workers: int) -> str:
    """The daemon's config for the trace's pool, written as an operator would."""
    return f"""\
tick: 5s
dependencies:
  db: {{capacity: 100, reserved: 10}}
pools:
  burst_db:
    min_workers: {min_workers}
    scale_to_zero: {"true" if min_workers == 0 else "false"}
    max_workers: 40
    concurrency: 4
    targets: {{age: 30s}}
    uses: {{db: {{per_worker: 2}}}}
"""


@dataclasses.dataclass(frozen=True)
class Recorded:
    """One simulated run: each tick's (now, observation, decision), and the history it ended with."""

    ticks: list[tuple[float, Observation, Decision]]
    history: History | None


def simulate(trace: Trace) -> Recorded:
    """Run the simulator's ``Flexiqd`` policy over ``trace``, recording what its driver decided."""
    ticks = []
    decide_fleet = sim_policies.decide_fleet

    def recording(pools, dependencies, now):
        decisions = decide_fleet(pools, dependencies, now)
        [pool] = pools  # the simulator runs one pool
        ticks.append((now, pool.observation, decisions[pool.name]))
        return decisions

    policy = sim_policies.Flexiqd()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sim_policies, "decide_fleet", recording)
        run(trace, realise(trace), policy)
    assert len(ticks) == trace.duration / trace.tick_interval, "the simulator no longer decides through decide_fleet"
    return Recorded(ticks, policy.history)


@pytest.fixture
def backend(tmp_path):
    store = open_backend(f"sqlite:///{tmp_path / 'q.db'}")  # never read: only the decision step runs
    yield store
    store.close()


def daemon(text: str, backend) -> Controller:
    return build_controller(parse_config(text, "flexiqd.yaml"), backend, FakeFleet(), host="testhost",
                            clock=lambda: 0.0, pid_alive=lambda pid: True)


def first_difference(sim: Recorded, daemon_decisions: list[Decision]) -> str:
    """Where the daemon first decided otherwise, and in which of the decision's fields."""
    for (now, _, sim_decision), daemon_decision in zip(sim.ticks, daemon_decisions):
        if daemon_decision != sim_decision:
            fields = [f.name for f in dataclasses.fields(Decision)
                      if getattr(daemon_decision, f.name) != getattr(sim_decision, f.name)]
            return (f"at t={now:g}s the fields {fields} differ: daemon {daemon_decision.line()!r}, "
                    f"simulator {sim_decision.line()!r}")
    return "no decision differs"


# (min_workers, initial workers) of the trace's pool.
RUNNING_POOL = (1, 2)
POOL_FROM_NOTHING = (0, 0)


@pytest.fixture(scope="module")
def recorded() -> dict[tuple[int, int], Recorded]:
    return {case: simulate(burst_trace(*case)) for case in (RUNNING_POOL, POOL_FROM_NOTHING)}


@pytest.mark.parametrize("min_workers, initial", [RUNNING_POOL, POOL_FROM_NOTHING])
def test_the_daemons_config_is_the_simulators_policy(min_workers, initial):
    trace = burst_trace(min_workers, initial)
    config = parse_config(daemon_yaml(min_workers), "flexiqd.yaml")
    policy, dependencies = sim_policies.flexiqd_pool_policy(trace)
    pool = config.pools[trace.name]
    assert pool.policy_kind == "flexiqd"
    assert pool.policy == policy
    assert tuple(config.dependencies.values()) == dependencies
    assert (pool.concurrency, config.tick) == (trace.workers.concurrency, trace.tick_interval)
    assert not config.global_dependencies and not config.global_max_workers  # no fleet grants on either side


@pytest.mark.parametrize("min_workers, initial", [
    RUNNING_POOL,
    # A pool that starts from nothing: both enter its first worker as the pool's creation.
    POOL_FROM_NOTHING,
])
def test_the_daemon_decides_the_recorded_observations_as_the_simulator_did(min_workers, initial, recorded,
                                                                           backend):
    sim = recorded[(min_workers, initial)]
    controller = daemon(daemon_yaml(min_workers), backend)
    daemon_decisions = []
    for now, observation, _ in sim.ticks:
        decisions = controller.decide_and_steer({observation.pool: observation}, now)
        daemon_decisions.append(decisions[observation.pool])
    sim_decisions = [decision for _, _, decision in sim.ticks]

    def summary(decisions):
        return [(d.current, d.desired, d.reason, d.binding_cap) for d in decisions]

    assert summary(daemon_decisions) == summary(sim_decisions)
    assert daemon_decisions == sim_decisions, first_difference(sim, daemon_decisions)
    assert controller.histories == {"burst_db": sim.history}
    # The run exercised what it is meant to: the start allowance on the shared dependency bound.
    capped = {d.binding_cap.cap for d in sim_decisions if d.binding_cap is not None}
    assert "starting:db" in capped
    assert any(d.reason == "StartStaggered" for d in sim_decisions)
