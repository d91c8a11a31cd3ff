"""The store's clock: the one time every process sharing a store reads its ``now`` from.

Leases, heartbeats, delayed jobs' run-ats, retry backoffs and dependency shares are
times written by one process and judged by another.  They are kept in the store's
clock, never in each machine's wall clock, which NTP (or an operator) may step by
minutes, forward or back:

- **PostgreSQL** (``ServerClock``): the database server's clock.  Each process
  measures the server's time once per connection and every ``SERVER_CLOCK_REFRESH``
  seconds (halfway through the round trip), and counts from it with the kernel's
  ``CLOCK_BOOTTIME``, which a step of the wall clock does not move.  A host whose
  wall clock is off by minutes still writes and judges leases and beats within a few
  milliseconds of every other host.
- **SQLite** (``AnchoredClock``): one machine, so one clock -- the wall clock as it
  read when the first process opened the store after the machine booted (its
  *anchor*, kept in the store), advanced by ``CLOCK_BOOTTIME`` since.  Every process
  of that boot reads the same anchor, so they agree, and a step of the wall clock
  moves nothing in the queue: no lease expires and no delayed job comes due sooner
  or later than the seconds it was given.  The price: the queue's times differ from
  the wall clock by the steps since boot, until the next boot anchors again.

Pure decisions (``anchor_for_boot``, ``offset_from``) apart from the clock reads,
which are arguments.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable

# How often a process measures the server's clock again (seconds of CLOCK_BOOTTIME): the
# local count drifts from the server by parts per million between measurements, and a step
# of the server's own clock reaches every process within this.
SERVER_CLOCK_REFRESH = 10.0
# A measurement this far from the last one's count is a step of the server's clock.
SERVER_STEP = 0.5
# After a step of the server's clock, how long the processes that have not measured it yet
# may still write leases and beats in the time before it: no host is found dead meanwhile.
SERVER_STEP_SETTLE = 3 * SERVER_CLOCK_REFRESH
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def elapsed() -> float:
    """Seconds since boot, suspend included; no step of the wall clock moves it."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def boot_id(path: str = BOOT_ID_PATH) -> str:
    """This boot's id (a new one at each boot); "" where the kernel does not say."""
    try:
        with open(path, encoding="ascii") as file:
            return file.read().strip()
    except OSError:
        return ""


@dataclasses.dataclass(frozen=True)
class Anchor:
    """The store's clock read ``at`` when ``elapsed()`` read ``since``, in boot ``boot``."""

    boot: str
    at: float
    since: float


def anchor_for_boot(stored: Anchor | None, boot: str, wall: float, since: float) -> Anchor:
    """The anchor to count from: the stored one if it is this boot's, else a new one at the wall
    clock now (``wall``, ``since``).  A new boot's anchor is never behind the old one's time as
    last known (``stored.at``): the queue's clock does not go back across a reboot either.

    A process that cannot read the boot's id (``boot`` ""; a sandboxed worker unit sees no
    /proc/sys) takes the stored anchor unless it cannot be this boot's (CLOCK_BOOTTIME is
    below it): the daemon, which can tell, opens the store before it starts any worker.
    Only an anchor with a boot id is worth storing (``worth_storing``)."""
    if stored is not None and (stored.boot == boot if boot else stored.since <= since):
        return stored
    at = wall if stored is None else max(wall, stored.at)
    return Anchor(boot, at, since)


def worth_storing(anchor: Anchor, stored: Anchor | None) -> bool:
    """Whether a process should store ``anchor`` in place of ``stored``: a new one it can tell the boot of."""
    return bool(anchor.boot) and anchor != stored


class AnchoredClock:
    """The store's time: an anchor advanced by ``elapsed``.  Thread-safe."""

    def __init__(self, anchor: Anchor, *, elapsed: Callable[[], float] = elapsed) -> None:
        self.anchor = anchor
        self._elapsed = elapsed

    def __call__(self) -> float:
        return self.anchor.at + (self._elapsed() - self.anchor.since)


def offset_from(server_time: float, sent: float, received: float) -> float:
    """The server's time minus ``elapsed()``, from one reading the server answered between
    ``sent`` and ``received`` (elapsed seconds): its error is at most half the round trip."""
    return server_time - (sent + received) / 2.0


class ServerClock:
    """The database server's time, estimated locally from its last measurement.  Thread-safe.

    Until a first measurement (``measured``), it reads the wall clock.
    """

    def __init__(self, *, elapsed: Callable[[], float] = elapsed, wall: Callable[[], float] = time.time,
                 refresh: float = SERVER_CLOCK_REFRESH) -> None:
        self._elapsed = elapsed
        self._wall = wall
        self._refresh = refresh
        self._lock = threading.Lock()
        self._offset: float | None = None
        self._measured_at = float("-inf")
        self._stepped_at = float("-inf")
        self._error = 0.0
        #: The server's clock's last step as measured here (seconds, + forward), or None.
        self.last_step: float | None = None

    @property
    def measured(self) -> bool:
        return self._offset is not None

    def due(self) -> bool:
        """Whether the server's clock should be measured again (never measured, or long ago)."""
        return self._elapsed() - self._measured_at >= self._refresh

    def measure(self, read_server: Callable[[], float]) -> None:
        """Measure with ``read_server`` (one round trip returning the server's epoch seconds)."""
        sent = self._elapsed()
        server_time = read_server()
        received = self._elapsed()
        offset = offset_from(server_time, sent, received)
        with self._lock:
            if self._offset is not None and abs(offset - self._offset) > SERVER_STEP + (received - sent):
                self._stepped_at, self.last_step = received, offset - self._offset
            self._offset = offset
            self._error = (received - sent) / 2.0
            self._measured_at = received

    def error(self) -> float:
        """How far this estimate may be from the server's time: half the round trip of the
        measurement it counts from (0 until one)."""
        with self._lock:
            return self._error

    def steady(self) -> bool:
        """False for ``SERVER_STEP_SETTLE`` after this process measured a step of the server's
        clock: other processes may still be writing in the time before it."""
        return self._elapsed() - self._stepped_at >= SERVER_STEP_SETTLE

    def __call__(self) -> float:
        with self._lock:
            offset = self._offset
        return self._wall() if offset is None else self._elapsed() + offset
