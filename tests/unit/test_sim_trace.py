"""Trace files: validation that names the bad field, and deterministic realisation."""

from __future__ import annotations

import copy
import random

import pytest

from flexiqd.sim.bench import standard_traces
from flexiqd.sim.trace import LogNormal, TraceError, load_trace, parse_trace, realise

from test_sim_support import SMALL, small_data, small_trace, write_trace


def test_the_standard_traces_are_valid_and_cover_the_required_shapes():
    names = {load_trace(path).name for path in standard_traces()}
    assert {"steady", "diurnal", "bursts", "flood", "slow_jobs", "mixed", "tight_db"} <= names
    assert any(load_trace(path).dependency for path in standard_traces())


def _broken(path: str, value):
    data = copy.deepcopy(SMALL)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    if value is KeyError:
        del node[last]
    else:
        node[int(last) if last.isdigit() else last] = value
    return data


@pytest.mark.parametrize(
    "path, value, message",
    [
        ("name", KeyError, "small.json: trace: missing required field 'name'"),
        ("duration", 0, "small.json: duration: must be a number > 0, got 0"),
        ("seed", 1.5, "small.json: seed: must be an integer >= 0, got 1.5"),
        ("colour", "red", "small.json: colour: unknown field"),
        ("workers.max", 0, "small.json: workers.max: must be an integer >= 1, got 0"),
        ("workers.initial", 50, "small.json: workers.initial: must be within [1, 12], got 50"),
        ("workers.concurrency", "4", 'small.json: workers.concurrency: must be an integer >= 1, got "4"'),
        ("arrivals.0.rate", -2, "small.json: arrivals[0].rate: must be a number > 0, got -2"),
        ("arrivals.0.kind", "wave", "small.json: arrivals[0].kind: must be one of burst, diurnal, steady"),
        ("arrivals.1.jobs", 0, "small.json: arrivals[1].jobs: must be an integer >= 1, got 0"),
        ("arrivals.1.at", 900, "small.json: arrivals[1].at: must be before the trace's duration (300)"),
        ("arrivals", [], "small.json: arrivals: must be a non-empty list"),
        ("jobs.duration.p99", 0.5, "small.json: jobs.duration.p99: must be above the median (1), got 0.5"),
        ("jobs.duration.kind", "pareto", "small.json: jobs.duration.kind: must be one of constant"),
        ("dependency.request_load", 10, "small.json: dependency.request_load: must be below the capacity (10)"),
        ("dependency.share", 2, "small.json: dependency.share: must be a number >= 0 and <= 1, got 2"),
        ("dependency.declared", "yes", 'small.json: dependency.declared: must be true or false, got "yes"'),
    ],
)
def test_validation_names_the_bad_field(path, value, message):
    with pytest.raises(TraceError) as raised:
        parse_trace(_broken(path, value), source="small.json")
    assert str(raised.value).startswith(message)


def test_a_source_without_durations_needs_a_default():
    data = small_data(jobs={})
    with pytest.raises(TraceError, match=r"arrivals\[0\].duration: missing, and the trace has no jobs.duration"):
        parse_trace(data, source="t.json")


def test_unreadable_and_malformed_files_are_trace_errors(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{ not json")
    with pytest.raises(TraceError, match=r"^broken.json: not valid JSON: .* at line 1 column 3"):
        load_trace(broken)
    assert load_trace(write_trace(tmp_path, SMALL)).name == "small"


def test_realisation_is_deterministic_in_the_seed():
    first, again = realise(small_trace()), realise(small_trace())
    assert first == again
    assert realise(small_trace(seed=12)) != first


def test_delayed_jobs_become_runnable_later_and_every_job_is_ordered():
    workload = realise(small_trace())
    assert list(workload.runnable_at) == sorted(workload.runnable_at)
    delays = [run - enq for run, enq in zip(workload.runnable_at, workload.enqueued_at)]
    assert max(delays) == pytest.approx(100.0)
    assert min(delays) == 0.0
    assert sum(1 for at in workload.runnable_at if 120 <= at < 125) >= 80  # the burst


def test_the_scheduled_sources_run_ats_are_kept_for_the_coming_due_count():
    workload = realise(small_trace())
    [(delay, run_ats)] = workload.scheduled  # one source of the small trace has a run-at delay
    assert delay == 100.0 and list(run_ats) == sorted(run_ats)
    delayed = sorted(run for run, enq in zip(workload.runnable_at, workload.enqueued_at) if run > enq)
    assert list(run_ats) == delayed and len(delayed) > 10
    assert realise(small_trace(arrivals=[{"kind": "steady", "rate": 1.0}])).scheduled == ()


def test_lognormal_matches_its_median_and_p99():
    dist = LogNormal(median=2.0, p99=12.0)
    rng = random.Random(1)
    samples = sorted(dist.sample(rng) for _ in range(20000))
    assert samples[10000] == pytest.approx(2.0, rel=0.05)
    assert samples[19800] == pytest.approx(12.0, rel=0.1)
