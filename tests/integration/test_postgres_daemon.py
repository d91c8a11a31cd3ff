"""flexiqd with the process fleet on a PostgreSQL store: the SQLite tests' scale-up, drain and
crash recovery, run again with this module's ``store`` (a fresh schema on the session's server)."""

from __future__ import annotations

import pytest

from .test_daemon_wakes import (  # noqa: F401  (collected here, on PostgreSQL)
    test_a_burst_wakes_the_daemon_long_before_its_tick,
    test_delayed_jobs_wake_the_daemon_when_they_come_due,
)
from .test_daemon_process_fleet import (  # noqa: F401  (collected here, on PostgreSQL)
    test_a_worker_killed_mid_job_is_replaced_and_its_job_runs_again_at_once,
    test_burst_scales_up_then_stop_drains_every_worker_without_duplicates,
)


@pytest.fixture
def store(pg_server) -> str:
    return pg_server.fresh_url()
