"""A cron expression in an IANA time zone, as the UTC instants it fires at.

The expression is matched against *local wall-clock time* (croniter on naive
datetimes: pure calendar arithmetic, no zone), and each matching wall time is
then placed on the UTC time line here, by these rules (docs/schedules.md):

- a wall time that exists once fires at its instant;
- a wall time that does not exist (the gap of a spring-forward change) fires at
  the first instant after the gap -- the change itself; several such wall times
  are one instant, so one slot;
- a wall time that exists twice (the repeated hour of a fall-back change) fires
  once, at its first occurrence -- unless the schedule is *hourly or finer* (its
  hour field is ``*``): then it follows real time and fires at both occurrences,
  so an hourly job runs every real hour through the change.

croniter 1.3.5 (Debian bookworm) gets these wrong when given zone-aware
datetimes: it moves a time in the gap to the same wall time an hour later
(02:30 -> 03:30 EDT, not 03:00), skips the repeated hour of an hourly schedule,
and once past a fall-back change fires a daily 01:30 job at 02:30 the next day.
So it is given naive wall times only, and the zone is applied here with the
standard library's zoneinfo (PEP 495 ``fold``).

Pure: no clock reads, no I/O.  A ``Calendar`` is immutable and thread-safe.
"""

from __future__ import annotations

import heapq
from datetime import datetime, timedelta, timezone
from typing import Iterator
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

UTC = timezone.utc
# The largest change of a zone's UTC offset the walk looks ahead for (Pacific/Apia skipped
# a whole day in 2011): wall times this far before ``now`` may still have an instant after it.
_LOOKAHEAD = timedelta(hours=26)


class CalendarError(ValueError):
    """A cron expression or a time zone that cannot be used; the message says why, ``field``
    which it is ("cron" or "timezone")."""

    def __init__(self, message: str, field: str = "cron") -> None:
        super().__init__(message)
        self.field = field


class Calendar:
    """When a schedule fires: ``cron`` matched in the zone ``timezone``."""

    def __init__(self, cron: str, timezone_name: str) -> None:
        self.cron = cron
        self.timezone = timezone_name
        self.zone = _zone(timezone_name)
        fields = _expand(cron)
        hours = fields[1]
        # Hourly or finer: it fires in every hour, so in the repeated hour it follows real time.
        self.hourly = hours == ["*"] or set(hours) >= set(range(24))
        self.seconds = len(fields) == 6 and fields[5] != [0]
        try:
            next(self.after(0.0))
        except _NeverFires:
            raise CalendarError(f"{cron!r} never matches a date") from None

    def __repr__(self) -> str:
        return f"Calendar({self.cron!r}, {self.timezone!r})"

    def after(self, t: float) -> Iterator[float]:
        """The instants (epoch seconds, ascending, each once) after ``t``; endless."""
        from croniter.croniter import CroniterError, croniter

        start = datetime.fromtimestamp(t, UTC)
        # A wall time before t's may still fire after t: when the offset falls back after t.
        low = min(self._offset(t), self._offset(t + _LOOKAHEAD.total_seconds()))
        first_wall = (start + low).replace(tzinfo=None, microsecond=0) - timedelta(seconds=1)
        walls = croniter(self.cron, first_wall)
        pending: list[float] = []
        last: float | None = None
        while True:
            try:
                wall = walls.get_next(datetime)
            except CroniterError:  # croniter looks a few years ahead at most
                raise _NeverFires() from None
            instants = self.instants(wall)
            for instant in instants:
                if instant > t:
                    heapq.heappush(pending, instant)
            # Every later wall time fires at or after this one's first instant: what is
            # before it is final.
            earliest = instants[0]
            while pending and pending[0] < earliest:
                instant = heapq.heappop(pending)
                if instant != last:
                    last = instant
                    yield instant

    def between(self, start: float, end: float, limit: int) -> list[float]:
        """The instants in (``start``, ``end``], earliest first, at most ``limit`` of them."""
        found: list[float] = []
        if end <= start or limit <= 0:
            return found
        for instant in self.after(start):
            if instant > end:
                break
            found.append(instant)
            if len(found) >= limit:
                break
        return found

    def next_fires(self, t: float, count: int) -> list[float]:
        """The first ``count`` instants after ``t``."""
        fires = []
        for instant in self.after(t):
            fires.append(instant)
            if len(fires) >= count:
                break
        return fires

    def instants(self, wall: datetime) -> list[float]:
        """Where the naive local ``wall`` time fires on the UTC time line, by the rules above."""
        first = wall.replace(tzinfo=self.zone, fold=0).timestamp()
        second = wall.replace(tzinfo=self.zone, fold=1).timestamp()
        if first == second:
            return [first]
        if first < second:  # the repeated hour: fold 0 is the first occurrence
            return [first, second] if self.hourly else [first]
        # The gap: fold 0 read it with the offset before the change (an instant after the
        # gap), fold 1 with the one after (an instant before it).  The change lies between.
        return [self._change_between(second, first)]

    def _change_between(self, before: float, after: float) -> float:
        """The first instant in (``before``, ``after``] with ``after``'s UTC offset (a whole second)."""
        target = self._offset(after)
        low, high = int(before), int(after)
        while high - low > 1:
            middle = (low + high) // 2
            if self._offset(middle) == target:
                high = middle
            else:
                low = middle
        return float(high)

    def _offset(self, instant: float) -> timedelta:
        """The zone's UTC offset at ``instant`` (tzinfo.utcoffset would read a wall time)."""
        return datetime.fromtimestamp(instant, self.zone).utcoffset()

    def local(self, instant: float) -> datetime:
        """``instant`` as an aware datetime in the schedule's zone."""
        return datetime.fromtimestamp(instant, self.zone)


class _NeverFires(Exception):
    pass


def _zone(name: str) -> ZoneInfo:
    if not isinstance(name, str) or not name.strip():
        raise CalendarError("must be an IANA time zone name such as Europe/Berlin or UTC", "timezone")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise CalendarError(f"{name!r} is not a time zone this machine knows (an IANA name such as "
                            f"Europe/Berlin; see timedatectl list-timezones)", "timezone") from None


def _expand(cron: str) -> list[list]:
    from croniter.croniter import CroniterError, croniter

    if not isinstance(cron, str) or not cron.strip():
        raise CalendarError("must be a cron expression such as '0 3 * * *'")
    try:
        fields = croniter.expand(cron)[0]
    except CroniterError as exc:
        raise CalendarError(f"{cron!r} is not a cron expression: {_reason(exc)}") from None
    except (ValueError, TypeError, KeyError, IndexError):
        raise CalendarError(f"{cron!r} is not a cron expression") from None
    return fields


def _reason(exc: Exception) -> str:
    text = str(exc)
    if "columns" in text:
        return "it needs 5 fields (minute hour day month weekday), or 6 with seconds last"
    if "out of range" in text:
        return "a field is out of range (minute 0-59, hour 0-23, day 1-31, month 1-12, weekday 0-6, second 0-59)"
    return text


def parse_calendar(cron: str, timezone_name: str) -> Calendar:
    """A ``Calendar``, or ``CalendarError`` saying what is wrong with ``cron`` or ``timezone_name``."""
    return Calendar(cron, timezone_name)


def show_instant(instant: float, zone: ZoneInfo | None = None) -> str:
    """``2026-03-08 07:00:00 UTC`` or, with a zone, ``2026-03-08 03:00:00 EDT (-04:00)``."""
    if zone is None:
        return datetime.fromtimestamp(instant, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    local = datetime.fromtimestamp(instant, zone)
    offset = local.strftime("%z")
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()} ({offset[:3]}:{offset[3:]})"
