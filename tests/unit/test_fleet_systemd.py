"""The systemd fleet's pure parts: unit naming, states, drop-ins (the rest is tested in tests/system)."""

from __future__ import annotations

from flexiqd.fleet.base import WorkerSpec, WorkerState, parse_instance
from flexiqd.fleet.systemd import SystemdFleet, unit_name, unit_path, worker_state


def test_a_pending_start_job_counts_as_starting_before_the_unit_leaves_inactive():
    assert worker_state("inactive", "start") is WorkerState.STARTING
    assert worker_state("activating", "") is WorkerState.STARTING
    assert worker_state("active", "") is WorkerState.ACTIVE
    assert worker_state("active", "stop") is WorkerState.DRAINING
    assert worker_state("deactivating", "") is WorkerState.DRAINING
    assert worker_state("failed", "") is WorkerState.FAILED
    assert worker_state("inactive", "") is None


def test_unit_names_and_paths_follow_systemds_escaping():
    assert unit_name("default", 3) == "flexiq-worker@default-3.service"
    assert unit_path("flexiq-worker@default-3.service") == \
        b"/org/freedesktop/systemd1/unit/flexiq_2dworker_40default_2d3_2eservice"
    assert parse_instance("img_resize-12") == ("img_resize", 12)
    assert parse_instance("Bad-1") is None and parse_instance("default") is None


def test_the_dropin_carries_the_stop_timeout_environment_and_config_path():
    fleet = SystemdFleet(systemd=None, config_path="/srv/flexiqd.yaml")
    spec = WorkerSpec(pool="p", app="a:q", queues=("q",), concurrency=2, drain_timeout=45,
                      lease_seconds=30, store_url="sqlite:////x.db", environment={"MODE": 'a "b"'})
    text = fleet.dropin_text(spec)
    assert "TimeoutStopSec=55s" in text
    assert 'Environment="FLEXIQD_CONFIG=/srv/flexiqd.yaml"' in text
    assert 'Environment="MODE=a \\"b\\""' in text
