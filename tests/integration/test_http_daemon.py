"""The daemon's HTTP endpoint with the process fleet: /metrics against the queue's own stats,
/api/scaler, the token, and hostile clients that must never stall the control loop."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from flexiqd.queue import NewJob

from .conftest import APPS, REPO, wait_for

TOKEN = "t0ken-for-tests"

CONFIG = """
store: {store}
tick: 200ms
fleet: process
http: {{listen: "127.0.0.1:{port}", token_file: {token}}}
dependencies: {{db: {{capacity: 20}}}}
pools:
  default:
    app: counting_app:queue
    concurrency: 4
    min_workers: 1
    max_workers: 4
    uses: {{db: {{per_worker: 2}}}}
    targets: {{age: 2s, lead_time: 1s}}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Daemon:
    def __init__(self, tmp_path, store, marks, config_text=CONFIG):
        self.port = free_port()
        token = tmp_path / "token"
        token.write_text(TOKEN + "\n")
        token.chmod(0o600)
        config = self.config = tmp_path / "flexiqd.yaml"
        config.write_text(config_text.format(store=store, port=self.port, token=token))
        env = dict(os.environ, FLEXIQ_TEST_MARKS=str(marks), PYTHONPATH=os.pathsep.join([str(APPS), str(REPO)]))
        env.pop("NOTIFY_SOCKET", None)
        self.log = tmp_path / "daemon.log"
        self.proc = subprocess.Popen([sys.executable, "-m", "flexiqd.cli.daemon", "--config", str(config)],
                                     env=env, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT,
                                     cwd=str(tmp_path))
        wait_for(self.serving, 30, "the HTTP endpoint")

    def serving(self):
        try:
            return self.get("/health")[0] == 200
        except OSError:
            return False

    def get(self, path, token=TOKEN, method="GET"):
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def metrics(self):
        status, body = self.get("/metrics")
        assert status == 200
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(body.decode()) for s in family.samples}

    def ticks(self):
        return self.metrics()[("flexiqd_ticks_total", frozenset())]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                assert self.proc.wait(timeout=60) == 0
            finally:
                if self.proc.poll() is None:
                    self.proc.kill()


@pytest.fixture
def daemon(tmp_path, store, workers):
    started = Daemon(tmp_path, store, workers.marks)
    yield started
    started.stop()


def q(**labels):
    return frozenset({"queue": "default", **labels}.items())


def test_metrics_agree_with_the_queues_own_stats_after_a_burst(daemon, app):
    app.tasks["count"].map([(0.1,)] * 120)  # 3 s of work for one worker: a scale-up
    app.backend.enqueue([NewJob(task="no.such.task", max_attempts=1)], now=time.time())
    wait_for(lambda: daemon.metrics()[("flexiqd_queue_completions_total", q())] == 120, 60, "120 completions counted")
    wait_for(lambda: daemon.metrics()[("flexiqd_queue_dead_letters_total", q())] == 1, 30, "the dead letter")
    # A snapshot's counters are read after its tick decided, its gauges at the tick's start:
    # the tick after the last job ended shows it in both.
    def settled():
        found = daemon.metrics()
        return found if found[("flexiqd_queue_running_jobs", q())] == 0 else None

    found = wait_for(settled, 30, "a snapshot whose gauges saw the last job end")
    stats = app.stats()
    assert found[("flexiqd_queue_arrivals_total", q())] == 121
    assert found[("flexiqd_queue_failures_total", q())] == 1
    assert found[("flexiqd_queue_dead_jobs", q())] == stats.dead == 1
    assert found[("flexiqd_queue_runnable_jobs", q())] == stats.runnable == 0
    assert found[("flexiqd_queue_running_jobs", q())] == stats.running == 0
    assert found[("flexiqd_job_duration_seconds_count", q(task="count"))] == 120
    assert found[("flexiqd_job_duration_seconds_bucket", q(task="count", le="0.05"))] == 0
    assert found[("flexiqd_job_duration_seconds_bucket", q(task="count", le="0.25"))] > 0
    assert found[("flexiqd_pool_min_workers", frozenset({"pool": "default"}.items()))] == 1
    workers = sum(found[("flexiqd_pool_workers", frozenset({"pool": "default", "state": s}.items()))]
                  for s in ("active", "starting", "draining"))
    assert found[("flexiqd_dependency_use", frozenset({"dependency": "db"}.items()))] == 2 * workers
    assert found[("flexiqd_build_info", frozenset({"version": __import__("flexiqd").__version__}.items()))] == 1
    assert found[("flexiqd_last_stats_read_timestamp_seconds", frozenset())] > time.time() - 60
    assert any(name == "flexiqd_scale_events_total" and dict(labels)["direction"] == "up"
               for name, labels in found)


def test_the_scaler_answers_for_the_pool_and_its_queue(daemon, app):
    app.backend.enqueue([NewJob(task="count", payload=[0.0], delay=3600)] * 3, now=time.time())
    wait_for(lambda: json.loads(daemon.get("/api/scaler?pool=default")[1])["delayed"] == 3, 30,
             "the delayed jobs in the scaler's answer")
    status, body = daemon.get("/api/scaler?queue=default")
    answer = json.loads(body)
    assert status == 200 and answer["queueName"] == "default" and answer["metricValue"] == 0
    assert answer["targetValue"] == 15
    assert daemon.get("/api/scaler?queue=elsewhere")[0] == 404
    assert daemon.get("/api/scaler?pool=default&queue=default")[0] == 400


def test_the_token_guards_metrics_and_scaler_but_not_health(daemon):
    for path in ("/metrics", "/api/scaler"):
        assert daemon.get(path, token=None)[0] == 401
        assert daemon.get(path, token="wrong")[0] == 401
    assert daemon.get("/health", token=None) == (200, b'{"status": "ok"}\n')
    assert daemon.get("/nope")[0] == 404
    assert daemon.get("/metrics", method="POST")[0] == 405


def raw(port, data, *, read=True, timeout=10.0):
    """Send ``data`` on a fresh connection; the status code of the answer (None if closed first)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
        except OSError:
            pass
        if not read:
            return None
        answer = b""
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except OSError:
            pass
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


def test_hostile_clients_get_4xx_and_never_stall_the_control_loop(daemon):
    port = daemon.port
    before = daemon.ticks()
    rng = random.Random(7)
    # Slow clients first: they hold connections open while everything else goes on.
    slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
    for sock in slow:
        sock.sendall(b"GET /metr")
    # Past the connection limit: turned away at once.
    assert raw(port, b"GET /health HTTP/1.1\r\n\r\n") == 503
    # The slow ones time out with 408 and free their places.
    answers = []
    for sock in slow:
        data = b""
        sock.settimeout(15)
        try:
            while chunk := sock.recv(4096):
                data += chunk
        except OSError:
            pass
        answers.append(data[:12])
        sock.close()
    assert answers == [b"HTTP/1.1 408"] * 32 + [b"HTTP/1.1 503"] * 8
    statuses = [raw(port, bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))) + b"\r\n\r\n")
                for _ in range(60)]
    assert all(status in (400, 404, 405, 413, 414, 431) for status in statuses), statuses
    assert statuses.count(400) > 30
    assert raw(port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n") == 431
    assert raw(port, b"GET /" + b"m" * 10000 + b" HTTP/1.1\r\n\r\n") == 414
    assert raw(port, b"DELETE /metrics HTTP/1.1\r\n\r\n") == 405
    assert raw(port, b"GET /metrics HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n") == 413
    assert raw(port, b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer " + b"x" * 100 + b"\r\n\r\n") == 401
    assert raw(port, b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer \xff\xfe\r\n\r\n") == 401
    raw(port, b"GET /metrics HTTP/1.1\r\n", read=False)  # gone without waiting
    # The loop kept ticking all along (5 per second), and answers as before.
    assert daemon.ticks() > before + 10
    assert daemon.get("/health")[0] == 200
    assert daemon.proc.poll() is None
    assert "Traceback" not in daemon.log.read_text()


@pytest.fixture
def quick_to_give_up(tmp_path, store, workers):
    """The daemon on a store whose busy timeout is 1 s, not the default 5 s: a tick against a
    locked store waits that out for each statement it tries (the default held it about 40 s)."""
    started = Daemon(tmp_path, f"{store}?busy_timeout=1", workers.marks)
    yield started
    started.stop()


def test_scrapes_are_answered_while_the_tick_is_blocked_on_a_locked_store(quick_to_give_up, store, app):
    import sqlite3

    from flexiqd.queue.url import sqlite_path

    daemon = quick_to_give_up
    wait_for(lambda: daemon.ticks() > 3, 30, "a few ticks")
    # A job coming due makes the tick's stats read a write (its promotion), which the lock blocks.
    app.backend.enqueue([NewJob(task="count", payload=[0.0], delay=0.5)], now=time.time())
    lock = sqlite3.connect(sqlite_path(store), isolation_level=None, timeout=30)
    lock.execute("BEGIN IMMEDIATE")
    try:
        # Scrape until the blocked tick gives up (the store's busy timeout) and says so.
        seen, deadline = [], time.monotonic() + 60
        while time.monotonic() < deadline:
            found = daemon.metrics()
            # 503 once a read failed: no information, so KEDA holds the count rather than act on zeros.
            assert daemon.get("/api/scaler")[0] in (200, 503)
            seen.append(found[("flexiqd_ticks_total", frozenset())])
            if found[("flexiqd_stats_read_failures_total", frozenset())] >= 1:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the blocked tick was never counted as a failed stats read")
        # Many answers in a row while the tick count stood still: the tick was blocked, not the endpoint.
        longest = max(sum(1 for _ in group) for _, group in itertools.groupby(seen))
        assert longest >= 5, seen
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    before = daemon.ticks()
    wait_for(lambda: daemon.ticks() > before + 3, 30, "ticks after the store is free again")


def test_reloads_count_generations_and_a_rejected_one_says_so(daemon):
    generation = lambda: daemon.metrics()[("flexiqd_config_generation", frozenset())]
    reload_ok = lambda: daemon.metrics()[("flexiqd_config_last_reload_successful", frozenset())]
    assert (generation(), reload_ok()) == (1, 1)
    good = daemon.config.read_text()
    daemon.config.write_text(good.replace("max_workers: 4", "max_workers: 5"))
    daemon.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: generation() == 2, 30, "the applied reload")
    assert daemon.metrics()[("flexiqd_pool_max_workers", frozenset({"pool": "default"}.items()))] == 5
    daemon.config.write_text(good.replace("max_workers: 4", "max_wrkers: 5"))
    daemon.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: reload_ok() == 0, 30, "the rejected reload")
    assert generation() == 2
