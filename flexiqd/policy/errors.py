"""The policy's one error: a configuration it refuses to run with."""

from __future__ import annotations


class PolicyConfigError(ValueError):
    """A pool policy option is invalid.

    The message always starts with the option's name (dotted for nested
    options, e.g. ``behavior.down_window``) and says why it was refused, so a
    config loader can show it to the user as it is.
    """

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")
        self.field = field
        self.why = why
