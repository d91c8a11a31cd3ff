"""/metrics and /api/scaler of flexiqd running as its unit under the real systemd, scraped from
inside the container during a burst and compared with the store's own stats."""

from __future__ import annotations

import json
import socket

from prometheus_client.parser import text_string_to_metric_families

from .flexiqd_install import BIN, CONFIG, DAEMON, done_count, enqueue, install, stats, workers
from .sandbox import Sandbox

TOKEN_FILE = "/etc/flexiqd/http-token"
TOKEN = "sandbox-token"

# Fetch a path from inside the container, print "<status> <body>"; the token is read from the file.
FETCH = """
import sys, urllib.error, urllib.request
port, path, token = sys.argv[1], sys.argv[2], open(sys.argv[3]).read().strip() if len(sys.argv) > 3 else ""
request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
if token:
    request.add_header("Authorization", f"Bearer {token}")
try:
    with urllib.request.urlopen(request, timeout=10) as response:
        print(response.status, response.read().decode())
except urllib.error.HTTPError as exc:
    print(exc.code, exc.read().decode())
"""


def free_port() -> int:
    # The container shares the host's network: a port free here is free there.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fetch(sbx: Sandbox, port: int, path: str, token: bool = True) -> tuple[int, str]:
    args = [str(BIN / "python"), "-c", FETCH, str(port), path] + ([TOKEN_FILE] if token else [])
    status, _, body = sbx.run(args).stdout.partition(" ")
    return int(status), body


def scrape(sbx: Sandbox, port: int) -> dict:
    status, body = fetch(sbx, port, "/metrics")
    assert status == 200, body
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def q(**labels):
    return frozenset({"queue": "default", **labels}.items())


def test_metrics_during_a_burst_match_the_stores_stats(sandbox: Sandbox):
    port = free_port()
    sandbox.write_file(TOKEN_FILE, TOKEN + "\n", mode=0o600)
    config = CONFIG + f"http: {{listen: '127.0.0.1:{port}', token_file: {TOKEN_FILE}}}\n"
    install(sandbox, config)
    try:
        sandbox.wait_for(lambda: len(workers(sandbox)) == 1, 30, what="the minimum worker unit")
        sandbox.wait_for(lambda: fetch(sandbox, port, "/health", token=False)[0] == 200, 30,
                         what="the HTTP endpoint")
        assert fetch(sandbox, port, "/metrics", token=False)[0] == 401
        enqueue(sandbox, 0.5, 40)
        # During the burst: a scrape sees the work in flight and a scale-up.
        busy = sandbox.wait_for(
            lambda: (lambda m: m if m[("flexiqd_queue_running_jobs", q())] > 0 and
                     m[("flexiqd_pool_desired_workers", frozenset({"pool": "default"}.items()))] > 1 else None)(
                scrape(sandbox, port)), 30, what="a scrape with running jobs and a scale-up")
        assert busy[("flexiqd_queue_arrivals_total", q())] == 40
        status, body = fetch(sandbox, port, "/api/scaler?pool=default")
        answer = json.loads(body)
        assert status == 200 and answer["metricValue"] == answer["runnable"] + answer["running"]
        sandbox.wait_for(lambda: done_count(sandbox) == 40, 60, interval=0.5, what="all 40 jobs to finish")
        found = sandbox.wait_for(
            lambda: (lambda m: m if m[("flexiqd_queue_completions_total", q())] == 40 else None)(
                scrape(sandbox, port)), 30, what="the 40 completions counted")
        store = stats(sandbox)
        for metric, key in [("flexiqd_queue_runnable_jobs", "runnable"), ("flexiqd_queue_running_jobs", "running"),
                            ("flexiqd_queue_delayed_jobs", "delayed"), ("flexiqd_queue_dead_jobs", "dead")]:
            assert found[(metric, q())] == store[key], metric
        assert found[("flexiqd_job_duration_seconds_count", q(task="count"))] == 40
        assert found[("flexiqd_job_duration_seconds_bucket", q(task="count", le="0.25"))] == 0
        assert found[("flexiqd_job_duration_seconds_bucket", q(task="count", le="1.0"))] == 40
        assert found[("flexiqd_queue_failures_total", q())] == 0
        assert any(name == "flexiqd_scale_events_total" for name, _ in found)
    finally:
        sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*'; rm -f {TOKEN_FILE}; true", timeout=120)
