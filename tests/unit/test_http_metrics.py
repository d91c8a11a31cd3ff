"""/metrics rendering: a snapshot in, Prometheus text out (parsed back to check it)."""

from __future__ import annotations

import re

import pytest

from prometheus_client.parser import text_string_to_metric_families

from flexiqd.http.counters import DURATION_BUCKETS, Histogram, QueueTally
from flexiqd.http.metrics import render
from flexiqd.http.snapshot import DaemonFigures, DependencyFigures, Snapshot
from flexiqd.queue.types import Stats


def stats(queue="default", **fields):
    values = dict(runnable=0, delayed=0, running=0, dead=0, oldest_runnable_age=0.0, arrival_rate=0.0,
                  completion_rate=0.0, failure_rate=0.0, duration_p50=None, duration_p95=None,
                  duration_p99=None, window=60.0)
    values.update(fields)
    return Stats(queue=queue, **values)


def pool_document(**fields):
    document = {"queues": ["default"], "min_workers": 1, "max_workers": 10, "paused": False,
                "workers": {"active": 3, "starting": 1, "draining": 2, "failed": 0}, "desired": 4,
                "utilisation": 0.5, "start_cost": {"seconds": 0.4, "ready": True, "samples": 3},
                "metrics": {"oldest_runnable_age": 12.5}}
    document.update(fields)
    return document


def snapshot(**fields):
    values = dict(
        taken_at=1000.0,
        status={"pools": {"web": pool_document()}},
        queue_stats={"default": stats(runnable=7, delayed=2, running=3, dead=1, oldest_runnable_age=12.5,
                                      completion_rate=2.0)},
        binding_caps={"web": ("dependency:db", 4)},
        dependencies=(DependencyFigures("db", 40.0, 10.0, 24.0),),
        counters={"default": QueueTally(arrivals=50, completions=40, failures=3, dead_letters=1,
                                        releases=2, crash_reruns=1)},
        scale_events={("web", "up", "ScaleUpAge"): 2, ("web", "down", "ScaleDownIdle"): 1},
        daemon=DaemonFigures(version="9.9", ticks=12, last_tick_at=999.0, tick_durations=Histogram((0.1, 1.0)),
                             last_stats_read_at=998.0, stats_read_failures=2, config_generation=3,
                             last_reload_ok=False),
        target_ages={"web": 30.0})
    values.update(fields)
    return Snapshot(**values)


def samples(snap):
    """{(name, frozenset(labels)): value} of every sample in the rendered text."""
    text = render(snap).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found, name, **labels):
    return found[(name, frozenset(labels.items()))]


def test_queue_gauges_come_from_the_last_stats():
    found = samples(snapshot())
    assert value(found, "flexiqd_queue_runnable_jobs", queue="default") == 7
    assert value(found, "flexiqd_queue_delayed_jobs", queue="default") == 2
    assert value(found, "flexiqd_queue_running_jobs", queue="default") == 3
    assert value(found, "flexiqd_queue_dead_jobs", queue="default") == 1
    assert value(found, "flexiqd_queue_oldest_runnable_age_seconds", queue="default") == 12.5
    assert value(found, "flexiqd_queue_time_to_drain_seconds", queue="default") == 3.5


def test_time_to_drain_is_absent_while_nothing_completes():
    found = samples(snapshot(queue_stats={"default": stats(runnable=5)}))
    assert not any(name == "flexiqd_queue_time_to_drain_seconds" for name, _ in found)


def test_queue_counters_carry_total_and_the_queue_label_only():
    found = samples(snapshot())
    for name, expected in [("arrivals", 50), ("completions", 40), ("failures", 3), ("dead_letters", 1),
                           ("drain_releases", 2), ("crash_reruns", 1)]:
        assert value(found, f"flexiqd_queue_{name}_total", queue="default") == expected


def test_the_duration_histogram_is_cumulative_per_task_and_reaches_hours():
    histogram = Histogram()
    for seconds in (0.2, 0.2, 3.0, 5400.0, 100000.0):
        histogram.observe(seconds)
    counters = {"default": QueueTally(durations={"mail.send": histogram})}
    found = samples(snapshot(counters=counters))
    bucket = lambda le: value(found, "flexiqd_job_duration_seconds_bucket", queue="default", task="mail.send", le=le)
    assert bucket("0.25") == 2 and bucket("5.0") == 3 and bucket("3600.0") == 3
    assert bucket("7200.0") == 4 and bucket("28800.0") == 4 and bucket("+Inf") == 5
    assert value(found, "flexiqd_job_duration_seconds_count", queue="default", task="mail.send") == 5
    assert value(found, "flexiqd_job_duration_seconds_sum", queue="default", task="mail.send") == sum(
        (0.2, 0.2, 3.0, 5400.0, 100000.0))
    assert max(DURATION_BUCKETS) >= 4 * 3600


def test_a_duration_on_a_bucket_bound_counts_in_that_bucket():
    histogram = Histogram((1.0, 2.0))
    histogram.observe(1.0)
    assert histogram.cumulative() == [("1.0", 1), ("2.0", 1), ("+Inf", 1)]


def test_pool_figures():
    found = samples(snapshot())
    assert value(found, "flexiqd_pool_workers", pool="web", state="active") == 3
    assert value(found, "flexiqd_pool_workers", pool="web", state="draining") == 2
    assert value(found, "flexiqd_pool_desired_workers", pool="web") == 4
    assert value(found, "flexiqd_pool_max_workers", pool="web") == 10
    assert value(found, "flexiqd_pool_binding_cap_workers", pool="web", cap="dependency:db") == 4
    assert value(found, "flexiqd_pool_utilisation_ratio", pool="web") == 0.5
    assert value(found, "flexiqd_pool_start_cost_seconds", pool="web") == 0.4
    assert value(found, "flexiqd_pool_queue_info", pool="web", queue="default") == 1
    assert value(found, "flexiqd_pool_oldest_runnable_age_seconds", pool="web") == 12.5
    assert value(found, "flexiqd_pool_target_age_seconds", pool="web") == 30
    assert value(found, "flexiqd_scale_events_total", pool="web", direction="up", reason="ScaleUpAge") == 2
    assert value(found, "flexiqd_scale_events_total", pool="web", direction="down", reason="ScaleDownIdle") == 1


def test_a_restart_in_progress_shows_its_old_workers_left_and_none_otherwise():
    assert value(samples(snapshot()), "flexiqd_pool_restart_old_workers", pool="web") == 0
    running = pool_document(restart={"state": "replacing", "old_serving": 2, "old_draining": 1})
    found = samples(snapshot(status={"pools": {"web": running}}))
    assert value(found, "flexiqd_pool_restart_old_workers", pool="web") == 3
    done = pool_document(restart={"state": "done", "old_serving": 0, "old_draining": 0})
    assert value(samples(snapshot(status={"pools": {"web": done}})), "flexiqd_pool_restart_old_workers",
                 pool="web") == 0


def test_a_measured_ceiling_is_a_metric_and_absent_while_none_is_known():
    names = {name for name, _ in samples(snapshot())}
    assert "flexiqd_pool_measured_ceiling_workers" not in names
    document = dict(pool_document(), ceiling={"workers": 2, "jobs_per_second": 80.5, "since": 1000.0,
                                              "above": {"workers": 4, "jobs_per_second": 79.0, "at": 990.0}})
    found = samples(snapshot(status={"pools": {"web": document}}))
    assert value(found, "flexiqd_pool_measured_ceiling_workers", pool="web") == 2
    assert value(found, "flexiqd_pool_measured_ceiling_jobs_per_second", pool="web") == 80.5


def test_direct_evidence_is_a_metric_each_absent_without_a_reading():
    from flexiqd.daemon.documents import evidence_document
    from flexiqd.policy.config import EvidenceRule
    from flexiqd.policy.types import EvidenceTrack

    rules = (EvidenceRule(source="probe:db", threshold=5.0), EvidenceRule(source="pressure:cpu", threshold=60.0))
    tracks = (EvidenceTrack(source="probe:db", recent=(0.04, 0.05, 0.06), unloaded=(0.002, 0.003, 0.004),
                            last_good=4, held_at=4),
              EvidenceTrack(source="pressure:cpu"))
    evidence = evidence_document(rules, tracks, {"pressure:cpu": "no cpu.pressure readable"})
    assert evidence[0]["bound"] == pytest.approx(5 * 0.003) and evidence[0]["reading"] == 0.06
    assert evidence[1]["reading"] is None and evidence[1]["note"] == "no cpu.pressure readable"
    found = samples(snapshot(status={"pools": {"web": dict(pool_document(), evidence=evidence)}}))
    assert value(found, "flexiqd_pool_probe_latency_seconds", pool="web", dependency="db") == 0.05
    assert value(found, "flexiqd_pool_probe_baseline_seconds", pool="web", dependency="db") == 0.003
    assert value(found, "flexiqd_pool_evidence_held_workers", pool="web", source="probe:db") == 4
    assert not any(name == "flexiqd_pool_pressure_percent" for name, _ in found)


def test_the_status_documents_ceiling_comes_from_the_knee():
    from flexiqd.daemon.documents import ceiling_document
    from flexiqd.policy.types import KneeState, ThroughputSample

    assert ceiling_document(KneeState()) is None
    knee = KneeState(samples=(ThroughputSample(1, 40.0, 0.05, 10.0, 80), ThroughputSample(2, 80.0, 0.05, 14.0, 160),
                              ThroughputSample(4, 79.0, 0.1, 18.0, 158)), held_at=2, held_since=18.0)
    assert ceiling_document(knee) == {"workers": 2, "jobs_per_second": 80.0, "since": 18.0,
                                      "above": {"workers": 4, "jobs_per_second": 79.0, "at": 18.0}}


def test_a_pool_not_sized_yet_shows_its_bounds_but_no_made_up_counts():
    document = pool_document(workers=None, desired=None, utilisation=None, start_cost=None, metrics=None)
    found = samples(snapshot(status={"pools": {"web": document}}, binding_caps={}))
    assert value(found, "flexiqd_pool_min_workers", pool="web") == 1
    names = {name for name, _ in found}
    assert not names & {"flexiqd_pool_workers", "flexiqd_pool_desired_workers", "flexiqd_pool_utilisation_ratio",
                        "flexiqd_pool_start_cost_seconds", "flexiqd_pool_binding_cap_workers",
                        "flexiqd_pool_oldest_runnable_age_seconds"}


def test_dependencies_and_daemon_figures():
    found = samples(snapshot())
    assert value(found, "flexiqd_dependency_capacity", dependency="db") == 40
    assert value(found, "flexiqd_dependency_reserved", dependency="db") == 10
    assert value(found, "flexiqd_dependency_use", dependency="db") == 24
    assert value(found, "flexiqd_build_info", version="9.9") == 1
    assert value(found, "flexiqd_ticks_total") == 12
    assert value(found, "flexiqd_last_stats_read_timestamp_seconds") == 998
    assert value(found, "flexiqd_stats_read_failures_total") == 2
    assert value(found, "flexiqd_config_generation") == 3
    assert value(found, "flexiqd_config_last_reload_successful") == 0
    assert value(found, "flexiqd_workers_unlisted") == 0


def test_a_pool_held_because_the_workers_cannot_be_listed_is_a_metric():
    held = snapshot(status={"pools": {"web": pool_document()},
                            "fleet_problem": "cannot connect to systemd over the system bus: Connection refused"})
    assert value(samples(held), "flexiqd_workers_unlisted") == 1


def test_names_follow_prometheus_conventions():
    text = render(snapshot()).decode()
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    for name, kind in types.items():
        assert re.match(r"^flexiqd_[a-z_]+$", name), name
        if kind == "counter":
            assert name.endswith("_total"), name
    assert "job_id" not in text and "_milliseconds" not in text
