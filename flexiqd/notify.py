"""sd_notify for flexiqd's processes (the daemon and every worker).

A thin layer over ``sdnotify``: silent when the process was not started by
systemd (no ``$NOTIFY_SOCKET``), so the same code runs on a laptop.  Create it
in the process that notifies: sdnotify connects once, when constructed.
"""

from __future__ import annotations

import os
import time

import sdnotify


class Notifier:
    """Sends READY/STATUS/STOPPING/RELOADING/WATCHDOG/EXTEND_TIMEOUT_USEC."""

    def __init__(self) -> None:
        self.enabled = bool(os.environ.get("NOTIFY_SOCKET"))
        self._notifier = sdnotify.SystemdNotifier() if self.enabled else None

    def send(self, *fields: str) -> None:
        if self._notifier is not None:
            self._notifier.notify("\n".join(fields))

    def ready(self, status: str | None = None) -> None:
        self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> None:
        self.send(f"STATUS={text}")

    def stopping(self, status: str | None = None) -> None:
        self.send("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def reloading(self) -> None:
        # systemd >= 253 wants MONOTONIC_USEC with RELOADING=1; older ones ignore it.
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")

    def extend_timeout(self, seconds: float) -> None:
        """Ask for ``seconds`` more before the current (stop) timeout fires."""
        self.send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")


def watchdog_interval() -> float | None:
    """How often to send WATCHDOG=1 (half the unit's WatchdogSec), or None when not asked."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2_000_000
    except ValueError:
        return None
