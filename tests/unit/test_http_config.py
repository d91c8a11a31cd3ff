"""The ``http:`` section of flexiqd.yaml, and the snapshot the daemon publishes from its views."""

from __future__ import annotations

import pytest

from flexiqd.config import parse_config
from flexiqd.config.model import DEFAULT_HTTP_PORT, HttpConfig
from flexiqd.daemon.controller import PoolView
from flexiqd.daemon.service import restart_needed
from flexiqd.errors import ConfigError
from flexiqd.http.daemon import read_token
from flexiqd.daemon.documents import status_document
from flexiqd.http.snapshot import DaemonFigures, build_snapshot

from test_http_metrics import stats


def http_of(text):
    return parse_config(text, "f.yaml").http


def test_no_http_section_serves_nothing():
    assert http_of("pools: {default: {}}") is None


def test_defaults_are_loopback_on_the_fixed_port():
    assert http_of("http: {}") == HttpConfig("127.0.0.1", DEFAULT_HTTP_PORT, None, False, 15)
    assert DEFAULT_HTTP_PORT != 9090 and not 9100 <= DEFAULT_HTTP_PORT <= 9999


@pytest.mark.parametrize("listen, host, port", [
    ("127.0.0.1:9000", "127.0.0.1", 9000), ("[::1]:9001", "::1", 9001), ("localhost:80", "localhost", 80),
    (9002, "127.0.0.1", 9002)])
def test_listen_forms(listen, host, port):
    http = http_of(f"http: {{listen: {listen!r}}}" if isinstance(listen, str) else f"http: {{listen: {listen}}}")
    assert (http.host, http.port) == (host, port)


def test_a_remote_bind_needs_allow_remote_and_a_token():
    http = http_of("http: {listen: '0.0.0.0:8739', allow_remote: true, token_file: /etc/flexiqd/token}")
    assert (http.host, http.token_file, http.allow_remote) == ("0.0.0.0", "/etc/flexiqd/token", True)


@pytest.mark.parametrize("section, message", [
    ("{listen: '0.0.0.0:8739'}", "f.yaml: http.listen: 0.0.0.0 is not a loopback address"),
    ("{listen: '[::]:8739', allow_remote: true}", "f.yaml: http.token_file: is required to listen on ::"),
    ("{listen: 'example.com:80'}", "f.yaml: http.listen: the host must be an IP address or localhost"),
    ("{listen: '127.0.0.1'}", "f.yaml: http.listen: must be host:port"),
    ("{listen: '127.0.0.1:0'}", "f.yaml: http.listen: the port must be between 1 and 65535"),
    ("{listen: [1]}", "f.yaml: http.listen: must be host:port"),
    ("{token_file: token}", "f.yaml: http.token_file: must be an absolute file path"),
    ("{allow_remote: 'yes'}", "f.yaml: http.allow_remote: must be true or false"),
    ("{scaler_target: 0}", "f.yaml: http.scaler_target: must be at least 1"),
    ("{listne: 1}", "f.yaml: http.listne: unknown key; did you mean 'listen'?"),
    ("[1]", "f.yaml: http: must be a mapping"),
])
def test_bad_sections_are_named(section, message):
    with pytest.raises(ConfigError) as caught:
        parse_config(f"http: {section}", "f.yaml")
    assert str(caught.value).startswith(message), str(caught.value)


def test_changing_http_takes_a_restart():
    old, new = parse_config("http: {}"), parse_config("http: {listen: '127.0.0.1:9999'}")
    assert "'http' changed" in restart_needed(old, new)
    assert restart_needed(old, parse_config("http: {}")) is None


def test_the_token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text("  s3cret\n")
    path.chmod(0o600)
    assert read_token(str(path)) == b"s3cret"
    path.write_text("\n")
    with pytest.raises(ConfigError, match="http.token_file: .* is empty"):
        read_token(str(path))
    with pytest.raises(ConfigError, match="http.token_file: cannot read"):
        read_token(str(tmp_path / "missing"))
    assert read_token(None) is None


def test_the_snapshot_counts_dependency_use_and_keeps_each_queues_stats():
    config = parse_config("""
dependencies: {db: {capacity: 40, reserved: 10}, api: {capacity: 5}}
pools:
  web: {queues: [a, b], uses: {db: {per_worker: 4}}}
  batch: {queues: [c], uses: {db: {per_worker: 1}}}
""")
    views = {"web": PoolView("web", active=3, starting=1, draining=1, failed=2, max_workers=10, decision=None,
                             stats=[stats("a", runnable=4), stats("b")]),
             "batch": PoolView("batch", active=2, starting=0, draining=0, failed=0, max_workers=10,
                               decision=None, stats=None)}
    status = status_document(config, "/etc/flexiqd/flexiqd.yaml", None, views, {}, 5.0)
    queue_stats = {s.queue: s for view in views.values() for s in view.stats or ()}
    snapshot = build_snapshot(status, queue_stats, counters={}, scale_events={}, daemon=DaemonFigures(version="1"),
                              now=5.0)
    uses = {d.name: (d.capacity, d.reserved, d.use) for d in snapshot.dependencies}
    assert uses == {"db": (40.0, 10.0, 5 * 4 + 2 * 1.0), "api": (5.0, 0.0, 0.0)}
    assert sorted(snapshot.queue_stats) == ["a", "b"] and snapshot.queue_stats["a"].runnable == 4
    assert snapshot.pool_queues("web") == ("a", "b") and snapshot.pool_queues("nope") is None
    assert snapshot.served_queues() == ["a", "b", "c"]
    assert snapshot.status["pools"]["web"]["workers"]["failed"] == 2
    assert snapshot.target_ages == {"web": 30.0, "batch": 30.0} and snapshot.binding_caps == {}
