"""Durations as operators write them: ``30s``, ``5m``, ``1h30m``, ``250ms`` or plain seconds."""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(value: str | int | float) -> float:
    """Seconds in ``value``; raises ValueError with the accepted forms."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"{value!r} is negative")
        return float(value)
    text = str(value).strip().replace(" ", "")
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if seconds < 0:
            raise ValueError(f"{value!r} is negative")
        return seconds
    if not text or _PART.sub("", text) != "":
        raise ValueError(f"{value!r} is not a duration (use e.g. 30s, 5m, 1h30m, 250ms)")
    return sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(text))


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
