"""``flexiq scaler``: the KEDA endpoint from the store, as a process of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from flexiqd.queue import ClaimRequest, NewJob, Outcome

from .conftest import REPO, wait_for
from .test_http_daemon import free_port


def get(port, path, token=None):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return None, None


def scaler(store, *args):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "flexiqd.cli.flexiq", "--url", store, "scaler", *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=str(REPO))


def test_it_answers_keda_from_the_store_with_running_jobs_counted(tmp_path, store, app):
    now = time.time()
    app.backend.enqueue([NewJob(task="count", queue="mail")] * 4 + [NewJob(task="count", queue="mail", delay=600)],
                        now=now)
    app.backend.claim(ClaimRequest(owner="w", queues=("mail",), limit=3), now=now)
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    port = free_port()
    proc = scaler(store, "--port", str(port), "--target-queue-depth", "5", "--queue", "mail",
                  "--token-file", str(token))
    try:
        wait_for(lambda: get(port, "/health")[0] == 200, 30, "flexiq scaler to listen")
        assert get(port, "/api/scaler")[0] == 401
        status, answer = get(port, "/api/scaler?queue=mail", token="s3cret")
        assert status == 200
        assert (answer["metricValue"], answer["runnable"], answer["running"], answer["delayed"]) == (4, 1, 3, 1)
        assert (answer["targetValue"], answer["queueName"]) == (5, "mail")
        assert get(port, "/api/scaler?queue=other", token="s3cret")[0] == 404  # not served
        assert get(port, "/metrics")[0] == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 0 and "Traceback" not in output


def scrape(port) -> dict[tuple[str, tuple], float]:
    """The exposition at ``port`` as {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_its_metrics_are_the_stores_own_stats_with_the_daemons_names(store, app):
    now = time.time()
    backend = app.backend
    backend.enqueue([NewJob(task="count", queue="mail")] * 6 + [NewJob(task="count", queue="mail", delay=600)]
                    + [NewJob(task="count", queue="bulk")] * 2, now=now)
    port = free_port()
    proc = scaler(store, "--port", str(port))  # every queue in the store
    try:
        wait_for(lambda: get(port, "/health")[0] == 200, 30, "flexiq scaler to listen")
        baseline = scrape(port)  # the counters' start: zero, whatever came before
        assert baseline[("flexiqd_queue_completions_total", (("queue", "mail"),))] == 0
        claimed = backend.claim(ClaimRequest(owner="w", queues=("mail",), limit=3), now=time.time())
        backend.settle("w", [Outcome.ack(job.id) for job in claimed[:2]], now=time.time())
        backend.enqueue([NewJob(task="count", queue="mail")], now=time.time())
        metrics = scrape(port)
        for queue in ("mail", "bulk"):
            stats = backend.stats(queue, now=time.time())
            label = (("queue", queue),)
            assert metrics[("flexiqd_queue_runnable_jobs", label)] == stats.runnable
            assert metrics[("flexiqd_queue_delayed_jobs", label)] == stats.delayed
            assert metrics[("flexiqd_queue_running_jobs", label)] == stats.running
            assert metrics[("flexiqd_queue_dead_jobs", label)] == stats.dead
        mail = (("queue", "mail"),)
        assert (metrics[("flexiqd_queue_runnable_jobs", mail)], metrics[("flexiqd_queue_running_jobs", mail)]) == (4, 1)
        assert metrics[("flexiqd_queue_completions_total", mail)] == 2
        assert metrics[("flexiqd_queue_arrivals_total", mail)] == 1  # since the scaler started
        assert metrics[("flexiqd_job_duration_seconds_count", (("queue", "mail"), ("task", "count")))] == 2
        assert not [name for name, _ in metrics if name.startswith("flexiqd_pool_")]  # the daemon's alone
    finally:
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 0 and "Traceback" not in output


def test_a_public_address_without_a_token_is_refused_in_one_line(store):
    proc = scaler(store, "--host", "0.0.0.0", "--port", str(free_port()))
    output = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 1
    assert output.strip().splitlines() == [
        "flexiq: --host 0.0.0.0 is not loopback: give --token-file too, so other machines must present "
        "a bearer token"]
