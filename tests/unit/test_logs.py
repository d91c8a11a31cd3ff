"""flexiqd.logs: journal fields, journald's native datagram, and the choice of stderr or the journal."""

from __future__ import annotations

import io
import logging
import os
import re
import socket
import struct
from pathlib import Path

import pytest

from flexiqd.logs import (JournalHandler, MessageId, encode, journal, make_handler, record_fields,
                          stream_is_journal)


def decode(datagram: bytes) -> dict[str, str]:
    """journald's native protocol read back (the reader side, written from its documentation)."""
    fields, rest = {}, datagram
    while rest:
        line, sep, after = rest.partition(b"\n")
        assert sep, f"unterminated field in {datagram!r}"
        if b"=" in line:
            name, _, value = line.partition(b"=")
            rest = after
        else:
            name = line
            (size,) = struct.unpack("<Q", after[:8])
            value, rest = after[8:8 + size], after[8 + size:]
            assert rest[:1] == b"\n"
            rest = rest[1:]
        assert name.decode() not in fields, f"field {name!r} sent twice"
        fields[name.decode()] = value.decode()
    return fields


def a_record(message: str = "Pool %s: hello", *args, level=logging.WARNING, extra=None) -> logging.LogRecord:
    logger = logging.getLogger("flexiqd.daemon.controller")
    record = logger.makeRecord(logger.name, level, "/src/controller.py", 42, message, args or ("default",),
                               None, func="tick", extra=extra)
    return record


def test_every_message_id_is_a_distinct_128_bit_id_in_lowercase_hex():
    ids = {name: value for name, value in vars(MessageId).items() if name.isupper()}
    assert len(ids) >= 5
    assert all(re.fullmatch(r"[0-9a-f]{32}", value) for value in ids.values()), ids
    assert len(set(ids.values())) == len(ids)


def test_docs_list_every_message_id_and_only_those():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "journal.md").read_text()
    ids = {value for name, value in vars(MessageId).items() if name.isupper()}
    assert set(re.findall(r"`([0-9a-f]{32})`", doc)) == ids


def test_journal_extra_carries_the_id_and_the_fields_as_text_leaving_out_none():
    extra = journal(MessageId.SCALE_DECISION, POOL="default", FROM=1, TO=4, CAP=None)
    assert extra == {"journal": {"MESSAGE_ID": MessageId.SCALE_DECISION, "POOL": "default", "FROM": "1",
                                 "TO": "4"}}


@pytest.mark.parametrize("name", ["pool", "_PID", "1POOL", "MESSAGE", "PRIORITY", "MESSAGE_ID", "A-B",
                                  "X" * 65])
def test_a_field_name_journald_would_drop_or_the_handler_sets_is_refused(name):
    with pytest.raises(ValueError, match="not a journal field"):
        journal(MessageId.SCALE_DECISION, **{name: "x"})


def test_a_message_id_that_is_not_32_lowercase_hex_digits_is_refused():
    with pytest.raises(ValueError, match="32 lowercase hex"):
        journal(MessageId.SCALE_DECISION.upper())


def test_a_record_s_fields_are_its_message_priority_origin_and_its_call_site_s_fields():
    record = a_record(extra=journal(MessageId.RELOAD_REFUSED, CONFIG_FILE="/etc/flexiqd/flexiqd.yaml"))
    fields = dict(record_fields(record, "the message", "flexiqd"))
    assert fields["MESSAGE"] == "the message"
    assert fields["PRIORITY"] == "4"
    assert fields["SYSLOG_IDENTIFIER"] == "flexiqd"
    assert (fields["CODE_FILE"], fields["CODE_LINE"], fields["CODE_FUNC"]) == ("/src/controller.py", "42", "tick")
    assert fields["LOGGER"] == "flexiqd.daemon.controller"
    assert fields["MESSAGE_ID"] == MessageId.RELOAD_REFUSED
    assert fields["CONFIG_FILE"] == "/etc/flexiqd/flexiqd.yaml"


@pytest.mark.parametrize("level, priority", [(logging.DEBUG, "7"), (logging.INFO, "6"), (logging.WARNING, "4"),
                                             (logging.ERROR, "3"), (logging.CRITICAL, "2")])
def test_levels_become_syslog_priorities(level, priority):
    assert dict(record_fields(a_record(level=level), "m", "flexiqd"))["PRIORITY"] == priority


def test_the_datagram_has_plain_fields_and_length_prefixed_multiline_ones():
    datagram = encode([("MESSAGE", "one\ntwo"), ("POOL", "default"), ("NOTE", "é")])
    assert b"POOL=default\n" in datagram
    assert b"MESSAGE\n" + struct.pack("<Q", 7) + b"one\ntwo\n" in datagram
    assert decode(datagram) == {"MESSAGE": "one\ntwo", "POOL": "default", "NOTE": "é"}


def test_the_journal_stream_is_recognised_by_device_and_inode_only(tmp_path):
    mine = open(tmp_path / "stream", "w")
    other = open(tmp_path / "other", "w")
    info = os.fstat(mine.fileno())
    try:
        assert stream_is_journal(f"{info.st_dev}:{info.st_ino}", mine)
        assert not stream_is_journal(f"{info.st_dev}:{info.st_ino}", other)  # inherited, but not ours
        assert not stream_is_journal(None, mine)
        assert not stream_is_journal("", mine)
        assert not stream_is_journal("garbage", mine)
    finally:
        mine.close()
        other.close()


@pytest.fixture
def journald(tmp_path):
    """A datagram socket standing in for journald's."""
    path = str(tmp_path / "journal.socket")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    server.settimeout(5)
    yield server, path
    server.close()


def journal_handler(path: str, fallback_stream: io.StringIO) -> logging.Handler:
    stream = open(os.devnull, "w")  # any file: JOURNAL_STREAM is made to name it
    info = os.fstat(stream.fileno())
    handler = make_handler({"JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino}"}, stream, "flexiqd", path)
    assert isinstance(handler, JournalHandler)
    handler.fallback.setStream(fallback_stream)
    stream.close()
    return handler


def test_under_systemd_a_record_goes_to_the_journal_with_its_fields_and_nowhere_else(journald):
    server, path = journald
    fallback = io.StringIO()
    handler = journal_handler(path, fallback)
    try:
        handler.handle(a_record("Worker %s is gone: released its %d jobs.", "default-2", 3,
                                extra=journal(MessageId.DEAD_WORKER_JOBS_RELEASED, POOL="default", JOBS=3)))
        fields = decode(server.recv(65536))
    finally:
        handler.close()
    # MESSAGE= is what the stream line said before, without the priority prefix.
    assert fields["MESSAGE"] == "flexiqd.daemon.controller: Worker default-2 is gone: released its 3 jobs."
    assert fields["PRIORITY"] == "4"
    assert fields["MESSAGE_ID"] == MessageId.DEAD_WORKER_JOBS_RELEASED
    assert (fields["POOL"], fields["JOBS"]) == ("default", "3")
    assert fallback.getvalue() == ""


def test_a_traceback_travels_inside_the_message(journald):
    server, path = journald
    handler = journal_handler(path, io.StringIO())
    try:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            record = logging.getLogger("flexiqd.x").makeRecord(
                "flexiqd.x", logging.ERROR, __file__, 1, "Event listener failed.", (), __import__("sys").exc_info())
        handler.handle(record)
        message = decode(server.recv(65536))["MESSAGE"]
    finally:
        handler.close()
    assert message.startswith("flexiqd.x: Event listener failed.\nTraceback")
    assert "RuntimeError: boom" in message


def test_when_journald_cannot_be_reached_the_record_goes_to_stderr_once_with_its_priority(tmp_path):
    fallback = io.StringIO()
    handler = journal_handler(str(tmp_path / "no-such.socket"), fallback)
    try:
        handler.handle(a_record())
    finally:
        handler.close()
    assert fallback.getvalue() == "<4>flexiqd.daemon.controller: Pool default: hello\n"


def test_elsewhere_lines_go_to_the_stream_with_time_and_level_and_no_fields(tmp_path):
    stream = io.StringIO()
    handler = make_handler({"JOURNAL_STREAM": "1:2"}, stream, "flexiqd", str(tmp_path / "unused"))
    handler.handle(a_record(extra=journal(MessageId.SCALE_DECISION, POOL="default")))
    assert not isinstance(handler, JournalHandler)
    line = stream.getvalue()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING flexiqd\.daemon\.controller: "
                        r"Pool default: hello\n", line), line


def test_a_record_too_large_for_one_datagram_goes_to_stderr_instead(journald):
    server, path = journald
    fallback = io.StringIO()
    handler = journal_handler(path, fallback)
    huge = "x" * (16 * 1024 * 1024)  # above any socket's send buffer: the kernel refuses the datagram
    try:
        handler.handle(a_record("%s", huge))
    finally:
        handler.close()
    assert fallback.getvalue() == f"<4>flexiqd.daemon.controller: {huge}\n"
    server.setblocking(False)
    with pytest.raises(BlockingIOError):
        server.recv(65536)  # and nothing reached the journal
