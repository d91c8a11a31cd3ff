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

from flexiqd.queue import ClaimRequest, NewJob

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
        assert get(port, "/metrics", token="s3cret") == (404, {"error": "not found"})
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
