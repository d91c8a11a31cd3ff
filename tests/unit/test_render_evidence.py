"""flexiqctl status's rows for direct evidence: a probe's reading against its baseline, a pressure, a hold."""

from __future__ import annotations

from flexiqd.cli.render import evidence_line, pool_rows


def test_a_probe_row_shows_its_reading_baseline_bound_and_hold():
    held = {"source": "probe:db", "threshold": 3.0, "reading": 0.0412, "note": None, "level": 0.04,
            "baseline": 0.002, "bound": 0.007, "held_at": 4, "count_before": 4}
    assert evidence_line(held) == ("db: 41.2 ms (baseline 2.0 ms, holds above 7.0 ms): held at 4 workers, "
                                   "the count before the rise")
    failing = dict(held, reading=None, note="cannot connect: Connection refused", held_at=None, baseline=None)
    assert evidence_line(failing) == ("db: no reading (cannot connect: Connection refused) (no baseline yet: "
                                      "learned while the pool is idle)")


def test_a_pressure_row_and_where_the_rows_go():
    cpu = {"source": "pressure:cpu", "threshold": 60.0, "reading": 72.4, "note": None, "level": 70.0,
           "baseline": None, "bound": 60.0, "held_at": None, "count_before": 3}
    assert evidence_line(cpu) == "cpu: 72% (holds at 60% and above)"
    pool = {"name": "default", "queues": ["default"], "concurrency": 2, "min_workers": 1, "max_workers": 8,
            "workers": None, "desired": None, "evidence": [cpu]}
    assert ("pressure", "cpu: 72% (holds at 60% and above)") in pool_rows(pool, 0.0)


def test_a_measured_ceiling_row_says_where_the_pool_is_held_and_what_the_count_above_gave():
    import time
    since = time.mktime((2026, 12, 5, 12, 1, 55, 0, 0, -1))
    ceiling = {"workers": 2, "jobs_per_second": 80.04, "since": since,
               "above": {"workers": 4, "jobs_per_second": 79.0, "at": since + 75}}
    pool = {"name": "default", "queues": ["default"], "concurrency": 2, "min_workers": 1, "max_workers": 8,
            "workers": None, "desired": None, "ceiling": ceiling}
    assert ("ceiling", "held at 2 workers (80.0 jobs/s) since 12:01:55; 4 workers gave 79.0 jobs/s at 12:03:10") \
        in pool_rows(pool, since)
    # None measured (or cleared): no row.
    assert not [row for row in pool_rows(dict(pool, ceiling=None), since) if row[0] == "ceiling"]
    # While the knee is trimmed, the count held is fewer than the best, not counted yet.
    trimmed = dict(ceiling, workers=1, jobs_per_second=None)
    assert ("ceiling", "held at 1 workers (not measured yet) since 12:01:55; 4 workers gave 79.0 jobs/s at 12:03:10") \
        in pool_rows(dict(pool, ceiling=trimmed), since)
