"""What flexiqctl, the Status document and /metrics show of the schedules (from a real firing loop
on a SQLite store; the documents and the text are pure)."""

from __future__ import annotations

import json
import re

from flexiqd.cli.render import render_schedules, render_status
from flexiqd.config import parse_config
from flexiqd.daemon.documents import schedules_document, status_document
from flexiqd.daemon.schedules import ScheduleFirer
from flexiqd.http.metrics import exposition, schedule_families
from flexiqd.http.snapshot import DaemonFigures, build_snapshot
from flexiqd.queue import open_backend

T0 = 1_800_000_000.0

CONFIG = """
pools:
  default: {queues: [default, reports]}
  other: {queues: [other]}
schedules:
  fast: {task: tick, cron: '* * * * * */10', queue: reports, overlap: skip}
  nightly: {task: app.report, args: [secret], cron: '0 3 * * *', timezone: Europe/Berlin}
"""


def fired(tmp_path):
    config = parse_config(CONFIG)
    backend = open_backend(f"sqlite:///{tmp_path}/q.db")
    firer = ScheduleFirer(backend, "host:1", lambda: config.schedules, clock=lambda: T0 + 25)
    firer.pass_once(T0)
    firer.pass_once(T0 + 10)
    firer.pass_once(T0 + 25)   # T0+20 overlaps the job of T0+10, still queued
    firer.run_now("nightly")
    firer.pass_once(T0 + 25)
    return config, firer


def test_the_status_document_shows_each_pools_next_fire_and_every_schedule(tmp_path):
    config, firer = fired(tmp_path)
    document = status_document(config, "x.yaml", None, {}, {}, T0 + 25, schedules=firer.views(),
                               counters=firer.counters)
    assert document["pools"]["default"]["next_schedule"] == {"schedule": "fast", "at": T0 + 30, "queue": "reports"}
    assert document["pools"]["other"]["next_schedule"] is None
    assert set(document["schedules"]) == {"fast", "nightly"}
    assert "secret" not in json.dumps(document)
    text = render_status(document, now=T0 + 25)
    assert re.search(r"^  schedule +next fire .* \(in 5(\.0)?s\): fast to queue reports$", text, re.M), text


def test_flexiqctl_schedules_shows_next_fire_last_slot_and_skips(tmp_path):
    config, firer = fired(tmp_path)
    document = json.loads(json.dumps(schedules_document(firer.views(), config, firer.counters)))
    fast = document["schedules"]["fast"]
    assert (fast["fired"], fast["skipped"], fast["next_fire"], fast["pools"]) == (1, 1, T0 + 30, ["default"])
    assert (fast["last"]["slot"], fast["last"]["outcome"], fast["last"]["reason"]) == (T0 + 20, "skipped", "overlap")
    assert document["schedules"]["nightly"]["last_run"]["job_id"] is not None
    assert document["decided_here"]["skipped"] == {"fast:overlap": 1}
    text = render_schedules(document, now=T0 + 25)
    print(text)
    assert "schedule fast" in text and "'* * * * * */10' in UTC" in text
    assert "skipped (overlap)" in text and "1 fired, 1 skipped (every host)" in text
    assert "last run" in text and re.search(r"\(in 5(\.0)?s\)", text)


def test_metrics_count_slots_fired_skipped_and_late_per_schedule(tmp_path):
    config, firer = fired(tmp_path)
    status = status_document(config, "x.yaml", None, {}, {}, T0 + 25, schedules=firer.views(),
                             counters=firer.counters)
    snapshot = build_snapshot(status, {}, counters={}, scale_events={}, daemon=DaemonFigures(version="0"),
                              now=T0 + 25)
    text = exposition(schedule_families(snapshot)).decode()
    print(text)
    assert 'flexiqd_schedule_slots_fired_total{schedule="fast"} 1.0' in text
    assert 'flexiqd_schedule_slots_skipped_total{reason="overlap",schedule="fast"} 1.0' in text
    assert 'flexiqd_schedule_slots_late_total{schedule="fast"} 0.0' in text
    assert 'flexiqd_schedule_runs_total{schedule="nightly"} 1.0' in text
    assert f'flexiqd_schedule_next_fire_timestamp_seconds{{schedule="fast"}} {T0 + 30:.1f}' in text.replace(
        "1.80000003e+09", f"{T0 + 30:.1f}")


def test_each_pool_gets_its_next_firing_and_the_measured_size_of_the_past_ones(tmp_path):
    from flexiqd.queue import ClaimRequest, Outcome
    from flexiqd.schedules.forecast import Firing, pool_forecasts

    config, firer = fired(tmp_path)
    backend = firer.backend
    [job] = backend.claim(ClaimRequest(owner="w", queues=("reports",), limit=1), now=T0 + 26)
    backend.settle("w", [Outcome.ack(job.id)], now=T0 + 28.5)
    forecasts = firer.forecasts({name: pool.queues for name, pool in config.pools.items()})
    print(forecasts)
    assert set(forecasts) == {"default"}   # nothing feeds pool other's queue
    default = forecasts["default"]
    assert (default.schedule, default.at, default.jobs, default.seconds, default.samples) == \
        ("fast", T0 + 30, 1.0, 2.5, 1)
    # The pure part alone: the earliest schedule wins; a firing still running has no time yet.
    mixed = pool_forecasts({"p": ("a", "b")}, {"s1": ("a", 100.0), "s2": ("b", 50.0)},
                           {"s2": [Firing(10.0, 3, 6.0), Firing(20.0, 1, None)]})
    assert mixed["p"].schedule == "s2" and (mixed["p"].jobs, mixed["p"].seconds, mixed["p"].samples) == (2.0, 6.0, 2)
