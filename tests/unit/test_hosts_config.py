"""The config keys of a fleet: heartbeat, dependencies.<d>.global, max_workers: {count, global}."""

from __future__ import annotations

import pytest

from flexiqd.config import parse_config
from flexiqd.worker.settings_reader import worker_setup
from flexiqd.errors import ConfigError


def test_defaults_keep_everything_per_host():
    config = parse_config("dependencies: {db: {capacity: 4}}\npools: {default: {}}")
    assert (config.heartbeat, config.global_dependencies, dict(config.global_max_workers)) == (2.0, frozenset(), {})


def test_global_dependencies_and_max_workers_are_read():
    config = parse_config("""
heartbeat: 500ms
dependencies: {db: {capacity: 10, global: true}, api: {capacity: 3, global: false}}
pools:
  default: {uses: {db: {per_worker: 1}}, max_workers: {count: 7, global: true}}
  mail: {max_workers: {count: 3}}
""")
    assert config.heartbeat == 0.5
    assert config.global_dependencies == frozenset({"db"})
    assert dict(config.global_max_workers) == {"default": 7}
    assert (config.pools["default"].policy.max_workers, config.pools["mail"].policy.max_workers) == (7, 3)


@pytest.mark.parametrize("text, message", [
    ("heartbeat: 0s", "heartbeat: must be between 0.2s and 60s, got 0s"),
    ("heartbeat: 2m", "heartbeat: must be between 0.2s and 60s, got 120s"),
    ("heartbeat: often", "heartbeat: 'often' is not a duration"),
    ("dependencies: {db: {capacity: 1, global: 1}}", "dependencies.db.global: must be true or false, got 1"),
    ("pools: {default: {max_workers: {count: 3, globl: true}}}",
     "pools.default.max_workers.globl: unknown key; did you mean 'global'?"),
    ("pools: {default: {max_workers: {global: true}}}", "pools.default.max_workers.count: is required"),
    ("pools: {default: {max_workers: {count: two}}}", "pools.default.max_workers.count: must be a whole number"),
])
def test_bad_values_are_refused_with_the_key_that_is_wrong(text, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("?", r"\?")):
        parse_config(text)


def test_a_worker_of_a_pool_takes_the_heartbeat_from_the_file(tmp_path):
    path = tmp_path / "flexiqd.yaml"
    path.write_text("heartbeat: 3s\npools: {default: {app: 'flexiqd.demo:queue'}}\n")
    setup = worker_setup(app=None, url=None, instance="default-1", config=str(path), overrides={})
    assert setup.config.heartbeat == 3.0
