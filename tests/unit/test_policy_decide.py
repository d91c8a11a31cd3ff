"""The decision as a whole: pure and deterministic, bounded, and readable in one line."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from flexiqd.policy import Decision, Observation, PoolMetrics, PoolPolicy, decide

from test_policy_support import busy, observe

counts = st.integers(min_value=0, max_value=400)
rates = st.one_of(st.none(), st.floats(min_value=0, max_value=200, allow_nan=False))
metrics = st.one_of(
    st.none(),
    st.builds(
        PoolMetrics,
        runnable_depth=counts,
        running=counts,
        oldest_runnable_age=st.floats(min_value=0, max_value=3600, allow_nan=False),
        arrival_rate=rates,
        completion_rate=rates,
        rate_window=st.just(60.0),
        duration_p50=st.one_of(st.none(), st.floats(min_value=0.01, max_value=600, allow_nan=False)),
        cpu_utilisation=st.one_of(st.none(), st.floats(min_value=0, max_value=1)),
    ),
)
ticks = st.lists(
    st.tuples(st.integers(min_value=0, max_value=60), st.integers(min_value=0, max_value=12), metrics),
    min_size=1, max_size=25,
)
policies = st.builds(
    lambda low, span, cpu, zero: PoolPolicy(min_workers=low, max_workers=low + span, cpu_bound=cpu,
                                           scale_to_zero=zero),
    st.integers(min_value=0, max_value=5), st.integers(min_value=1, max_value=30), st.booleans(), st.booleans(),
)


def replay(policy: PoolPolicy, sequence) -> list[Decision]:
    history, now, decisions = None, 0.0, []
    for step, active, observed in sequence:
        now += step
        decision = decide(Observation(pool="p", active=active, concurrency=4, metrics=observed), policy, history, now)
        history = decision.history
        decisions.append(decision)
    return decisions


@settings(max_examples=60, deadline=None)
@given(policies, ticks)
def test_same_inputs_same_decisions(policy, sequence):
    assert replay(policy, sequence) == replay(policy, sequence)


@settings(max_examples=60, deadline=None)
@given(policies, ticks)
def test_the_result_stays_within_the_bounds(policy, sequence):
    for decision in replay(policy, sequence):
        if decision.reason == "HoldMetricsUnavailable":
            assert decision.desired == min(max(decision.current, policy.floor), policy.max_workers)
        else:
            assert policy.floor <= decision.desired <= policy.max_workers
        assert decision.reason and decision.message


def test_one_log_line_says_everything():
    decision = decide(observe(3, runnable_depth=300, oldest_runnable_age=42.0, **busy(3)),
                      PoolPolicy(max_workers=10), None, 0.0)
    line = decision.line()
    assert line.startswith("default 3 -> 10: CappedByMax: oldest job 42.0s > target 30.0s")
    assert "(age=" in line and "util=" in line
    assert line.endswith("cap max=10)")
    assert str(decision) == line


def test_every_stage_value_is_in_the_decision():
    decision = decide(observe(3, runnable_depth=300, oldest_runnable_age=42.0, **busy(3)),
                      PoolPolicy(max_workers=10), None, 0.0)
    assert decision.raw_desired > decision.capped == 10
    assert decision.stabilized == 10
    assert decision.desired == 10  # a backlog's age is not rate limited: one step up to the cap
    assert decision.winner == "age"
    assert decision.caps == (("max", 10),)
    assert decision.smoothing == ()
