"""A real dependency ceiling nobody tells flexiqd about: `flexiq autoscale --policy flexiqd` must find it.

The dependency is pgbouncer with 4 server connections in front of the session's
PostgreSQL server (bench/ceilings/deps.py); each job holds one for 50 ms
(``pg_sleep``), so 4 slots -> 2 workers of concurrency 2 keep it full, and more only
queue in pgbouncer (and slow the request path that shares it).  The test measures the
knee itself (a short sweep of fixed fleets), then drops a flash crowd on a pool of
min 1 / max 16 workers and checks counts, never times: no job ran twice, none was lost,
and the pool's worker count over the second half of the drain settles at most 1.5 x the
knee (a policy that scales a flash crowd to max_workers settles at 16).
"""

from __future__ import annotations

import pathlib
import sys

import pytest

from pg_server import in_ci

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

from ceilings import Prober, Settings, ceiling, flash_crowd, knee_sweep, unavailable_reason  # noqa: E402

CAPACITY = 4          # pgbouncer's server connections
SETTINGS = Settings(concurrency=2, min_workers=1, max_workers=16, target_age=10.0, poll_interval=1.0)
JOBS = 1600           # about 20 s of work at the ceiling (4 connections x 20 jobs/s)
SWEEP = [1, 2, 3, 4, 6]


class SettledAboveKnee(AssertionError):
    """The pool kept more workers than the dependency can use."""


@pytest.fixture
def connection_pool(pg_server):
    reason = unavailable_reason("connections")
    if reason is not None:
        if in_ci():
            pytest.fail(f"the ceiling test must run in CI, but {reason}", pytrace=False)
        pytest.skip(reason)
    with ceiling("connections", CAPACITY, server=pg_server) as dependency:
        yield dependency


@pytest.mark.slow
def test_flexiqd_settles_at_the_knee_of_a_connection_pool_it_is_not_told_about(connection_pool, pg_server,
                                                                                  tmp_path: pathlib.Path):
    dependency = connection_pool
    derived = dependency.expected_knee(SETTINGS.concurrency)
    assert derived == 2
    with Prober(dependency, rate=10) as prober:
        sweep = knee_sweep(dependency, pg_server, tmp_path / "sweep", SWEEP, settings=SETTINGS, prober=prober,
                           window=3.0, min_jobs=150)
        crowd = flash_crowd("flexiqd", dependency, pg_server, tmp_path / "crowd", JOBS, settings=SETTINGS,
                            prober=prober, timeout=90)
    rates = {p["workers"]: p["jobs_per_s"] for p in sweep["points"]}
    # The sweep finds the knee where capacity / concurrency puts it (one worker more at most:
    # a worker's slot idles a moment between two jobs).
    assert derived <= sweep["knee"] <= derived + 1, rates
    assert sweep["duplicates"] == 0
    assert not crowd.get("timed_out"), crowd
    assert (crowd["done"], crowd["dead"], crowd["lost"]) == (JOBS, 0, 0), crowd
    assert crowd["duplicates"] == 0, crowd
    assert crowd["executions"] == JOBS
    limit = 1.5 * sweep["knee"]
    if crowd["settle_workers"] > limit:
        raise SettledAboveKnee(
            f"the pool settled at {crowd['settle_workers']} workers (max {crowd['max_workers']}) where the knee is "
            f"{sweep['knee']} (at most {limit:g} allowed); sweep {rates}; timeline {crowd['workers_timeline']}; "
            f"decisions {crowd.get('decisions')}")
