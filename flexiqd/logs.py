"""Logging set-up for flexiqd's entry points: stderr, which journald captures.

Under systemd (``$JOURNAL_STREAM`` set) each line starts with a syslog priority
prefix such as ``<4>`` so the journal keeps the level; elsewhere lines carry a
timestamp and the level name instead.
"""

from __future__ import annotations

import logging
import os
import sys

_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
             logging.CRITICAL: 2}


class JournalPrefixFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        priority = _PRIORITY.get(record.levelno, 6)
        return f"<{priority}>{super().format(record)}"


def setup_logging(level: str | int = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM"):
        handler.setFormatter(JournalPrefixFormatter("%(name)s: %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
