"""A schedule's calendar across DST changes: the rules of docs/schedules.md, in a matrix of zones.

For each zone, every UTC-offset change of 2026 is found from the zone data itself, and
around each the fire times are compared with an oracle that walks real time minute by
minute.  ``pytest -s`` prints each zone's fire times around its changes.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from flexiqd.schedules.calendar import Calendar, CalendarError, show_instant

UTC = timezone.utc
ZONES = ["America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Pacific/Chatham", "Antarctica/Troll"]
WINDOW = 6 * 3600  # seconds either side of a change looked at


def offset(zone, instant: float) -> timedelta:
    return datetime.fromtimestamp(instant, zone).utcoffset()


def changes(zone, year: int = 2026) -> list[tuple[float, timedelta, timedelta]]:
    """(instant, offset before, offset after) of every change of the zone's UTC offset in ``year``."""
    found = []
    t = datetime(year, 1, 1, tzinfo=UTC).timestamp()
    end = datetime(year + 1, 1, 1, tzinfo=UTC).timestamp()
    step = 900
    while t < end:
        if offset(zone, t) != offset(zone, t + step):
            low, high = int(t), int(t + step)
            while high - low > 1:
                middle = (low + high) // 2
                low, high = (middle, high) if offset(zone, middle) == offset(zone, t) else (low, middle)
            found.append((float(high), offset(zone, t), offset(zone, high)))
        t += step
    return found


def wall(zone, instant: float) -> datetime:
    return datetime.fromtimestamp(instant, zone).replace(tzinfo=None)


def show(calendar: Calendar, fires: list[float]) -> str:
    return "\n".join(f"    {show_instant(i)}  =  {show_instant(i, calendar.zone)}" for i in fires)


@pytest.fixture(params=ZONES)
def zone_changes(request):
    calendar = Calendar("* * * * *", request.param)
    found = changes(calendar.zone)
    assert len(found) == 2, f"{request.param}: expected a spring and a fall change in 2026, found {found}"
    return request.param, found


@pytest.mark.parametrize("cron", ["*/15 * * * *", "0 * * * *", "30 * * * *", "45 * * * *"])
def test_an_hourly_or_finer_schedule_follows_real_time_through_every_change(zone_changes, cron):
    name, found = zone_changes
    calendar = Calendar(cron, name)
    assert calendar.hourly
    for change, before, after in found:
        start, end = change - WINDOW, change + WINDOW
        fires = calendar.between(start, end, 10_000)
        # The oracle: every real minute whose wall time matches fires; a change that skips
        # matching wall times (the gap) fires once at the change itself.
        minute = int(cron.split()[0]) if cron.split()[0].isdigit() else None
        expected = set()
        for t in range(int(start) - int(start) % 60 + 60, int(end) + 1, 60):
            local = wall(calendar.zone, t)
            if (local.minute == minute) if minute is not None else local.minute % 15 == 0:
                expected.add(float(t))
        if after > before:  # spring: the wall times of the gap
            gap_start = wall(calendar.zone, change - 1) + timedelta(seconds=1)
            gap = [gap_start + timedelta(minutes=m) for m in range(int((after - before).total_seconds() // 60))]
            if any((w.minute == minute) if minute is not None else w.minute % 15 == 0 for w in gap):
                expected.add(change)
        print(f"\n{name} {cron!r} around the change at {show_instant(change)} ({before} -> {after}):\n"
              + show(calendar, [f for f in fires if abs(f - change) <= 3 * 3600]))
        assert fires == sorted(expected), name
        assert len(set(fires)) == len(fires)


def test_a_daily_time_in_the_gap_fires_at_the_first_instant_after_it(zone_changes):
    name, found = zone_changes
    [(change, before, after)] = [c for c in found if c[2] > c[1]]
    gap_middle = wall(Calendar("* * * * *", name).zone, change - 1) + timedelta(seconds=1) + (after - before) / 2
    calendar = Calendar(f"{gap_middle.minute} {gap_middle.hour} * * *", name)
    assert not calendar.hourly
    fires = calendar.between(change - 86400, change + 86400, 10)
    print(f"\n{name} daily {gap_middle:%H:%M} (in the gap of {show_instant(change)}):\n" + show(calendar, fires))
    assert change in fires
    # One fire a day: the days before and after at their own wall time.
    assert len(fires) == 3 and fires[1] == change
    assert [wall(calendar.zone, f).time() for f in (fires[0], fires[2])] == [gap_middle.time()] * 2


def test_a_daily_time_in_the_repeated_hour_fires_once_at_its_first_occurrence(zone_changes):
    name, found = zone_changes
    [(change, before, after)] = [c for c in found if c[2] < c[1]]
    zone = Calendar("* * * * *", name).zone
    shift = before - after
    repeat_middle = wall(zone, change) + shift / 2   # inside the repeated wall-clock span
    calendar = Calendar(f"{repeat_middle.minute} {repeat_middle.hour} * * *", name)
    first = repeat_middle.replace(tzinfo=zone, fold=0).timestamp()
    second = repeat_middle.replace(tzinfo=zone, fold=1).timestamp()
    assert first < change <= second, "the wall time chosen is not repeated"
    fires = calendar.between(change - 2 * 86400, change + 2 * 86400, 10)
    print(f"\n{name} daily {repeat_middle:%H:%M} (repeated at the change of {show_instant(change)}):\n"
          + show(calendar, fires))
    assert first in fires and second not in fires
    assert [wall(zone, f).time() for f in fires] == [repeat_middle.time()] * len(fires)
    days = [wall(zone, f).date() for f in fires]
    assert len(days) >= 3 and all((b - a).days == 1 for a, b in zip(days, days[1:])), "not once a day"


def test_croniter_alone_gets_dst_wrong_where_the_calendar_corrects_it():
    """Why the calendar places wall times itself: croniter 1.3.5 with zone-aware datetimes."""
    from croniter import croniter
    from zoneinfo import ZoneInfo

    ny = ZoneInfo("America/New_York")
    spring = croniter("30 2 * * *", datetime(2026, 3, 7, 12, tzinfo=ny)).get_next(datetime)
    ours = Calendar("30 2 * * *", "America/New_York").next_fires(datetime(2026, 3, 7, 12, tzinfo=ny).timestamp(), 1)
    print(f"\nspring, daily 02:30 New York: croniter {spring.astimezone(UTC)}, flexiqd {show_instant(ours[0])}")
    assert ours == [datetime(2026, 3, 8, 7, 0, tzinfo=UTC).timestamp()]   # 03:00 EDT, the end of the gap
    hourly = croniter("0 * * * *", datetime(2026, 11, 1, 0, 30, tzinfo=ny))
    theirs = [hourly.get_next(datetime).astimezone(UTC) for _ in range(3)]
    ours = Calendar("0 * * * *", "America/New_York").next_fires(datetime(2026, 11, 1, 0, 30, tzinfo=ny).timestamp(), 3)
    print(f"fall, hourly New York: croniter {[f'{t:%H:%M}Z' for t in theirs]}, "
          f"flexiqd {[show_instant(t) for t in ours]}")
    assert [t - ours[0] for t in ours] == [0, 3600, 7200]   # every real hour, the repeated one too


def test_a_seconds_field_gives_a_fast_schedule():
    calendar = Calendar("* * * * * */2", "UTC")
    assert calendar.between(1000.0, 1010.0, 100) == [1002.0, 1004.0, 1006.0, 1008.0, 1010.0]


@pytest.mark.parametrize("cron,zone,field,words", [
    ("61 * * * *", "UTC", "cron", "out of range"),
    ("* * *", "UTC", "cron", "5 fields"),
    ("0 0 30 2 *", "UTC", "cron", "never matches"),
    ("", "UTC", "cron", "cron expression"),
    ("0 * * * *", "Mars/Olympus", "timezone", "not a time zone"),
    ("0 * * * *", "../../etc/passwd", "timezone", "not a time zone"),
])
def test_a_bad_calendar_says_which_field_and_why(cron, zone, field, words):
    with pytest.raises(CalendarError) as raised:
        Calendar(cron, zone)
    assert raised.value.field == field and words in str(raised.value)
