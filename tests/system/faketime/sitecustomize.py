"""Loaded (through PYTHONPATH) by the processes the clock-step test runs under libfaketime.

Debian bookworm's libfaketime 0.9.10 with DONT_FAKE_MONOTONIC=1 (the wall clock stepped, the
monotonic clock left alone, as an NTP step leaves it) turns Python 3.11's ``time.sleep`` --
``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`` -- into EINVAL (libfaketime issue 426).
A ``select`` with a relative timeout sleeps the same, in C, and libfaketime passes it through.
"""

import os
import select
import time

if "faketime" in os.environ.get("LD_PRELOAD", ""):
    def _sleep(seconds: float) -> None:
        select.select([], [], [], seconds)

    time.sleep = _sleep
