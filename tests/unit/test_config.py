"""The config file: every error names the dotted key and why; the file is accepted whole or not at all."""

from __future__ import annotations

import pathlib

import pytest

from flexiqd.config import load_config, parse_config
from flexiqd.errors import ConfigError

REPO = pathlib.Path(__file__).resolve().parents[2]


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "flexiqd.yaml")
    return str(caught.value)


def test_an_empty_file_runs_the_demo_pool_with_defaults():
    config = parse_config("", "flexiqd.yaml")
    pool = config.pools["default"]
    assert pool.app == "flexiqd.demo:queue" and pool.queues == ("default",)
    assert config.store == "sqlite:////var/lib/flexiq/queue.db" and config.fleet == "systemd"
    assert pool.policy.min_workers == 1 and pool.policy.max_workers == 10


def test_the_shipped_example_is_valid_and_matches_the_defaults():
    shipped = load_config(str(REPO / "units" / "flexiqd.yaml"))
    default = parse_config("", "x")
    assert shipped.pools["default"].policy == default.pools["default"].policy
    assert shipped.pools["default"].drain_timeout == default.pools["default"].drain_timeout
    assert shipped.tick == default.tick and shipped.store == default.store


def test_durations_are_read_in_every_form():
    config = parse_config("tick: 500ms\npools:\n  p:\n    drain_timeout: 2m\n"
                          "    targets: {age: 1m30s}\n    behavior: {down_window: 10m}\n")
    pool = config.pools["p"]
    assert config.tick == 0.5 and pool.drain_timeout == 120
    assert pool.policy.targets.age == 90 and pool.policy.behavior.down_window == 600


@pytest.mark.parametrize("text, expected", [
    ("pools:\n  default:\n    max_wrkers: 3\n", "pools.default.max_wrkers: unknown key; did you mean 'max_workers'?"),
    ("pols: {}\n", "pols: unknown key; did you mean 'pools'?"),
    ("pools:\n  default:\n    max_workers: 2\n    min_workers: 3\n", "pools.default.max_workers"),
    ("pools:\n  default:\n    concurrency: two\n", "pools.default.concurrency: must be a whole number"),
    ("pools:\n  default:\n    drain_timeout: soon\n", "pools.default.drain_timeout: 'soon' is not a duration"),
    ("pools:\n  default:\n    targets: {utilisation: 2}\n", "pools.default.targets.utilisation"),
    ("pools:\n  Bad-Name: {}\n", "pools.Bad-Name: a pool name may hold only a-z, 0-9 and _"),
    ("pools:\n  default:\n    app: nocolon\n", "pools.default.app: must be module:attribute"),
    ("pools:\n  default:\n    uses: {db: {per_worker: 2}}\n", "pools.default.uses.db: no such dependency"),
    ("dependencies:\n  db: {capacity: 10}\npools:\n  default:\n    uses: {db: {per_worker: -2}}\n",
     "pools.default.uses.db.per_worker"),
    ("dependencies:\n  db: {}\n", "dependencies.db.capacity: is required"),
    ("dependencies:\n  db: {capacity: 10}\npools:\n  default:\n    uses: {db: {max_latency: 50ms}}\n",
     "pools.default.uses.db.max_latency: needs dependencies.db.limit: the latency is measured"),
    ("pools:\n  default:\n    resources: {memory_max: lots}\n", "pools.default.resources.memory_max"),
    ("pools:\n  default:\n    resources: {cpu_weight: 0}\n", "pools.default.resources.cpu_weight: must be between 1 and 10000"),
    ("pools:\n  default:\n    policy: magic\n", "pools.default.policy: must be 'flexiqd' or 'flexiq'"),
    ("pools:\n  default:\n    flexiq: {target_utilisation: 1.5}\n", "pools.default.flexiq"),
    ("fleet: docker\n", "fleet: must be 'systemd' or 'process'"),
    ("pools: [\n", "line 2 column 1: not valid YAML"),
    ("- just\n- a list\n", "the file: must be a mapping"),
    ("store: mysql://db/q\n", "store: mysql://db/q: unknown store scheme 'mysql'"),
    ("store: postgresql://db/q?listen=maybe\n", "store: postgresql://db/q?listen=maybe: listen must be on or off"),
    ("store: sqlite:////q.db?journal=wal\n", "store: sqlite:////q.db?journal=wal: unknown option 'journal'"),
    ("pools:\n  default:\n    environment: {A: \"x\\0y\"}\n",
     "pools.default.environment.A: must not contain a NUL character"),
    ("pools:\n  default:\n    credentials: {db: relative/path}\n",
     "pools.default.credentials.db: must be an absolute file path"),
    ("pools:\n  default:\n    credentials: {\"a/b\": /etc/secret}\n",
     "pools.default.credentials.a/b: a credential name may hold only"),
    ("pools:\n  default:\n    credentials: {db: \"/etc/x\\nExecStartPre=/bin/true\"}\n",
     "pools.default.credentials.db: must not contain control characters"),
    ("pools:\n  default:\n    credentials: {db: {encrypted: x}}\n",
     "pools.default.credentials.db.encrypted: must be an absolute file path"),
    ("pools:\n  default:\n    credentials: {db: {encryptd: /x}}\n",
     "pools.default.credentials.db.encryptd: unknown key; did you mean 'encrypted'?"),
    ("fleet: process\npools:\n  default:\n    credentials: {db: /etc/secret}\n",
     "pools.default.credentials: needs fleet: systemd"),
])
def test_errors_name_the_key_and_why(text, expected):
    message = error_of(text)
    assert message.startswith("flexiqd.yaml:")
    assert expected in message


def test_resources_and_environment_are_parsed():
    config = parse_config("pools:\n  default:\n    resources: {memory_max: 512M, cpu_weight: 200}\n"
                          "    environment: {MODE: fast, LEVEL: 3}\n")
    pool = config.pools["default"]
    assert pool.memory_max == 512 * 1024 ** 2 and pool.cpu_weight == 200
    assert pool.environment == {"MODE": "fast", "LEVEL": "3"}


def test_a_missing_file_is_one_clear_line(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(str(tmp_path / "absent.yaml"))


def test_credentials_are_files_or_encrypted_files():
    config = parse_config("pools:\n  default:\n    credentials:\n      db_password: /etc/flexiqd/db.secret\n"
                          "      api.key: {encrypted: /etc/flexiqd/api.cred}\n")
    credentials = config.pools["default"].worker_spec(config.store).credentials
    assert [(c.name, c.path, c.encrypted) for c in credentials] == [
        ("db_password", "/etc/flexiqd/db.secret", False), ("api.key", "/etc/flexiqd/api.cred", True)]


def test_the_fleet_given_on_the_command_line_decides_what_is_valid():
    text = "fleet: process\npools:\n  default:\n    credentials: {db: /etc/secret}\n"
    assert parse_config(text, "x", fleet="systemd").fleet == "systemd"
