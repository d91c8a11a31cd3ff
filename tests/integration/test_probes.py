"""The probes' threads against real endpoints: a TCP listener, an HTTP server, PostgreSQL; and failures."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from flexiqd.config.model import ProbeConfig
from flexiqd.daemon.probes import Probe, ProbeFailed, ProbeSet, _PostgresRequest

from .conftest import wait_for


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once it is closed


@pytest.fixture
def http_server():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the standard library's name)
            if self.path == "/slow":
                time.sleep(0.5)
            code = 503 if self.path == "/down" else 200
            self.send_response(code)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _results(probe: Probe, count: int = 2, timeout: float = 20.0):
    """The probe's results once it has ended ``count`` rounds."""
    probe.start()
    try:
        return wait_for(lambda: (r := probe.latest()) is not None and r.seq >= count and r, timeout,
                        f"{count} rounds of the probe of {probe.config.dependency}")
    finally:
        probe.stop()


def test_a_tcp_probe_times_a_connect_and_an_unreachable_port_gives_no_reading():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]
        good = _results(Probe(ProbeConfig(dependency="db", kind="tcp", target=f"127.0.0.1:{port}"), 0.1))
    assert good.error is None and 0 < good.latency < 1.0
    bad = _results(Probe(ProbeConfig(dependency="db", kind="tcp", target=f"127.0.0.1:{_closed_port()}"), 0.1))
    assert bad.latency is None and "cannot connect" in bad.error


def test_an_http_probe_times_a_get_and_an_error_or_a_late_answer_is_no_reading(http_server):
    good = _results(Probe(ProbeConfig(dependency="api", kind="http", target=f"{http_server}/health"), 0.1))
    assert good.error is None and 0 < good.latency < 1.0
    down = _results(Probe(ProbeConfig(dependency="api", kind="http", target=f"{http_server}/down"), 0.1))
    assert down.latency is None and "503" in down.error
    late = _results(Probe(ProbeConfig(dependency="api", kind="http", target=f"{http_server}/slow", timeout=0.2),
                          0.1), count=1)
    assert late.latency is None and late.error


def test_a_postgresql_probe_runs_its_statement_and_hides_the_password(pg_server, tmp_path):
    pg_server.admin("DO $$ BEGIN CREATE ROLE probe LOGIN PASSWORD 's3cret-pw'; "
                    "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    secret = tmp_path / "password"
    secret.write_text("s3cret-pw\n")
    url = pg_server.url(user="probe", password_file=str(secret))
    good = _results(Probe(ProbeConfig(dependency="db", kind="postgresql", target=url,
                                      statement="SELECT pg_sleep(0.02)"), 0.1), count=3)
    assert good.error is None and 0.02 <= good.latency < 1.0
    # A statement longer than the timeout is cancelled: no reading, and the next round comes.
    slow = _PostgresRequest(ProbeConfig(dependency="db", kind="postgresql", target=url,
                                        statement="SELECT pg_sleep(30)", timeout=0.5))
    with pytest.raises(ProbeFailed, match="connected"):
        slow()
    began = time.monotonic()
    with pytest.raises(ProbeFailed, match="the statement failed: canceling statement"):
        slow()
    assert time.monotonic() - began < 10
    slow.close()
    wrong = url.replace("probe@", "probe:wrong-pw@").split("?")[0]
    config = ProbeConfig(dependency="db", kind="postgresql", target=wrong)
    bad = _results(Probe(config, 0.1))
    assert bad.latency is None and "wrong-pw" not in bad.error and "wrong-pw" not in config.shown


def test_the_loop_takes_each_round_once_and_never_waits_for_a_probe():
    calls = []

    def request():
        calls.append(time.monotonic())
        time.sleep(0.3)   # a slow round: the loop must not wait for it
        return 0.3

    probes = ProbeSet({}, 0.05)
    probe = Probe(ProbeConfig(dependency="db", kind="tcp", target="h:1", timeout=1.0), 0.05, request=request)
    probes._probes["db"] = probe
    probe.start()
    try:
        began = time.monotonic()
        first = probes.take()
        assert time.monotonic() - began < 0.1 and first == {"db": None}
        wait_for(lambda: probe.latest() is not None, 5, "the first round")
        taken = probes.take()["db"]
        assert taken is not None and taken.latency == 0.3
        assert probes.take()["db"] is None or probes.latest()["db"].seq > taken.seq  # never the same round twice
    finally:
        probes.stop()


def test_a_reload_keeps_unchanged_probes_and_replaces_changed_ones():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]
        first = {"db": ProbeConfig(dependency="db", kind="tcp", target=f"127.0.0.1:{port}"),
                 "api": ProbeConfig(dependency="api", kind="tcp", target=f"127.0.0.1:{port}")}
        probes = ProbeSet(first, 0.1)
        try:
            kept = probes._probes["db"]
            changed = dict(first, api=ProbeConfig(dependency="api", kind="tcp", target=f"127.0.0.1:{_closed_port()}"))
            probes.reconfigure(changed, 0.1)
            assert probes._probes["db"] is kept
            wait_for(lambda: (r := probes.latest()["api"]) is not None and r.error, 10, "the new api probe's round")
            probes.reconfigure({"db": first["db"]}, 0.1)
            assert set(probes.latest()) == {"db"}
        finally:
            probes.stop()
