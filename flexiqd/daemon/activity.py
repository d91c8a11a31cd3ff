"""What the tick is doing now, said by each of its steps before it waits on the store or systemd.

Shared by the controller and the collaborators it sequences (observer, recovery); read by
the daemon's loop, on another thread, to report a blocked tick ("tick blocked 42s reading
the queue stats of pool default").  Each change is one reference assignment: thread-safe
to read.
"""

from __future__ import annotations


class Activity:
    """``activity(what)`` says what comes next; ``activity.now`` is it (None: between steps)."""

    def __init__(self) -> None:
        self.now: str | None = None

    def __call__(self, what: str | None) -> None:
        self.now = what
