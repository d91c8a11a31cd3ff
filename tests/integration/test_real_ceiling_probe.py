"""A dependency's probe on a real ceiling: flexiqd (the daemon, process fleet) stops where the probe rises.

The dependency is pgbouncer with 4 server connections in front of the session's
PostgreSQL server (bench/ceilings/deps.py); each job holds one for 50 ms, so 4 slots ->
2 workers of concurrency 2 keep it full: the knee is 2 by construction (the sweep of
test_real_ceiling.py measures it so).  The daemon is told a capacity far above it and a
probe: the request path's own statement through the same pgbouncer.  Its throughput
knee is turned off, so that what holds the pool is the probe alone (without it the pool
goes to max_workers, 16: the second test shows it).  Counts are checked, never times.
"""

from __future__ import annotations

import pathlib
import socket
import sys

import pytest

from pg_server import in_ci

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

from ceilings import Prober, Settings, ceiling, flash_crowd, probe_of, unavailable_reason  # noqa: E402

CAPACITY = 4
SETTINGS = Settings(concurrency=2, min_workers=1, max_workers=16, target_age=10.0, poll_interval=1.0)
JOBS = 1600           # about 20 s of work at the ceiling


@pytest.fixture
def connection_pool(pg_server):
    reason = unavailable_reason("connections")
    if reason is not None:
        if in_ci():
            pytest.fail(f"the ceiling test must run in CI, but {reason}", pytrace=False)
        pytest.skip(reason)
    with ceiling("connections", CAPACITY, server=pg_server) as dependency:
        yield dependency


def _all_ran_once(crowd: dict, jobs: int) -> None:
    assert not crowd.get("timed_out"), crowd
    assert (crowd["done"], crowd["dead"], crowd["lost"]) == (jobs, 0, 0), crowd
    assert crowd["duplicates"] == 0 and crowd["executions"] == jobs, crowd


@pytest.mark.slow
def test_the_probe_holds_the_daemon_near_the_knee_of_a_connection_pool(connection_pool, pg_server, tmp_path):
    dependency = connection_pool
    knee = dependency.expected_knee(SETTINGS.concurrency)
    assert knee == 2
    with Prober(dependency, rate=10) as prober:
        crowd = flash_crowd("daemon", dependency, pg_server, tmp_path / "crowd", JOBS, settings=SETTINGS,
                            prober=prober, timeout=120, probe=probe_of(dependency), knee=False)
    _all_ran_once(crowd, JOBS)
    context = (f"settle {crowd['settle_workers']} max {crowd['max_workers']}; caps {crowd['binding_caps']}; "
               f"timeline {crowd['workers_timeline']}; decisions {crowd['decisions']}")
    assert any(cap.startswith("probe:dep=") for cap in crowd["binding_caps"]), context
    assert crowd["settle_workers"] <= 1.5 * knee, context


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_a_probe_that_cannot_connect_changes_nothing(connection_pool, pg_server, tmp_path):
    # The same crowd, a probe of a port nothing listens on: no reading, so neither a hold nor a
    # shrink -- the pool grows as it does with no probe at all (to max_workers, its knee off).
    jobs = 800
    with Prober(connection_pool, rate=10) as prober:
        crowd = flash_crowd("daemon", connection_pool, pg_server, tmp_path / "crowd", jobs, settings=SETTINGS,
                            prober=prober, timeout=120, probe={"tcp": f"127.0.0.1:{_closed_port()}"}, knee=False)
    _all_ran_once(crowd, jobs)
    context = f"caps {crowd['binding_caps']}; timeline {crowd['workers_timeline']}; decisions {crowd['decisions']}"
    assert not any(cap.startswith("probe:") for cap in crowd["binding_caps"]), context
    assert crowd["max_workers"] == SETTINGS.max_workers, context
    log = (tmp_path / "crowd" / "logs" / "flexiqd.log").read_text()
    assert "The probe of dependency dep" in log and "gives no reading" in log
