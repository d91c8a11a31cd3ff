"""``schedules:`` in the config: validated like every other key, and shown by --check-config."""

from __future__ import annotations

import pytest

from flexiqd.cli import daemon as flexiqd_cli
from flexiqd.config import parse_config
from flexiqd.errors import ConfigError


def test_a_schedule_takes_its_job_and_calendar_from_the_file():
    config = parse_config("""
schedules:
  nightly:
    task: app.report
    args: [1, "x"]
    kwargs: {full: true}
    queue: reports
    priority: 5
    max_attempts: 1
    timeout: 10m
    tenant: 42
    cron: "30 2 * * *"
    timezone: Europe/Berlin
    catch_up: all
    max_delay: 1h
    overlap: skip
""")
    nightly = config.schedules["nightly"]
    job = nightly.new_job(1_800_000_000.0)
    assert (job.task, job.payload, job.queue, job.priority, job.max_attempts, job.timeout, job.tenant) == \
        ("app.report", {"args": [1, "x"], "kwargs": {"full": True}}, "reports", 5, 1, 600.0, "42")
    assert job.idempotency_key == "schedule:nightly:2027-01-15T08:00:00Z"
    assert (nightly.catch_up.catch_up, nightly.catch_up.max_delay, nightly.catch_up.overlap) == ("all", 3600.0, "skip")
    assert nightly.calendar.timezone == "Europe/Berlin"


@pytest.mark.parametrize("entry,where,words", [
    ("{task: t, cron: '61 * * * *'}", "schedules.s.cron", "out of range"),
    ("{task: t, cron: '* * *'}", "schedules.s.cron", "5 fields"),
    ("{task: t, cron: '0 0 30 2 *'}", "schedules.s.cron", "never matches"),
    ("{task: t, cron: 5}", "schedules.s.cron", "must be a cron expression"),
    ("{task: t}", "schedules.s.cron", "is required"),
    ("{cron: '@hourly'}", "schedules.s.task", "is required"),
    ("{task: '', cron: '@hourly'}", "schedules.s.task", "must be a task name"),
    ("{task: t, cron: '@hourly', timezone: Mars/Olympus}", "schedules.s.timezone", "not a time zone"),
    ("{task: t, cron: '@hourly', catch_up: some}", "schedules.s.catch_up", "'none' or 'latest' or 'all'"),
    ("{task: t, cron: '@hourly', overlap: never}", "schedules.s.overlap", "'allow' or 'skip'"),
    ("{task: t, cron: '@hourly', max_delay: soon}", "schedules.s.max_delay", "not a duration"),
    ("{task: t, cron: '@hourly', args: {a: 1}}", "schedules.s.args", "must be a list"),
    ("{task: t, cron: '@hourly', kwargs: {1: 1}}", "schedules.s.kwargs.1", "keyword argument"),
    ("{task: t, cron: '@hourly', max_attempts: 0}", "schedules.s.max_attempts", "at least 1"),
    ("{task: t, cron: '@hourly', crn: 1}", "schedules.s.crn", "did you mean 'cron'"),
    ("[1]", "schedules.s", "must be a mapping"),
])
def test_a_bad_schedule_is_rejected_naming_its_key_and_why(entry, where, words):
    with pytest.raises(ConfigError) as raised:
        parse_config(f"schedules:\n  s: {entry}\n", "flexiqd.yaml")
    assert str(raised.value).startswith(f"flexiqd.yaml: {where}: ") and words in str(raised.value)


def test_a_bad_schedule_name_is_rejected():
    with pytest.raises(ConfigError, match=r"schedules\.a b: a schedule name may hold only"):
        parse_config("schedules: {'a b': {task: t, cron: '@hourly'}}")


def test_a_worker_reading_the_file_leaves_the_schedules_out():
    config = parse_config("schedules: {s: {task: t, cron: '@hourly'}}", policies=False)
    assert config.schedules == {}


def test_check_config_prints_the_next_five_fire_times_in_utc_and_in_the_zone(tmp_path, capsys):
    path = tmp_path / "flexiqd.yaml"
    path.write_text(f"store: sqlite:///{tmp_path}/q.db\n"
                    "schedules: {nightly: {task: flexiqd.demo.sleep, cron: '30 2 * * *', timezone: America/New_York}}\n")
    assert flexiqd_cli.main(["--check-config", str(path)]) == 0
    out = capsys.readouterr().out
    print(out)
    assert "schedule nightly: flexiqd.demo.sleep to queue default, cron '30 2 * * *' in America/New_York" in out
    fires = [line for line in out.splitlines() if line.startswith("  2")]
    assert len(fires) == 5
    assert all(" UTC  =  " in line and ("EST" in line or "EDT" in line) and "02:30:00" in line for line in fires)


def test_check_config_fails_on_a_bad_schedule_with_one_line(tmp_path, capsys):
    path = tmp_path / "flexiqd.yaml"
    path.write_text(f"store: sqlite:///{tmp_path}/q.db\nschedules: {{s: {{task: t, cron: '99 * * * *'}}}}\n")
    assert flexiqd_cli.main(["--check-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "schedules.s.cron" in err and "Traceback" not in err
