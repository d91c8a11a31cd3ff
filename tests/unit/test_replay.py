"""``bench replay``'s pure parts: compressing a trace, the daemon's config, the measured row.

No container here: the replay itself is a benchmark (docs/replay.md) and no
test depends on its timings.
"""

from __future__ import annotations

import json
import math
import types
from dataclasses import replace

import pytest

from flexiqd.cli import bench
from flexiqd.config.load import parse_config
from flexiqd.sim import replay
from flexiqd.sim.bench import standard_traces
from flexiqd.sim.engine import FLAP_WINDOW
from flexiqd.sim.replay import (
    JobRecord,
    Recording,
    compress_trace,
    count_flaps,
    daemon_config,
    job_records,
    measure,
    replay_policy,
    schedule,
    seconds_over_target,
    unreplayable,
    worker_spans,
)
from flexiqd.sim.trace import load_trace, realise

from test_sim_support import small_trace

TRACES = {load_trace(path).name: load_trace(path) for path in standard_traces()}


@pytest.mark.parametrize("speed", [1.0, 4.0, 10.0])
def test_a_compressed_trace_realises_the_same_jobs_at_a_kth_of_the_times(speed):
    trace = TRACES["bursts"]
    original, compressed = realise(trace), realise(compress_trace(trace, speed))
    assert len(compressed) == len(original)
    for got, want in ((compressed.runnable_at, original.runnable_at), (compressed.enqueued_at, original.enqueued_at),
                      (compressed.base_duration, original.base_duration)):
        assert all(math.isclose(a * speed, b, rel_tol=1e-9, abs_tol=1e-9) for a, b in zip(got, want))


def test_compression_scales_every_time_of_the_trace_and_its_delays_and_mixtures():
    compressed = compress_trace(TRACES["diurnal"], 10)
    assert (compressed.duration, compressed.tick_interval, compressed.target_age) == (240, 0.5, 3)
    assert (compressed.workers.cold_start, compressed.workers.stop_timeout) == (0.5, 9)
    assert compressed.sources[1].delay == 60
    assert compressed.sources[0].pattern.peak == 160
    mixed = compress_trace(TRACES["mixed"], 10).sources[0].duration
    assert [part.median for _, part in mixed.components] == [0.05, 2.0]


@pytest.mark.parametrize("speed", [0, -1, math.inf, math.nan])
def test_a_speed_that_is_not_a_positive_number_is_refused(speed):
    with pytest.raises(ValueError, match="speed"):
        compress_trace(TRACES["steady"], speed)


@pytest.mark.parametrize("name, why", [
    ("tight_db", "dependency 'db'"),
    ("hidden_ceiling", "dependency 'partner_api'"),
    ("slow_jobs", "CPU-bound"),
    ("steady", None),
    ("bursts", None),
])
def test_traces_that_sleeping_jobs_cannot_stand_for_are_named(name, why):
    reason = unreplayable(TRACES[name])
    assert (reason is None) if why is None else (why in reason)


def test_the_schedule_is_the_simulators_jobs_in_enqueue_order():
    compressed = compress_trace(TRACES["diurnal"], 10)
    jobs = schedule(compressed)
    assert len(jobs) == len(realise(compressed))
    assert [job.enqueue_at for job in jobs] == sorted(job.enqueue_at for job in jobs)
    assert {round(job.delay, 6) for job in jobs} == {0.0, 60.0}


@pytest.mark.parametrize("name", ["steady", "bursts", "flood", "mixed", "diurnal"])
def test_the_daemon_config_is_valid_and_runs_the_simulators_pool_policy(name):
    compressed = compress_trace(TRACES[name], 10)
    policy = replay_policy(compressed, 10)
    pool = parse_config(daemon_config(compressed, policy), fleet="process").pools[replay.POOL]
    assert pool.policy.targets == policy.targets
    assert (pool.policy.min_workers, pool.policy.max_workers) == (policy.min_workers, policy.max_workers)
    assert pool.concurrency == compressed.workers.concurrency
    assert pool.queues == (replay.POOL,)


def test_the_compressed_target_alone_is_a_valid_policy_the_lead_time_follows_it():
    tight = replay_policy(compress_trace(TRACES["steady"], 10), 10)  # 3 s target
    assert tight.targets.age == 3.0 and tight.targets.lead_time is None
    assert "lead_time" not in replay.daemon_config(compress_trace(TRACES["steady"], 10), tight)


# --- the measured row --------------------------------------------------------------------------


def test_seconds_over_target_is_the_union_of_each_waiting_jobs_time_past_the_target():
    jobs = [
        JobRecord(runnable_at=0, started_at=5),     # over from 2 to 5
        JobRecord(runnable_at=1, started_at=4),     # over from 3 to 4: inside the first
        JobRecord(runnable_at=10, started_at=11),   # never over
        JobRecord(runnable_at=20, started_at=None),  # over from 22 to the end (25)
    ]
    assert seconds_over_target(jobs, 2.0, 0.0, 25.0) == pytest.approx(3 + 3)
    assert seconds_over_target(jobs, 2.0, 3.0, 23.0) == pytest.approx(2 + 1)


@pytest.mark.parametrize("changes, flaps", [
    ([(0, +2), (10, -1)], 1),
    ([(0, +2), (FLAP_WINDOW + 1, -1)], 0),
    ([(0, +2), (5, +1), (10, -1), (15, +1)], 2),
    ([(0, 0), (1, -1)], 0),
])
def test_flaps_follow_the_simulators_rule(changes, flaps):
    assert count_flaps(changes) == flaps


def _entry(unit, message, at):
    return {"UNIT": unit, "MESSAGE_ID": message, "__REALTIME_TIMESTAMP": str(int(at * 1e6))}


STARTING = replay._UNIT_STARTING
SUCCESS, STOPPED = "7ad2d189f7e94e70a38c781354912448", "9d1aaa27d60140bd96365438aad20286"


def test_worker_spans_run_from_starting_to_the_first_end_and_stay_open_while_running():
    entries = [
        _entry("flexiq-worker@replay-1.service", STARTING, 10),
        _entry("flexiq-worker@replay-2.service", STARTING, 11),
        _entry("flexiqd.service", STARTING, 12),
        _entry("flexiq-worker@other-1.service", STARTING, 12),
        _entry("flexiq-worker@replay-1.service", SUCCESS, 20),
        _entry("flexiq-worker@replay-1.service", STOPPED, 20.5),  # the same end, said twice
        _entry("flexiq-worker@replay-1.service", STARTING, 30),
    ]
    assert worker_spans(entries, "flexiq-worker@replay-") == [(10, 20), (11, None), (30, None)]


def test_the_measured_row_uses_the_simulators_definitions_within_the_window():
    recording = Recording(
        start=100.0, end=110.0,
        jobs=job_records([(1, 100.0), (2, 101.0), (3, 102.0), (4, 109.0)],
                         [(1, 100.5), (1, 104.0), (2, 101.0), (3, 106.0), (4, 111.0)]),
        worker_spans=((90.0, 105.0), (103.0, None), (112.0, None)),
        events=((95.0, 0, 2), (103.0, 2, 3), (105.0, 3, 2), (111.0, 2, 1)),
    )
    row = measure(recording, target_age=2.0)
    assert row.worker_seconds == pytest.approx(5 + 7)  # clipped to [100, 110)
    assert row.started == 3  # job 4 started after the end
    assert (row.wait_p50, row.wait_max) == (pytest.approx(0.5), pytest.approx(4.0))
    # job 3 is over from 104 to 106; job 4 would be over from 111, past the end
    assert row.slo_seconds == pytest.approx(2.0)
    assert (row.scale_events, row.flaps) == (2, 1)


def test_the_scaled_row_is_in_the_traces_own_seconds():
    row = measure(Recording(0, 10, (JobRecord(0, 1),), ((0.0, None),), ()), 5.0).scaled(10)
    assert (row.worker_seconds, row.wait_max, row.started) == (100, 10, 1)


def test_the_command_refuses_an_unreplayable_trace_with_one_line(capsys):
    path = standard_traces()[0].parent / "tight_db.json"
    assert bench.replay_main(["--trace", str(path)]) == bench.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tight_db.json: cannot be replayed" in err


def test_the_checkouts_harness_loads():
    if not bench.HARNESS.is_file():
        pytest.skip(f"no {bench.HARNESS} here: the package build runs the unit tests without bench/")
    harness = bench.replay_harness()
    assert callable(harness.replay) and callable(harness.unavailable_reason)
    assert issubclass(harness.ReplayError, Exception)


def test_the_command_refuses_clearly_when_no_container_can_be_booted(monkeypatch, capsys):
    harness = types.SimpleNamespace(unavailable_reason=lambda: "system tests need root", ReplayError=RuntimeError)
    monkeypatch.setattr(bench, "replay_harness", lambda: harness)
    path = standard_traces()[0].parent / "steady.json"
    assert bench.replay_main(["--trace", str(path)]) == bench.EXIT_UNAVAILABLE
    assert capsys.readouterr().err.strip() == (
        "flexiq bench replay: cannot boot a systemd container here: system tests need root")


def test_an_installed_flexiqd_has_no_harness_and_says_so(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench, "HARNESS", tmp_path / "bench" / "replay_machine.py")
    path = standard_traces()[0].parent / "steady.json"
    assert bench.replay_main(["--trace", str(path)]) == bench.EXIT_UNAVAILABLE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a source checkout of flexiqd" in err, err


@pytest.mark.parametrize("argv, message", [
    (["--trace", "x.json", "--speed", "0"], "must be a number above 0"),
    ([], "--trace"),
])
def test_bad_arguments_get_one_line(argv, message, capsys):
    assert bench.replay_main(argv) == bench.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_a_small_trace_simulates_under_the_replays_policy():
    compressed = compress_trace(small_trace(), 10)
    result, decisions = replay.simulate(compressed, replay_policy(compressed, 10))
    assert result.completed > 0
    assert all(line.startswith("t=") for line in decisions)


def test_results_read_back_from_json_print_the_same_tables():
    row = replay.Row(worker_seconds=100, wait_p50=1, wait_p95=2, wait_max=3, slo_seconds=0, scale_events=2,
                     flaps=0, started=10)
    results = [replay.ReplayResult("steady", 10, 10, row, replace(row, worker_seconds=110), ("t=1s a",), ())]
    again = replay.from_json(json.loads(json.dumps(replay.to_json(results))))
    assert again == results
    assert replay.format_table(again) == replay.format_table(results)
    markdown = replay.format_markdown(results)
    assert "| steady (10) | measured/simulated (within aim) | +10% |" in markdown
