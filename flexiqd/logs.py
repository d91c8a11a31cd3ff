"""Logging set-up for flexiqd's entry points: the journal with fields under systemd, else stderr.

When stderr is the journal's own stream (``$JOURNAL_STREAM`` names its
device:inode, as systemd sets it for a service), records go straight to
journald over its native protocol, each with its priority and, for the events
an operator looks for, a stable ``MESSAGE_ID`` and fields (``POOL=``,
``FROM=``, ``TO=``, ...) so that ``journalctl POOL=default`` works.  Anywhere
else (a terminal, a pipe, a test) lines go to stderr with a timestamp and the
level name, fields left out.  A record goes one way only: should journald's
socket refuse it, that record is written to stderr with a syslog priority
prefix (``<4>``) instead, never both.

Call sites stay one line: ``log.info("...", ..., extra=journal(MessageId.X, POOL=name))``.
The ids are listed in docs/journal.md.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import struct
import sys
from typing import Mapping, TextIO

JOURNAL_SOCKET = "/run/systemd/journal/socket"
LINE_FORMAT = "%(name)s: %(message)s"

# syslog(3) priorities, as journald keeps them.
_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
             logging.CRITICAL: 2}

# journald's rule for field names a client may set: no leading "_" (trusted fields), no digit first.
_FIELD_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
# Fields the handler sets from the record itself.
_RECORD_FIELDS = frozenset({"MESSAGE", "PRIORITY", "SYSLOG_IDENTIFIER", "CODE_FILE", "CODE_LINE",
                            "CODE_FUNC", "LOGGER", "THREAD_NAME"})


class MessageId:
    """One fixed 128-bit id per kind of event (as systemd's catalog ids: 32 lowercase hex digits).

    Stable across releases: operators filter on them (``journalctl MESSAGE_ID=...``).
    """

    SCALE_DECISION = "74eae66d6ebe43a29d8b3052c8dc26fe"      # a pool's worker count changes
    DEAD_WORKER_JOBS_RELEASED = "5e8f8031b7434e3195bf633c51b2454f"  # a gone worker's jobs run again
    EXPIRED_LEASES_RECOVERED = "fee62932fdf146d1a85c6a285ba3c719"   # leases that ran out, swept
    RELOAD_REFUSED = "25d1ca27f7cb4e619299ec2073e3b746"      # the previous config stays in force
    RELOADED = "d4fc68f10c2d4d8192e11d36c3d11030"            # a new config is in force
    BINDING_CAP_CHANGED = "0b64b11c6a8f4059a8dc5921b9fff617"  # another cap (or none) limits a pool
    OPERATOR_OVERRIDE = "b25791d39b9b4d9fb95c73256481da70"   # pin, unpin, drain, pause, resume
    WORKER_STARTING = "14378b93acea44b6a2aab1f9206dc854"     # flexiqd starts a worker unit
    WORKER_STOPPING = "a61daac65db948c1aedd5888bdfb7479"     # flexiqd stops one (it drains)
    SCHEDULE_FIRED = "0cd086efd4d148f7841dc944e3518987"      # a schedule's slot enqueued its job
    SCHEDULE_SKIPPED = "468134bd312f4c41b47d87b339c818b0"    # a slot (or a run of missed ones) skipped
    STORE_NOT_WRITABLE = "a4db2ae382bb4a26a7204a0a3ecd55f6"  # the SQLite store's disk is full or read-only
    POOL_CRASH_LOOP = "4e0173177ebd43e8816bcbaa72b7cbcf"     # a pool's workers keep failing: starts back off
    APP_PROBLEM = "d0c6a3e4b7e14f0c9a51c2f8e36b7d42"         # a pool's app would not run in its workers
    STORE_DAMAGED = "28cf40d5a02245e1ad3c3518b13dd467"       # the SQLite store is damaged: refused, restore it
    POOL_RESTART = "57e0f5819daa490a9b9a1e43c9667f0d"        # a pool's restart is requested, done or failed
    STORE_OLDER = "c440b825c0c94062a5675263795abd1c"         # the SQLite store lacks commits flexiqd saw: lost, or restored


def journal(message_id: str, **fields: object) -> dict:
    """``extra=`` for a log call: the record's ``MESSAGE_ID`` and fields (None values left out).

    Raises ValueError for a name journald would drop, or one the handler sets itself,
    so a mistake shows in the unit tests rather than as a missing field.
    """
    if not re.fullmatch(r"[0-9a-f]{32}", message_id):
        raise ValueError(f"MESSAGE_ID must be 32 lowercase hex digits, got {message_id!r}")
    for name in fields:
        if not _FIELD_NAME.fullmatch(name) or name in _RECORD_FIELDS or name == "MESSAGE_ID":
            raise ValueError(f"{name!r} is not a journal field a log call may set")
    return {"journal": {"MESSAGE_ID": message_id,
                        **{name: str(value) for name, value in fields.items() if value is not None}}}


def record_fields(record: logging.LogRecord, message: str, identifier: str) -> list[tuple[str, str]]:
    """Every journal field of one record: the formatted ``message``, its priority and origin,
    and the fields its call site gave (``extra=journal(...)``)."""
    origin = [("SYSLOG_IDENTIFIER", identifier), ("LOGGER", record.name), ("CODE_FILE", record.pathname),
              ("CODE_LINE", record.lineno), ("CODE_FUNC", record.funcName), ("THREAD_NAME", record.threadName)]
    fields = [("MESSAGE", message), ("PRIORITY", str(_PRIORITY.get(record.levelno, 6)))]
    fields += [(name, str(value)) for name, value in origin if value is not None]  # a record made by hand lacks some
    fields += getattr(record, "journal", {}).items()
    return fields


def encode(fields: list[tuple[str, str]]) -> bytes:
    """journald's native datagram: ``NAME=value\\n``, or for a value with a newline
    ``NAME\\n`` + its length (64-bit little-endian) + value + ``\\n``."""
    parts = []
    for name, value in fields:
        data = value.encode("utf-8", "replace")
        if b"\n" in data:
            parts.append(name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n")
        else:
            parts.append(name.encode() + b"=" + data + b"\n")
    return b"".join(parts)


def stream_is_journal(journal_stream: str | None, stream: TextIO) -> bool:
    """True when ``stream`` is the connection systemd made to journald (``$JOURNAL_STREAM``
    is ``device:inode`` of it).  A child that inherited the variable but writes to a
    terminal or a pipe sees a different file and keeps plain lines."""
    if not journal_stream:
        return False
    try:
        device, inode = (int(part) for part in journal_stream.split(":"))
        info = os.fstat(stream.fileno())
    except (ValueError, OSError):
        return False
    return (info.st_dev, info.st_ino) == (device, inode)


class PriorityPrefixFormatter(logging.Formatter):
    """``<6>name: message``: journald reads the prefix of a stream line as the priority."""

    def format(self, record: logging.LogRecord) -> str:
        priority = _PRIORITY.get(record.levelno, 6)
        return f"<{priority}>{super().format(record)}"


class JournalHandler(logging.Handler):
    """Sends each record to journald with its fields.  Thread-safe (one datagram per record).

    A record journald does not take (no socket, or too large a datagram) goes to
    ``fallback`` instead, so it is never lost and never written twice.
    """

    def __init__(self, identifier: str, fallback: logging.Handler, path: str = JOURNAL_SOCKET) -> None:
        super().__init__()
        self.identifier = identifier
        self.fallback = fallback
        self.path = path
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            datagram = encode(record_fields(record, self.format(record), self.identifier))
            self._socket.sendto(datagram, self.path)
        except OSError:
            self.fallback.handle(record)
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        self._socket.close()
        self.fallback.close()
        super().close()


def make_handler(environ: Mapping[str, str], stream: TextIO, identifier: str,
                 socket_path: str = JOURNAL_SOCKET) -> logging.Handler:
    """The one handler for this process: the journal when ``stream`` is the journal's, else ``stream``."""
    plain = logging.StreamHandler(stream)
    if not stream_is_journal(environ.get("JOURNAL_STREAM"), stream):
        plain.setFormatter(logging.Formatter("%(asctime)s %(levelname)s " + LINE_FORMAT))
        return plain
    plain.setFormatter(PriorityPrefixFormatter(LINE_FORMAT))
    handler = JournalHandler(identifier, plain, socket_path)
    handler.setFormatter(logging.Formatter(LINE_FORMAT))  # the same MESSAGE= as the stream lines had
    return handler


def setup_logging(level: str | int = "INFO") -> None:
    identifier = os.path.basename(sys.argv[0]) or "flexiqd"
    root = logging.getLogger()
    for old in root.handlers:
        if isinstance(old, JournalHandler):
            old.close()  # its socket; a stream handler leaves its stream open anyway
    root.handlers[:] = [make_handler(os.environ, sys.stderr, identifier)]
    root.setLevel(level)
