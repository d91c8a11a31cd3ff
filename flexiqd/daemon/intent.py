"""Operators' intent (pins, drains, pauses) and the pools' decision histories, kept across restarts.

One JSON file in the daemon's state directory (root-only), replaced atomically
on every change::

    {"version": 1, "pools": {"default": {"pinned": 0, "until": null, "paused": false}}}

``until`` is an absolute time (epoch seconds), so a pin's expiry survives a
restart.  A file that cannot be read is reported in one line and ignored: the
policy decides until an operator steers again.

Next to it, ``history.json`` keeps each pool's decision ``History`` (the
policy's ``history_to_dict``) and its measured start costs, so a restart
forgets neither a rate limit's budget nor a window::

    {"version": 1, "saved_at": 1764560000.0, "pools": {"default": {...}},
     "start_costs": {"default": [[0.62, 0.41], ...]}}

(``policy: flexiq`` pools keep their windows in the same ``History``.)

An unreadable one costs what a first start costs: the policy begins afresh.

And ``samples.json`` keeps the last hour of every pool's samples (``samples.Samples``),
the charts of the Cockpit page and of the D-Bus API's ``History``.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Mapping

from ..policy import History
from ..policy.history import history_from_dict, history_to_dict
from ..runtime_files import write_atomically
from .overrides import Override

log = logging.getLogger(__name__)

INTENT_FILE = "intent.json"
HISTORY_FILE = "history.json"
SAMPLES_FILE = "samples.json"
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
        if self.path and not write_private_json(self.path, overrides_document(overrides)):
            log.error("Cannot keep the operators' pins and pauses in %s (a restart would forget "
                      "them).", self.path)


def write_private_json(path: str, document: Any) -> bool:
    """Replace ``path`` atomically with ``document`` as JSON, mode 0600; False (logged) on failure."""
    try:
        write_atomically(path, json.dumps(document) + "\n", PRIVATE_MODE)
        return True
    except OSError as exc:
        log.error("Cannot write %s: %s", path, exc.strerror)
        return False


def histories_document(histories: Mapping[str, History], start_costs: Mapping[str, Any], now: float) -> dict:
    return {"version": VERSION, "saved_at": now,
            "pools": {name: history_to_dict(h) for name, h in sorted(histories.items())},
            "start_costs": dict(start_costs)}


class HistoryFile:
    """Where the pools' histories and start costs are kept.  ``path`` None: nowhere."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def load(self) -> tuple[dict[str, History], dict]:
        """(histories by pool, start-cost samples, flexiq pools' windows) a previous daemon kept;
        empty when none."""
        if not self.path:
            return {}, {}
        try:
            with open(self.path, encoding="utf-8") as handle:
                data = json.load(handle)
        except FileNotFoundError:
            return {}, {}
        except OSError as exc:
            log.warning("Starting every pool's history afresh: cannot read %s: %s", self.path, exc.strerror)
            return {}, {}
        except ValueError as exc:
            log.warning("Starting every pool's history afresh: %s is damaged (%s).", self.path, exc)
            return {}, {}
        if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("pools"), dict):
            log.warning("Starting every pool's history afresh: %s is not a version %d history file.",
                        self.path, VERSION)
            return {}, {}
        histories = {str(name): history_from_dict(entry) for name, entry in data["pools"].items()}
        costs = data.get("start_costs")
        return histories, costs if isinstance(costs, dict) else {}

    def save(self, histories: Mapping[str, History], start_costs: Mapping[str, Any], now: float) -> None:
        if self.path:
            write_private_json(self.path, histories_document(histories, start_costs, now))


class SamplesFile:
    """Where the pools' samples are kept.  ``path`` None: nowhere."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def load(self) -> Any:
        """The document a previous daemon kept (``Samples.from_document`` checks it); None when none."""
        if not self.path:
            return None
        try:
            with open(self.path, encoding="utf-8") as handle:
                return json.load(handle)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("Starting the pools' charts afresh: cannot read %s: %s", self.path,
                        getattr(exc, "strerror", None) or exc)
            return None

    def save(self, document: Any) -> None:
        if self.path:
            write_private_json(self.path, document)
