"""The history of scale events: bounded in memory, kept across restarts in a JSON-lines file."""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
from typing import Iterator

log = logging.getLogger(__name__)

PRIVATE_MODE = 0o600
EVENTS_FILE = "events.jsonl"  # its name in the daemon's state folder


def _open_private(path: str, append: bool):
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    return os.fdopen(os.open(path, flags, PRIVATE_MODE), "a" if append else "w", encoding="utf-8")


@dataclasses.dataclass(frozen=True)
class ScaleEvent:
    """A change of a pool's desired count (``seq`` increases by one per event, across restarts)."""

    seq: int
    at: float
    pool: str
    previous: int
    desired: int
    reason: str
    rationale: str


class EventLog:
    """The last ``limit`` events.  With a ``path``, events survive a restart of the daemon.

    The file is appended to on every event and rewritten to the last ``limit``
    lines when it grows past twice that, so it stays bounded.  A damaged file
    loses only its unreadable lines.  The file is the daemon's alone (mode 0600).
    Not thread-safe.
    """

    def __init__(self, path: str | None = None, limit: int = 1000) -> None:
        self.path = path
        self.limit = limit
        self._events: collections.deque[ScaleEvent] = collections.deque(maxlen=limit)
        self._lines_in_file = 0
        if path:
            self._load()

    def _load(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as handle:
                lines = handle.readlines()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("Cannot read the event history %s: %s", self.path, exc.strerror)
            return
        self._lines_in_file = len(lines)
        try:
            os.chmod(self.path, PRIVATE_MODE)  # one an older version left group-writable
        except OSError:
            pass
        for number, line in enumerate(lines, 1):
            try:
                self._events.append(ScaleEvent(**json.loads(line)))
            except (ValueError, TypeError):
                log.warning("Skipping unreadable line %d of %s.", number, self.path)

    @property
    def next_seq(self) -> int:
        return self._events[-1].seq + 1 if self._events else 1

    def record(self, at: float, pool: str, previous: int, desired: int, reason: str,
               rationale: str) -> ScaleEvent:
        event = ScaleEvent(self.next_seq, at, pool, previous, desired, reason, rationale)
        self._events.append(event)
        if self.path:
            self._persist(event)
        return event

    def _persist(self, event: ScaleEvent) -> None:
        try:
            if self._lines_in_file >= 2 * self.limit:
                temporary = f"{self.path}.tmp"
                with _open_private(temporary, append=False) as handle:
                    handle.writelines(json.dumps(dataclasses.asdict(e)) + "\n" for e in self._events)
                os.replace(temporary, self.path)
                self._lines_in_file = len(self._events)
            else:
                with _open_private(self.path, append=True) as handle:
                    handle.write(json.dumps(dataclasses.asdict(event)) + "\n")
                self._lines_in_file += 1
        except OSError as exc:
            log.warning("Cannot write the event history %s: %s", self.path, exc.strerror)

    def since(self, seq: int = 0) -> list[ScaleEvent]:
        """Events with a sequence number above ``seq`` (0: all that are kept), oldest first."""
        return [event for event in self._events if event.seq > seq]

    def __iter__(self) -> Iterator[ScaleEvent]:
        return iter(self._events)

    def __len__(self) -> int:
        return len(self._events)

    def __getitem__(self, index: int) -> ScaleEvent:
        return self._events[index]
