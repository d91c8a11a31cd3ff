"""Checks shared by every policy option: each raises ``PolicyConfigError`` naming the option."""

from __future__ import annotations

import math

from .errors import PolicyConfigError


def require_int(field: str, value: object, *, minimum: int | None = None) -> int:
    """``value`` as an int; booleans and floats (even 3.0) are refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyConfigError(field, f"must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise PolicyConfigError(field, f"must be >= {minimum}, got {value}")
    return value


def require_number(
    field: str,
    value: object,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a finite float inside the given bounds (closed unless ``*_open``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PolicyConfigError(field, f"must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise PolicyConfigError(field, f"must be finite, got {value!r}")
    too_low = low is not None and (number <= low if low_open else number < low)
    too_high = high is not None and (number >= high if high_open else number > high)
    if too_low or too_high:
        raise PolicyConfigError(field, f"must be in {_interval(low, high, low_open, high_open)}, got {value!r}")
    return number


def require_bool(field: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise PolicyConfigError(field, f"must be true or false, got {value!r}")
    return value


def _interval(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    left = "(" if low_open or low is None else "["
    right = ")" if high_open or high is None else "]"
    return f"{left}{'-inf' if low is None else _fmt(low)}, {'inf' if high is None else _fmt(high)}{right}"


def _fmt(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)
