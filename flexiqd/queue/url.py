"""Open a job store from its URL."""

from __future__ import annotations

import math
import os
from urllib.parse import parse_qs, urlsplit

from ..errors import StoreUnavailable
from .backend import Backend

DEFAULT_URL = "sqlite:////var/lib/flexiq/queue.db"
URL_ENV = "FLEXIQ_URL"


def default_url() -> str:
    """``$FLEXIQ_URL``, else the packaged state directory's database."""
    return os.environ.get(URL_ENV) or DEFAULT_URL


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite:///relative`` or ``sqlite:////absolute`` URL."""
    rest = url[len("sqlite:///"):].split("?", 1)[0]
    if not rest:
        raise StoreUnavailable(f"{url}: a sqlite URL needs a path, as in sqlite:////var/lib/flexiq/queue.db")
    return rest


def check_url(url: str) -> dict[str, str]:
    """The options of a store URL that a backend of this version serves; StoreUnavailable otherwise.

    Pure: nothing is opened, so ``flexiqd --check-config`` can say what is wrong.
    """
    scheme = urlsplit(url).scheme
    if scheme in ("postgresql", "postgres"):
        raise StoreUnavailable(f"{url}: the PostgreSQL store is not available in this version "
                               f"(it has no PostgreSQL backend); use SQLite, as in {DEFAULT_URL}")
    if scheme != "sqlite":
        raise StoreUnavailable(f"{url}: unknown store scheme {scheme or '(none)'!r}: no backend of this "
                               f"version serves it; use SQLite, as in {DEFAULT_URL}")
    if not url.startswith("sqlite:///"):
        raise StoreUnavailable(
            f"{url}: a sqlite URL has three slashes before a relative path and four before "
            f"an absolute one, as in {DEFAULT_URL}")
    sqlite_path(url)
    # keep_blank_values: "?busy_timeout=" or a bare "?synchronus" must be refused, not dropped.
    options = {k: v[-1] for k, v in parse_qs(urlsplit(url).query, keep_blank_values=True).items()}
    unknown = set(options) - {"synchronous", "busy_timeout"}
    if unknown:
        raise StoreUnavailable(f"{url}: unknown option {sorted(unknown)[0]!r} "
                               f"(known: synchronous, busy_timeout)")
    try:
        busy = float(options.get("busy_timeout", 5.0))
    except ValueError:
        busy = math.nan
    if not 0 <= busy < math.inf:
        raise StoreUnavailable(f"{url}: busy_timeout must be seconds, got "
                               f"{options['busy_timeout']!r}")
    return options


def open_backend(url: str) -> Backend:
    """A backend for ``url``: ``sqlite:///path[?synchronous=normal&busy_timeout=seconds]``."""
    options = check_url(url)
    from .sqlite import SQLiteBackend

    return SQLiteBackend(sqlite_path(url), synchronous=options.get("synchronous", "full"),
                         busy_timeout=float(options.get("busy_timeout", 5.0)), url=url)
