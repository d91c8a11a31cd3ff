"""A policy refuses invalid options up front, naming the option and why."""

from __future__ import annotations

import pytest

from flexiqd.policy import (
    Behavior,
    Dependency,
    DependencyUse,
    KneeConfig,
    PolicyConfigError,
    PoolPolicy,
    RateLimit,
    Targets,
    pool_policy_from_mapping,
)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: PoolPolicy(min_workers=5, max_workers=3), "max_workers: must be >= min_workers (5), got 3"),
        (lambda: PoolPolicy(min_workers=1.5), "min_workers: must be an integer, got 1.5"),
        (lambda: PoolPolicy(max_workers=True), "max_workers: must be an integer, got True"),
        (lambda: PoolPolicy(min_workers=-1), "min_workers: must be >= 0, got -1"),
        (lambda: Targets(utilisation=1.5), "targets.utilisation: must be in (0, 1], got 1.5"),
        (lambda: Targets(utilisation=0), "targets.utilisation: must be in (0, 1], got 0"),
        (lambda: Targets(age=-1), "targets.age: must be in (0, inf), got -1"),
        (lambda: Targets(age=10, lead_time=10), "targets.lead_time: must be below targets.age (10), got 10"),
        (lambda: Behavior(down_window=-5), "behavior.down_window: must be in [0, inf), got -5"),
        (lambda: Behavior(start_cost=-1), "behavior.start_cost: must be in [0, inf), got -1"),
        (lambda: Dependency(name="db", capacity=10, start_burst=0), "dependencies.db.start_burst: must be >= 1, got 0"),
        (lambda: Behavior(tolerance=1.0), "behavior.tolerance: must be in [0, 1), got 1.0"),
        (lambda: Behavior(up_limit=RateLimit(workers=0, percent=0, period=15)),
         "behavior.up_limit: allows no change at all"),
        (lambda: Behavior(down_limit=RateLimit(workers=1, percent=10, period=0)),
         "behavior.down_limit.period: must be in (0, inf), got 0"),
        (lambda: KneeConfig(reprobe_interval=0), "knee.reprobe_interval: must be in (0, inf), got 0"),
        (lambda: PoolPolicy(dependencies=(DependencyUse(dependency="db", per_worker=0),)),
         "dependencies[0].per_worker: must be in (0, inf), got 0"),
        (lambda: PoolPolicy(dependencies=(DependencyUse(dependency="db", per_worker=1),
                                          DependencyUse(dependency="db", per_worker=2))),
         "dependencies[1].dependency: 'db' is declared twice"),
        (lambda: Dependency(name="db", capacity=10, reserved=10),
         "dependencies.db.reserved: must be below the capacity (10), got 10"),
        (lambda: Dependency(name="db", capacity=float("nan")), "dependencies.db.capacity: must be finite"),
    ],
)
def test_invalid_options_name_the_field_and_why(build, message):
    with pytest.raises(PolicyConfigError) as raised:
        build()
    assert str(raised.value).startswith(message)
    assert isinstance(raised.value, ValueError)
    assert raised.value.field == message.split(":")[0]


def test_defaults_are_valid_and_documented_values():
    policy = PoolPolicy()
    assert (policy.min_workers, policy.max_workers, policy.floor) == (1, 10, 1)
    assert (policy.behavior.up_window, policy.behavior.down_window, policy.behavior.tolerance) == (0.0, None, 0.1)
    assert (policy.behavior.start_cost, policy.targets.lead_time) == (1.0, None)
    assert policy.behavior.up_limit == RateLimit(workers=4, percent=100.0, period=15.0)
    assert PoolPolicy(min_workers=0).floor == 1
    assert PoolPolicy(min_workers=0, scale_to_zero=True).floor == 0


def test_a_policy_from_a_config_mapping():
    policy = pool_policy_from_mapping({
        "min_workers": 2,
        "max_workers": 20,
        "targets": {"age": 15, "utilisation": 0.8},
        "behavior": {"down_window": 600, "down_limit": {"workers": 2, "percent": 10, "period": 60}},
        "knee": {"enabled": False},
        "dependencies": [{"dependency": "db", "per_worker": 4, "weight": 2}],
    })
    assert policy.targets.age == 15
    assert policy.behavior.down_limit == RateLimit(workers=2, percent=10, period=60)
    assert policy.behavior.up_limit == RateLimit(workers=4, percent=100.0, period=15.0)
    assert policy.dependencies == (DependencyUse(dependency="db", per_worker=4, weight=2),)
    assert not policy.knee.enabled


@pytest.mark.parametrize(
    "mapping, message",
    [
        ({"behavior": {"donw_window": 60}}, "behavior.donw_window: unknown option"),
        ({"max_wokers": 3}, "max_wokers: unknown option"),
        ({"targets": 3}, "targets: must be a mapping, got 3"),
        ({"dependencies": {"db": 1}}, "dependencies: must be a list"),
        ({"dependencies": [{"per_worker": 1}]}, "dependencies[0]: missing required option 'dependency'"),
        ({"behavior": {"up_limit": {"workers": 1}}}, "behavior.up_limit: missing required option 'percent'"),
        ({"targets": {"utilisation": "high"}}, "targets.utilisation: must be a number, got 'high'"),
    ],
)
def test_a_bad_config_mapping_names_the_dotted_key(mapping, message):
    with pytest.raises(PolicyConfigError, match="^" + message.replace("[", r"\[").replace("]", r"\]")):
        pool_policy_from_mapping(mapping)
