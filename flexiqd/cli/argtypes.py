"""argparse ``type=`` converters shared by flexiqd's commands: one clear line per bad value."""

from __future__ import annotations

import argparse
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
