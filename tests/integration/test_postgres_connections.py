"""The PostgreSQL connections a fleet holds, counted by the server: what docs/postgresql.md
("Connections") tells an operator to size ``max_connections`` for.

A daemon with the process fleet and three workers, its store URL naming an
``application_name`` of its own so that ``pg_stat_activity`` tells its connections from
everyone else's: two a process (one for the calls, one that LISTENs), one with ``listen=off``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from .conftest import APPS, REPO, wait_for

WORKERS = 3

CONFIG = """
store: {store}
tick: 200ms
fleet: process
pools:
  default:
    app: counting_app:queue
    concurrency: 2
    min_workers: {workers}
    max_workers: {workers}
"""


def connections(pg_server, name: str) -> int:
    return pg_server.admin(f"SELECT count(*) FROM pg_stat_activity WHERE application_name = '{name}'")[0][0]


@pytest.mark.parametrize("listen, per_process", [("on", 2), ("off", 1)])
def test_each_process_holds_the_connections_the_docs_count(pg_server, tmp_path, listen, per_process):
    name = f"flexiq-count-{listen}-{os.getpid()}"
    store = pg_server.fresh_url(application_name=name, listen=listen)
    config = tmp_path / "flexiqd.yaml"
    config.write_text(CONFIG.format(store=store, workers=WORKERS))
    env = dict(os.environ, FLEXIQ_TEST_MARKS=str(tmp_path), PYTHONPATH=os.pathsep.join([str(APPS), str(REPO)]))
    env.pop("NOTIFY_SOCKET", None)
    with open(tmp_path / "daemon.log", "wb") as log:
        daemon = subprocess.Popen([sys.executable, "-m", "flexiqd.cli.daemon", "--config", str(config)],
                                  env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path))
    expected = per_process * (WORKERS + 1)  # the workers and the daemon
    try:
        wait_for(lambda: connections(pg_server, name) >= expected, 60,
                 f"{expected} connections of the daemon and its {WORKERS} workers")
        seen = set()
        deadline = time.monotonic() + 3.0  # long enough for a heartbeat, a schedule check and ticks
        while time.monotonic() < deadline:
            seen.add(connections(pg_server, name))
            time.sleep(0.1)
        assert seen == {expected}, (f"connections seen over 3 s: {sorted(seen)}, expected {expected}\n"
                                    + (tmp_path / "daemon.log").read_text()[-3000:])
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0
        wait_for(lambda: connections(pg_server, name) == 0, 10, "every connection closed")
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
