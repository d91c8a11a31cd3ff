"""Check a store named by its URL: ``flexiq check`` and the daemon's check at start.

SQLite: the checks of ``sqlite.check`` on the file.  PostgreSQL keeps its files
itself (its WAL, its page checksums, ``amcheck``): here the store is opened --
which checks its schema version -- and every ``flexiq_`` table is read through
once, so a table the server cannot read, or one that is missing, is reported.

Errors: ``StoreUnreachable`` when the store cannot be checked now (locked past
the busy timeout, its server down), ``StoreUnavailable`` when it cannot be
checked at all (no such file, a wrong URL).  Damage is a finding in the report,
never an exception.  Blocking.
"""

from __future__ import annotations

import sqlite3
from urllib.parse import urlsplit

from ..errors import QueueError, StoreDamaged, StoreUnavailable, StoreUnreachable
from .sqlite.check import RESTORE_ADVICE, CheckReport, Depth, Finding, check_store
from .url import POSTGRES_SCHEMES, check_url, open_backend, safe_url, sqlite_path


def check_url_store(url: str, depth: Depth) -> CheckReport:
    """The report of the store of ``url`` checked at ``depth`` (PostgreSQL: one depth)."""
    options = check_url(url)
    if urlsplit(url).scheme in POSTGRES_SCHEMES:
        return _check_postgres(url)
    path = sqlite_path(url)
    busy = float(options.get("busy_timeout", 5.0))
    try:
        return check_store(path, depth, busy_timeout=busy)
    except FileNotFoundError:
        raise StoreUnavailable(f"there is no queue database at {path} (nothing to check)") from None
    except OSError as exc:
        raise StoreUnavailable(f"cannot read the queue database {path}: {exc.strerror or exc}") from None
    except sqlite3.Error as exc:
        text = str(exc)
        if "locked" in text or "busy" in text:
            raise StoreUnreachable(f"cannot check the queue database {path} now: it stayed locked for "
                                   f"longer than the busy timeout ({busy:g}s)") from None
        raise StoreUnavailable(f"cannot check the queue database {path}: {text}") from None


def refuse_if_damaged(url: str, depth: Depth) -> None:
    """Raise ``StoreDamaged`` (with what is damaged and how to restore) when the SQLite store of
    ``url`` is damaged; nothing for PostgreSQL, whose opening checks what it can."""
    if urlsplit(url).scheme in POSTGRES_SCHEMES:
        return
    try:
        report = check_url_store(url, depth)
    except StoreUnreachable:
        raise
    except StoreUnavailable:
        return  # no file yet, say: opening the store reports (or creates) it
    if not report.healthy:
        raise StoreDamaged(f"{report.summary()}. {RESTORE_ADVICE}")


def _check_postgres(url: str) -> CheckReport:
    shown = safe_url(url)
    backend = open_backend(url)  # refuses a schema it does not know, or a server out of reach
    try:
        def read_all(tx) -> tuple[list[str], list[Finding]]:
            version = tx.conn.execute("SELECT max(version) FROM flexiq_schema").fetchone()[0]
            tables = [row[0] for row in tx.conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
                "AND table_name LIKE 'flexiq\\_%' AND table_type = 'BASE TABLE' ORDER BY table_name")]
            checked = [f"schema version {version}"]
            for needed in ("flexiq_jobs", "flexiq_executions"):
                if needed not in tables:
                    return checked, [Finding("schema", f"its table {needed} is missing")]
            for table in tables:
                tx.conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()  # every page read once
            checked.append(f"{len(tables)} tables read")
            return checked, []

        try:
            checked, findings = backend.database.read("check the store", read_all)
        except StoreUnreachable:
            raise
        except QueueError as exc:  # a table the server cannot read (a damaged page, a checksum)
            checked, findings = [], [Finding("unreadable", f"reading its tables failed: {exc}")]
    finally:
        backend.close()
    return CheckReport(path=shown, depth=Depth.FULL, checked=tuple(checked), findings=tuple(findings))

