"""Open a job store from its URL."""

from __future__ import annotations

import math
import os
import re
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from ..credentials import CredentialError, credential
from ..errors import StoreUnavailable
from .store.backend import Backend

if TYPE_CHECKING:
    from .postgres.database import ConnectOptions

DEFAULT_URL = "sqlite:////var/lib/flexiq/queue.db"
URL_ENV = "FLEXIQ_URL"
POSTGRES_SCHEMES = ("postgresql", "postgres")
# flexiqd's own options of a postgresql:// URL; every other query parameter is libpq's.
POSTGRES_OPTIONS = ("password_file", "password_credential", "listen", "prepare")
# user:password@ -- the password runs to the last "@" before the path (an unescaped "@" in it).
_USERINFO_PASSWORD = re.compile(r"(?P<user>[^:/@?#\s]*):[^/?#\s]*@")
_SWITCH = {"on": True, "true": True, "yes": True, "1": True,
           "off": False, "false": False, "no": False, "0": False}


def default_url() -> str:
    """``$FLEXIQ_URL``, else the packaged state directory's database."""
    return os.environ.get(URL_ENV) or DEFAULT_URL


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite:///relative`` or ``sqlite:////absolute`` URL."""
    rest = url[len("sqlite:///"):].split("?", 1)[0]
    if not rest:
        raise StoreUnavailable(f"{safe_url(url)}: a sqlite URL needs a path, as in sqlite:////var/lib/flexiq/queue.db")
    return rest


def check_url(url: str) -> dict[str, str]:
    """The options of a store URL that a backend of this version serves; StoreUnavailable otherwise.

    Pure: nothing is opened, so ``flexiqd --check-config`` can say what is wrong.
    """
    scheme = urlsplit(url).scheme
    if scheme in POSTGRES_SCHEMES:
        return _postgres_options(url)
    if scheme != "sqlite":
        raise StoreUnavailable(f"{safe_url(url)}: unknown store scheme {scheme or '(none)'!r}: no backend of this "
                               f"version serves it; use SQLite, as in {DEFAULT_URL}, or "
                               f"postgresql://user@host/database")
    if not url.startswith("sqlite:///"):
        raise StoreUnavailable(
            f"{safe_url(url)}: a sqlite URL has three slashes before a relative path and four before "
            f"an absolute one, as in {DEFAULT_URL}")
    sqlite_path(url)
    # keep_blank_values: "?busy_timeout=" or a bare "?synchronus" must be refused, not dropped.
    options = dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))
    unknown = set(options) - {"synchronous", "busy_timeout"}
    if unknown:
        raise StoreUnavailable(f"{safe_url(url)}: unknown option {sorted(unknown)[0]!r} "
                               f"(known: synchronous, busy_timeout)")
    try:
        busy = float(options.get("busy_timeout", 5.0))
    except ValueError:
        busy = math.nan
    if not 0 <= busy < math.inf:
        raise StoreUnavailable(f"{safe_url(url)}: busy_timeout must be seconds, got "
                               f"{options['busy_timeout']!r}")
    return options


def safe_url(url: str) -> str:
    """``url`` with any password in it (``user:password@`` or libpq's ``?password=``) replaced
    by ``***``: the form shown in messages and logs.  Text, not a parse: a malformed URL
    (``postgresql:/user:secret@host``) is hidden as well, and anything else is left as written."""
    shown = _USERINFO_PASSWORD.sub(r"\g<user>:***@", url, count=1)
    head, question, query = shown.partition("?")
    if question:
        query = "&".join("password=***" if unquote(piece.split("=", 1)[0]) == "password" else piece
                         for piece in query.split("&"))
    return head + question + query


def _postgres_options(url: str) -> dict[str, str]:
    """flexiqd's own options of a postgresql:// URL (libpq checks its own when connecting)."""
    options = {key: value for key, value in parse_qsl(urlsplit(url).query, keep_blank_values=True)
               if key in POSTGRES_OPTIONS}
    shown = safe_url(url)
    if "password_file" in options and "password_credential" in options:
        raise StoreUnavailable(f"{shown}: give password_file or password_credential, not both")
    for key in ("password_file", "password_credential"):
        if key in options and not options[key]:
            raise StoreUnavailable(f"{shown}: {key} needs a value")
    if "password_file" in options and not os.path.isabs(options["password_file"]):
        raise StoreUnavailable(f"{shown}: password_file must be an absolute path, "
                               f"got {options['password_file']!r}")
    for key in ("listen", "prepare"):
        if options.get(key, "on").lower() not in _SWITCH:
            raise StoreUnavailable(f"{shown}: {key} must be on or off, got {options[key]!r}")
    return options


def postgres_connect_options(url: str) -> "ConnectOptions":
    """How to connect for a postgresql:// URL: the libpq URL without flexiqd's options, and the
    password from ``password_file`` or the systemd credential ``password_credential``
    (the first line of either).

    A password in the URL itself wins; with none given libpq looks as it always does
    (``$PGPASSFILE``, ``~/.pgpass``).
    """
    options = _postgres_options(url)
    parts = urlsplit(url)
    # The other parameters reach libpq exactly as written (re-encoding would turn a space
    # into '+', which libpq reads as a plus sign).
    libpq_query = "&".join(piece for piece in parts.query.split("&")
                           if piece and unquote(piece.split("=", 1)[0]) not in POSTGRES_OPTIONS)
    conninfo = urlunsplit(parts._replace(query=libpq_query))
    password = None
    if parts.password is None and "password_file" in options:
        path = options["password_file"]
        try:
            with open(path, encoding="utf-8") as handle:
                password = handle.readline().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise StoreUnavailable(f"{safe_url(url)}: cannot read password_file {path}: {reason}") from None
    elif parts.password is None and "password_credential" in options:
        try:
            password = credential(options["password_credential"]).split("\n", 1)[0].rstrip("\r")
        except CredentialError as exc:
            raise StoreUnavailable(f"{safe_url(url)}: {exc}") from None
    return _postgres().ConnectOptions(conninfo=conninfo, password=password,
                                      listen=_SWITCH[options.get("listen", "on").lower()],
                                      prepare=_SWITCH[options.get("prepare", "on").lower()])


def open_backend(url: str) -> Backend:
    """A backend for ``url``: ``sqlite:///path[?synchronous=normal&busy_timeout=seconds]`` or
    ``postgresql://user@host/database[?password_file=/path&listen=off&<libpq parameters>]``."""
    options = check_url(url)
    if urlsplit(url).scheme in POSTGRES_SCHEMES:
        return _postgres().PostgresBackend(postgres_connect_options(url), url=safe_url(url))
    from .sqlite.database import SQLiteBackend

    return SQLiteBackend(sqlite_path(url), synchronous=options.get("synchronous", "full"),
                         busy_timeout=float(options.get("busy_timeout", 5.0)), url=url)


def probe_store(url: str) -> str | None:
    """Check that the store of ``url`` can be reached, changing nothing; a short description, or
    None for stores that are files (checked when opened; only a file that was moved elsewhere
    is refused here).  StoreUnavailable when it cannot."""
    check_url(url)
    if urlsplit(url).scheme not in POSTGRES_SCHEMES:
        from .moved import moved_message, moved_to

        target = moved_to(sqlite_path(url))  # a file left behind by flexiq move-store
        if target is not None:
            raise StoreUnavailable(moved_message(sqlite_path(url), target))
        return None
    return _postgres().probe(postgres_connect_options(url), safe_url(url))


def _postgres():
    """The PostgreSQL store's module: psycopg is needed only by those who use it."""
    try:
        from .postgres import database as postgres
    except ImportError as exc:
        raise StoreUnavailable(f"the PostgreSQL store needs psycopg 3 ({exc}); install python3-psycopg "
                               f"(Debian) or python3-psycopg3 / pip's psycopg") from None
    return postgres
