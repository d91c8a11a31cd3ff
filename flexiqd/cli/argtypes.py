"""argparse ``type=`` converters shared by flexiqd's commands: one clear line per bad value."""

from __future__ import annotations

import argparse
import math
from typing import Callable

from ..durations import parse_duration


def whole_number(minimum: int | None = None, maximum: int | None = None,
                 what: str | None = None) -> Callable[[str], int]:
    """A converter to int within [minimum, maximum]; ``what`` names the range in errors."""
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            bound = what or (f"at least {minimum}" if maximum is None else f"between {minimum} and {maximum}")
            raise argparse.ArgumentTypeError(f"{value} is not {bound}")
        return value
    return convert


def number(*, positive: bool = False, finite: bool = True, unit: str = "") -> Callable[[str], float]:
    """A converter to a float, 0 or more (more than 0 with ``positive``; ``inf`` allowed unless
    ``finite``); ``unit`` names it in errors."""
    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number{unit and ' of ' + unit}: {text!r}") from None
        if math.isnan(value) or (finite and math.isinf(value)) or value < 0 or (positive and value == 0):
            bound = "a number above 0" if positive else f"0 or more{unit and ' ' + unit}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value
    return convert


def duration(*, positive: bool = False) -> Callable[[str], float]:
    """A converter from ``30s``/``5m``/``250ms`` to seconds (more than 0 with ``positive``)."""
    def convert(text: str) -> float:
        try:
            seconds = parse_duration(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if positive and seconds <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not longer than 0s")
        return seconds
    return convert
