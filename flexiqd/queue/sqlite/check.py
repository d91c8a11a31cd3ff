"""Is a SQLite store whole?  The checks ``flexiq check`` runs, and the ones run before a store is used.

A damaged store is not an unreachable one: waiting does not mend it, and a
daemon or worker that ran on it would serve a queue read in part (jobs on a
damaged page are invisible, not failed).  So a damaged store is refused, with
what is damaged and where, and restored from a backup by an operator.

Three depths, each including the one before:

- ``Depth.FILES`` -- no SQLite call, a few reads: the file's header (a page of
  garbage at the start makes it "not a database"), a file that ends inside a
  page, and a write-ahead log that is gone or replaced while the shared-memory
  index (``-shm``) still counts committed frames not yet copied into the
  database (those transactions are lost: SQLite itself would open the store
  without them and say nothing).  Every worker runs it when it opens the store.
- ``Depth.QUICK`` -- SQLite's ``PRAGMA quick_check``: every page of every
  table and index is read and its b-tree structure checked (damaged pages, a
  truncated file, pages out of place), but not that each index matches its
  table.  The daemon runs it at start; its cost grows with the file
  (bench/store_check.md).
- ``Depth.FULL`` -- ``PRAGMA integrity_check`` (indexes against their tables
  too), ``PRAGMA foreign_key_check``, and flexiqd's own bookkeeping: the
  per-state ``counts`` the triggers keep against the jobs themselves.
  ``flexiq check`` runs it.

What no check can see: a write-ahead log deleted together with its ``-shm``
file, or a whole file replaced by an older copy -- SQLite then holds a store
that is whole, only older.  Those transactions are lost without a trace in the
files.

Reading only: nothing here changes the store (SQLite's read-only connection
may leave an empty ``-wal`` and ``-shm``, as any reader does).  A store whose log
is lost is not opened at all: SQLite would rebuild the ``-shm`` index from what
is left and erase the only sign of the loss.  Blocking; thread-safe (no state).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import sqlite3
import struct
from typing import Iterable

from ..store.schema_steps import too_new
from .schema import SCHEMA_VERSION, STEPS

HEADER_MAGIC = b"SQLite format 3\x00"
WAL_MAGICS = (0x377F0682, 0x377F0683)
_WAL_HEADER = 32
_WAL_FRAME_HEADER = 24
# The shared-memory index's header (wal.c: WalIndexHdr, twice, then WalCkptInfo).
_SHM_HEADER = 48
_SHM_READ = 2 * _SHM_HEADER + 4


# What an operator does about a damaged store; the steps are in docs/guarantees.md and flexiq(1).
RESTORE_ADVICE = ("Stop flexiqd and its workers, then restore the file from a backup taken with "
                  "'flexiq backup' or sqlite3 FILE '.backup DEST' (flexiq(1), section RESTORING A STORE)")


class Depth(enum.Enum):
    FILES = "files"
    QUICK = "quick"
    FULL = "full"


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing found damaged: a stable token (``header``, ``truncated``, ``wal-lost``,
    ``pages``, ``indexes``, ``foreign-keys``, ``counts``, ``schema``) and a sentence that
    names the file."""

    kind: str
    message: str


@dataclasses.dataclass(frozen=True)
class CheckReport:
    """What one check of a store found; ``checked`` says what was looked at, in order."""

    path: str
    depth: Depth
    checked: tuple[str, ...]
    findings: tuple[Finding, ...]

    @property
    def healthy(self) -> bool:
        return not self.findings

    def summary(self) -> str:
        """One sentence: what is damaged, or that nothing is."""
        if self.healthy:
            return f"the queue database {self.path} is whole ({', '.join(self.checked)}: ok)"
        return f"the queue database {self.path} is damaged: " + "; ".join(f.message for f in self.findings)


# -- the files, read without SQLite -------------------------------------------------------


def header_problem(head: bytes, size: int) -> Finding | None:
    """What is wrong with a database file whose first bytes are ``head`` and whose length is
    ``size``, or None.  Pure."""
    if size == 0:
        return None  # a store not created yet: opening it creates the schema
    if len(head) < 100 or not head.startswith(HEADER_MAGIC):
        return Finding("header", "its first page (the header) is corrupt, no SQLite header: the file was "
                                 "overwritten at its start, or is not a SQLite database")
    page_size = struct.unpack(">H", head[16:18])[0]
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        return Finding("header", f"its header is corrupt: it gives an impossible page size ({page_size})")
    if size % page_size:
        return Finding("truncated", f"the file ends inside a page ({size} bytes is not a whole number "
                                    f"of {page_size}-byte pages): it was cut short or written in part")
    return None


def wal_loss(shm: bytes, wal_head: bytes | None, wal_size: int, *, durable: bool = True) -> Finding | None:
    """Committed transactions the shared-memory index counts but the write-ahead log no longer
    holds, or None.  ``shm``: the first bytes of the ``-shm`` file; ``wal_head``: the first 32
    bytes of the ``-wal`` file, None when it does not exist.  Pure.

    The index records how many frames of the log are committed (mxFrame), how many a checkpoint
    has copied into the database (nBackfill), and the log's salts.  Frames committed and not
    copied must still be in that log.  An index in flux (its two copies differ) says nothing.
    ``durable``: the store syncs its log at each commit (synchronous=full); otherwise a power
    loss may leave the index ahead of the log on disk, and a short log is that trade, not damage.
    """
    if len(shm) < _SHM_READ:
        return None
    first, second = shm[:_SHM_HEADER], shm[_SHM_HEADER:2 * _SHM_HEADER]
    if first != second or not first[12]:  # being written, or never initialised
        return None
    page_size = struct.unpack("=H", first[14:16])[0]
    page_size = 65536 if page_size == 1 else page_size
    committed = struct.unpack("=I", first[16:20])[0]
    copied = struct.unpack("=I", shm[2 * _SHM_HEADER:_SHM_READ])[0]
    if committed <= copied:
        return None  # every committed frame is in the database file already
    pending = committed - copied
    if wal_head is None:
        return Finding("wal-lost", f"its write-ahead log is gone while {pending} committed page writes "
                                   f"in it were not yet copied into the database: the transactions "
                                   f"committed since the last checkpoint are lost")
    salts_match = len(wal_head) >= _WAL_HEADER and wal_head[16:24] == first[32:40]
    magic_ok = len(wal_head) >= 4 and struct.unpack(">I", wal_head[:4])[0] in WAL_MAGICS
    if not (magic_ok and salts_match):
        # The index belongs to another generation of the log.  SQLite never syncs the index to
        # disk: after a crash, a power loss or a file system that went read-only, the index on
        # disk can be older than the log (which a checkpoint restarted with new salts), and
        # SQLite rebuilds it from the log.  That is no evidence of a lost log.
        return None
    needed = _WAL_HEADER + committed * (_WAL_FRAME_HEADER + page_size)
    if durable and wal_size < needed:
        return Finding("wal-lost", f"its write-ahead log was cut short ({wal_size} bytes of the {needed} "
                                   f"that hold its committed frames): transactions committed since the "
                                   f"last checkpoint are lost")
    return None


def _read(path: str, count: int) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(count)
    except FileNotFoundError:
        return None


def held_here(path: str) -> bool:
    """Whether this process has the store file or its ``-shm`` open (a SQLite connection, its
    own or an application's): /proc/self/fd, each descriptor looked at with stat, none opened.
    Where that cannot be read, True: the files are then not read here."""
    targets = set()
    for name in (path, path + "-shm"):
        try:
            info = os.stat(name)
        except OSError:
            continue
        targets.add((info.st_dev, info.st_ino))
    if not targets:
        return False
    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:
        return True
    for fd in descriptors:
        try:
            info = os.stat(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile, or the listing's own descriptor
        if (info.st_dev, info.st_ino) in targets:
            return True
    return False


def check_files(path: str, *, durable: bool = True) -> list[Finding]:
    """The ``Depth.FILES`` checks of the store file ``path`` and its ``-wal`` and ``-shm``.

    Nothing is read while this process holds the file or its ``-shm`` open (``held_here``):
    closing a descriptor of a file drops every POSIX lock the process holds on it, SQLite's
    included, and another process could then take a live store for an abandoned one.  A
    process that holds it open checked it when it opened it.

    OSError (other than a missing -wal/-shm) is the caller's to report: it is not damage.
    """
    if not os.path.exists(path) or held_here(path):
        return []
    findings = []
    head = _read(path, 100) or b""
    problem = header_problem(head, os.path.getsize(path))
    if problem is not None:
        findings.append(problem)
    shm = _read(path + "-shm", _SHM_READ)
    if shm:
        wal_head = _read(path + "-wal", _WAL_HEADER)
        wal_size = os.path.getsize(path + "-wal") if wal_head is not None else 0
        lost = wal_loss(shm, wal_head, wal_size, durable=durable)
        if lost is not None:
            findings.append(lost)
    return findings


# -- SQLite's own checks ------------------------------------------------------------------

# What SQLite says of a damaged file; anything else (locked, I/O error) is not a verdict.
_DAMAGE_WORDS = ("malformed", "not a database", "corrupt")


def is_damage(error: sqlite3.Error) -> bool:
    """Whether SQLite's ``error`` says the file is damaged (not locked, not out of reach)."""
    text = str(error)
    return any(word in text for word in _DAMAGE_WORDS)


def _pragma_lines(conn: sqlite3.Connection, pragma: str) -> list[str]:
    lines = []
    for (text,) in conn.execute(f"PRAGMA {pragma}"):
        lines += [line for line in str(text).splitlines() if line and not line.startswith("*** in database")]
    return [] if lines == ["ok"] else lines


def _shown(lines: list[str], most: int = 5) -> str:
    more = f" (and {len(lines) - most} more)" if len(lines) > most else ""
    return "; ".join(lines[:most]) + more


def sqlite_findings(conn: sqlite3.Connection, depth: Depth) -> tuple[list[str], list[Finding]]:
    """(what was checked, what was found) by SQLite's checks at ``depth``, on an open connection.

    sqlite3.Error other than damage is raised: a locked store has not been checked.
    """
    checked: list[str] = []
    findings: list[Finding] = []

    def run(name: str, kind: str, describe, body) -> bool:
        checked.append(name)
        try:
            found = body()
        except sqlite3.Error as exc:
            if not is_damage(exc):
                raise
            # SQLite stops at the first page it cannot read, whatever it was checking.
            reading = "reading the schema" if name == "schema" else name
            findings.append(Finding("pages", f"{reading} stopped at a damaged page ({exc})"))
            return False
        if found:
            findings.append(Finding(kind, describe(found)))
        return True

    if depth is Depth.FILES:
        return checked, findings
    if not run("schema", "schema", str, lambda: _schema_problem(conn)):
        return checked, findings
    pragma = "quick_check" if depth is Depth.QUICK else "integrity_check"
    kind = "pages" if depth is Depth.QUICK else "indexes"
    if not run(pragma, kind, lambda lines: f"{pragma} found: {_shown(lines)}",
               lambda: _pragma_lines(conn, pragma)):
        return checked, findings
    if depth is Depth.FULL:
        run("foreign_key_check", "foreign-keys",
            lambda rows: f"foreign_key_check found {len(rows)} rows whose parent is missing",
            lambda: conn.execute("PRAGMA foreign_key_check").fetchall())
        run("counts", "counts", lambda rows: "the job counts disagree with the jobs: " + _shown(rows),
            lambda: _counts_problems(conn))
    return checked, findings


def _schema_problem(conn: sqlite3.Connection) -> str | None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if too_new(STEPS, version):
        return f"its schema version is {version}, newer than this flexiqd understands ({SCHEMA_VERSION})"
    if version == 0 and conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] == 0:
        return None  # a store never used yet
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    missing = sorted({"jobs", "counts", "executions"} - tables)
    if missing:
        return f"its tables {', '.join(missing)} are missing (schema version {version})"
    return None


def _counts_problems(conn: sqlite3.Connection) -> list[str]:
    """Where the trigger-kept ``counts`` differ from the jobs they count."""
    trigger = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'jobs_count_insert'").fetchone()
    if trigger is None or "waiting_for" not in trigger[0]:
        return []  # a store whose counts are kept another way (before v5): not judged by this one
    from .schema import _BUCKET_V5  # the one definition of a job's bucket

    actual = {(q, s, t): n for q, s, t, n in conn.execute(
        f"SELECT queue, {_BUCKET_V5.format(row='jobs')}, tenant, COUNT(*) FROM jobs GROUP BY 1, 2, 3")}
    kept = {(q, s, t): n for q, s, t, n in conn.execute("SELECT queue, state, tenant, n FROM counts")}
    return [f"queue {q!r} state {s!r}{f' tenant {t!r}' if t else ''}: {kept.get((q, s, t), 0)} counted, "
            f"{actual.get((q, s, t), 0)} jobs" for q, s, t in sorted(set(actual) | set(kept))
            if kept.get((q, s, t), 0) != actual.get((q, s, t), 0)]


def check_store(path: str, depth: Depth, *, busy_timeout: float = 5.0) -> CheckReport:
    """Check the SQLite store file ``path`` at ``depth``.  Reads only.

    FileNotFoundError when there is no such file; OSError when it cannot be read; sqlite3.Error
    when SQLite could not check it for a reason that is not damage (locked, say).
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(path)
    checked = ["header", "write-ahead log"]
    findings = check_files(path)
    # A lost log is not opened: SQLite's first connection would rebuild the -shm index to
    # match the log that is left, and with it erase the only sign of the loss.
    if depth is not Depth.FILES and not any(f.kind in ("header", "wal-lost") for f in findings):
        # Read-only: nothing in the store changes (SQLite may leave an empty -wal and -shm);
        # a log left by a crash is read as part of the store.
        try:
            conn = sqlite3.connect(f"file:{_uri_path(path)}?mode=ro", uri=True, timeout=busy_timeout,
                                   isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            if not is_damage(exc):
                raise
            findings.append(Finding("header", f"SQLite cannot open it ({exc})"))
        else:
            try:
                conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
                more_checked, more = sqlite_findings(conn, depth)
            finally:
                conn.close()
            checked += more_checked
            findings += more
    return CheckReport(path=path, depth=depth, checked=tuple(checked), findings=tuple(_unique(findings)))


def _uri_path(path: str) -> str:
    from urllib.parse import quote

    return quote(os.path.abspath(path))


def _unique(findings: Iterable[Finding]) -> list[Finding]:
    seen, kept = set(), []
    for finding in findings:
        if finding not in seen:
            seen.add(finding)
            kept.append(finding)
    return kept
