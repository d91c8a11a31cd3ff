"""Operators' intent (pins, drains, pauses) kept across restarts of the daemon.

One JSON file in the daemon's state directory (root-only), replaced atomically
on every change::

    {"version": 1, "pools": {"default": {"pinned": 0, "until": null, "paused": false}}}

``until`` is an absolute time (epoch seconds), so a pin's expiry survives a
restart.  A file that cannot be read is reported in one line and ignored: the
policy decides until an operator steers again.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Mapping

from .overrides import Override

log = logging.getLogger(__name__)

INTENT_FILE = "intent.json"
VERSION = 1
PRIVATE_MODE = 0o600


def overrides_document(overrides: Mapping[str, Override]) -> dict:
    return {"version": VERSION, "pools": {
        name: {"pinned": o.pinned, "until": o.until, "paused": o.paused}
        for name, o in sorted(overrides.items())}}


def overrides_from_document(data: object, now: float) -> dict[str, Override]:
    """The overrides a document holds, without pins that ended before ``now``.  ValueError if malformed."""
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("pools"), dict):
        raise ValueError("not a version 1 intent document")
    overrides = {}
    for name, entry in data["pools"].items():
        if not isinstance(entry, dict):
            raise ValueError(f"pool {name!r}: not an object")
        pinned, until, paused = entry.get("pinned"), entry.get("until"), entry.get("paused", False)
        if pinned is not None and (isinstance(pinned, bool) or not isinstance(pinned, int) or pinned < 0):
            raise ValueError(f"pool {name!r}: pinned must be a count of workers")
        if until is not None and (isinstance(until, bool) or not isinstance(until, (int, float))):
            raise ValueError(f"pool {name!r}: until must be a time")
        if not isinstance(paused, bool):
            raise ValueError(f"pool {name!r}: paused must be true or false")
        override = Override(pinned=pinned, until=until, paused=paused)
        if not override.expired(now) and (override.pinned is not None or override.paused):
            overrides[str(name)] = override
    return overrides


class IntentFile:
    """Where the overrides are kept.  ``path`` None: nowhere (memory only).  Not thread-safe."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def load(self, now: float) -> dict[str, Override]:
        if not self.path:
            return {}
        try:
            with open(self.path, encoding="utf-8") as handle:
                data = json.load(handle)
            return overrides_from_document(data, now)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            log.warning("Ignoring the operators' pins and pauses in %s: cannot read it: %s",
                        self.path, exc.strerror)
        except ValueError as exc:
            log.warning("Ignoring the operators' pins and pauses in %s: it is damaged (%s).", self.path, exc)
        return {}

    def save(self, overrides: Mapping[str, Override]) -> None:
        """Replace the file atomically (mode 0600); a failure is logged, the daemon goes on."""
        if not self.path:
            return
        tmp = f"{self.path}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_MODE)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                os.fchmod(handle.fileno(), PRIVATE_MODE)
                json.dump(overrides_document(overrides), handle)
                handle.write("\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            log.error("Cannot keep the operators' pins and pauses in %s (a restart would forget "
                      "them): %s", self.path, exc.strerror)
