"""dependencies.<name>.probe and pools.<pool>.pressure in the config file: what they become, and bad input."""

from __future__ import annotations

import pytest

from flexiqd.config.load import parse_config
from flexiqd.errors import ConfigError
from flexiqd.policy.config import EvidenceRule

USES = "pools: {default: {uses: {db: {per_worker: 1}}}}\n"


def config(probe: str, pools: str = USES, fleet: str = "systemd"):
    return parse_config(f"fleet: {fleet}\ndependencies: {{db: {{capacity: 10, probe: {probe}}}}}\n{pools}")


def test_a_probe_is_heeded_by_the_pools_that_use_its_dependency():
    loaded = config("{postgresql: 'postgresql://probe:s3cret@db.example/orders', statement: 'SELECT 2', "
                    "timeout: 500ms, factor: 2.5}",
                    pools="pools: {default: {uses: {db: {per_worker: 1}}}, other: {}}\n")
    probe = loaded.probes["db"]
    assert (probe.kind, probe.statement, probe.timeout, probe.factor) == ("postgresql", "SELECT 2", 0.5, 2.5)
    assert "s3cret" not in probe.shown and "probe:***@db.example" in probe.shown
    assert loaded.pools["default"].policy.evidence == (EvidenceRule(source="probe:db", threshold=2.5),)
    assert loaded.pools["other"].policy.evidence == ()


def test_tcp_and_http_probes_take_the_defaults():
    tcp = config("{tcp: 'db.example:5432'}").probes["db"]
    assert (tcp.kind, tcp.target, tcp.timeout, tcp.factor) == ("tcp", "db.example:5432", 1.0, 5.0)
    assert config("{http: 'http://api.example/health'}").probes["db"].kind == "http"


@pytest.mark.parametrize("probe, where, words", [
    ("{}", "dependencies.db.probe", "needs exactly one of postgresql, tcp, http"),
    ("{tcp: 'a:1', http: 'http://a/'}", "dependencies.db.probe", "got tcp and http"),
    ("{tcp: 'db.example'}", "dependencies.db.probe.tcp", "must be host:port"),
    ("{tcp: 'db:70000'}", "dependencies.db.probe.tcp", "must be host:port"),
    ("{http: 'ftp://a/x'}", "dependencies.db.probe.http", "http:// or https://"),
    ("{postgresql: 'mysql://u:pw@a/b'}", "dependencies.db.probe.postgresql", "postgresql:// URL"),
    ("{tcp: 'a:1', statement: 'SELECT 1'}", "dependencies.db.probe.statement", "is for a postgresql probe"),
    ("{tcp: 'a:1', factor: 1}", "dependencies.db.probe.factor", "above 1"),
    ("{tcp: 'a:1', timeout: 0s}", "dependencies.db.probe.timeout", "more than 0s"),
    ("{tcp: 'a:1', tiemout: 1s}", "dependencies.db.probe.tiemout", "did you mean 'timeout'"),
])
def test_a_bad_probe_is_refused_naming_its_key(probe, where, words):
    with pytest.raises(ConfigError) as caught:
        config(probe)
    message = str(caught.value)
    assert message.startswith(f"<config>: {where}: ") and words in message, message


def test_a_password_in_a_bad_probe_url_is_not_shown():
    with pytest.raises(ConfigError) as caught:
        config("{postgresql: 'mysql://u:s3cret@a/b'}")
    assert "s3cret" not in str(caught.value)


def test_pressure_thresholds_become_rules_and_need_systemd():
    pools = "pools: {default: {pressure: {cpu: 60, memory: 20.5}}}\n"
    loaded = parse_config(pools)
    assert loaded.pools["default"].policy.evidence == (EvidenceRule(source="pressure:cpu", threshold=60.0),
                                                       EvidenceRule(source="pressure:memory", threshold=20.5))
    with pytest.raises(ConfigError, match=r"^<config>: pools\.default\.pressure: needs fleet: systemd"):
        parse_config("fleet: process\n" + pools)
    with pytest.raises(ConfigError, match=r"^<config>: pools\.default\.pressure\.io: must be a percentage"):
        parse_config("pools: {default: {pressure: {io: 0}}}\n")
    with pytest.raises(ConfigError, match=r"^<config>: pools\.default\.pressure\.disk: unknown key"):
        parse_config("pools: {default: {pressure: {disk: 10}}}\n")
