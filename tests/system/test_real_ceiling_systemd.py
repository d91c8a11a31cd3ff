"""flexiqd as the daemon under the real systemd finds a connection pool's ceiling nobody told it.

The dependency is pgbouncer (transaction mode) with 4 server connections in front of a
PostgreSQL server on this machine (bench/ceilings/deps.py); each job holds one 50 ms
(``pg_sleep``), every other transaction waits in pgbouncer's queue.  flexiqd.service runs in
the sandbox with the shipped units and its workers are ``flexiq-worker@crowd-<n>.service``
units; its config has no ``dependencies:`` at all.  The sandbox has a network of its own, so
the store's server and pgbouncer also listen on unix sockets in a folder of the checkout,
which the sandbox sees at the same path (bench/ceilings/systemd_fleet.py).

First the ceiling is checked with a short sweep of concurrent callers: 4 operations at once
give all the throughput there is, so 2 workers of concurrency 2 are the knee.  Then a flash
crowd arrives on a pool of min 1 / max 16 workers.  Counts, never times: every job ran
exactly once (the app's execution marks), none was lost, the worker units' processes over
the second half of the drain (a stopping one counts until it has exited) are at most 1.5 x
the knee -- a pool scaled to the crowd's depth settles at 16 -- and ``flexiqctl status
--json`` and the journal name the measured ceiling as what held the pool.
"""

from __future__ import annotations

import pathlib
import sys

import pytest

from pg_server import PostgresServer, unavailable_reason as pg_unavailable

from .conftest import in_ci
from .sandbox import Sandbox

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

from ceilings import Prober, Settings, ceiling, flash_crowd, unavailable_reason  # noqa: E402
from ceilings.deps import share_folder  # noqa: E402
from ceilings.slots import knee_from_slots, slot_sweep  # noqa: E402

CAPACITY = 4          # pgbouncer's server connections
SETTINGS = Settings(concurrency=2, min_workers=1, max_workers=16, target_age=10.0, poll_interval=1.0)
JOBS = 1600           # about 20 s of work at the ceiling (4 connections x 20 jobs/s)


@pytest.fixture
def shared_pool(sandbox: Sandbox):
    """(pgbouncer with CAPACITY connections, its PostgreSQL server, the folder both listen in)."""
    reason = pg_unavailable() or unavailable_reason("connections")
    if reason is not None:
        if in_ci():
            pytest.fail(f"the ceiling test must run in CI, but {reason}", pytrace=False)
        pytest.skip(reason)
    with share_folder() as share, PostgresServer(socket_dirs=(share,)) as server, \
            ceiling("connections", CAPACITY, server=server, share=share) as dependency:
        yield dependency, server, share


def test_the_daemon_under_systemd_settles_at_the_knee_of_a_connection_pool_it_is_not_told_about(
        sandbox: Sandbox, shared_pool, tmp_path: pathlib.Path):
    dependency, server, share = shared_pool
    sweep = slot_sweep(dependency, [1, 2, 4, 6, 8])
    assert sweep["slots"] == CAPACITY, sweep
    knee = knee_from_slots(sweep["slots"], SETTINGS.concurrency)
    assert knee == 2

    with Prober(dependency, rate=10) as prober:
        crowd = flash_crowd("daemon-systemd", dependency, server, tmp_path / "crowd", JOBS, settings=SETTINGS,
                            prober=prober, timeout=120, sandbox=sandbox, share=share)
    context = (f"settle {crowd['settle_workers']} max {crowd['max_workers']}; sweep {sweep['points']}; "
               f"timeline {crowd['workers_timeline']}; decisions {crowd['decisions']}; "
               f"held by {crowd['status_seen']}")
    assert not crowd.get("timed_out"), context
    assert (crowd["done"], crowd["dead"], crowd["lost"]) == (JOBS, 0, 0), context
    assert crowd["duplicates"] == 0 and crowd["executions"] == JOBS, context
    # The worker units were counted at all (a sampler that saw none would pass the next line).
    assert crowd["max_workers"] >= knee, context
    assert crowd["settle_workers"] <= 1.5 * knee, context
    # What held it, said where an operator looks: the status document and the journal.
    held = [s for s in crowd["statuses"] if s["binding_cap"] == "knee"]
    assert held and held[-1]["reason"] == "CappedByKnee", context
    assert any("held at a measured ceiling" in (s["rationale"] or "") for s in held), context
    assert any(s["ceiling"] and s["ceiling"]["workers"] <= 1.5 * knee for s in held), context
    assert any(cap.startswith("knee=") for cap in crowd["binding_caps"]), context
