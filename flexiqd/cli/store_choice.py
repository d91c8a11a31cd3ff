"""Which job store a ``flexiq`` queue command (``enqueue``, ``stats``, ``jobs``, ``dead-letter``) uses.

In order: ``--url``; ``$FLEXIQ_URL``; the ``store:`` of the daemon's config file
(``$FLEXIQD_CONFIG``, else /etc/flexiqd/flexiqd.yaml) where it is readable; the
packaged default.  Without the config step, a machine moved to PostgreSQL would
still read and write the old SQLite file, and no one would notice.

Only the ``store:`` key is read: a mistake in a pool elsewhere in the file must not
keep an operator from looking at the queue.  ``choose_store`` is pure (the file's
text comes in as an argument); ``read_config_text`` is the I/O.
"""

from __future__ import annotations

import dataclasses
import errno
import os
from typing import Mapping

import yaml

from ..config.model import DEFAULT_CONFIG_PATH
from ..errors import FlexiqdError
from ..queue.url import DEFAULT_URL, URL_ENV, safe_url

CONFIG_ENV = "FLEXIQD_CONFIG"


@dataclasses.dataclass(frozen=True)
class ConfigText:
    """The config file as read: its text, or why it could not be read (None, None: no file)."""

    path: str
    text: str | None = None
    unreadable: str | None = None   # e.g. "permission denied"


@dataclasses.dataclass(frozen=True)
class StoreChoice:
    url: str
    source: str              # "--url", "$FLEXIQ_URL", the config file's path, or "default"
    note: str | None = None  # one line for stderr, or None when there is nothing to say

    def __post_init__(self) -> None:
        if "\n" in (self.note or ""):
            raise ValueError("a store note is one line")


def config_location(environ: Mapping[str, str]) -> str:
    return environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH


def read_config_text(path: str) -> ConfigText:
    """The file at ``path``; a missing file is no file, any other failure is said in words."""
    try:
        with open(path, encoding="utf-8") as handle:
            return ConfigText(path, text=handle.read())
    except FileNotFoundError:
        return ConfigText(path)
    except OSError as exc:
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        if exc.errno == errno.EISDIR:
            reason = "it is a directory"
        return ConfigText(path, unreadable=reason)
    except UnicodeDecodeError:
        return ConfigText(path, unreadable="it is not UTF-8 text")


def choose_store(given: str | None, environ: Mapping[str, str], config: ConfigText) -> StoreChoice:
    """The store a queue command uses, where it came from, and what to tell the user on stderr.

    Says nothing when the store is the packaged default and nothing else was expected, nor
    for a ``--url`` the user typed.  Raises FlexiqdError for a ``store:`` that is not text:
    guessing another store there is what this module exists to prevent.
    """
    if given:
        return StoreChoice(given, "--url")
    from_env = environ.get(URL_ENV)
    if from_env:
        return _told(StoreChoice(from_env, f"${URL_ENV}"))
    if config.unreadable is not None:
        return StoreChoice(DEFAULT_URL, "default",
                           f"cannot read {config.path} ({config.unreadable}); using the default store "
                           f"{DEFAULT_URL} (give --url or ${URL_ENV} for another)")
    if config.text is None:
        return StoreChoice(DEFAULT_URL, "default")
    try:
        data = yaml.safe_load(config.text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        return StoreChoice(DEFAULT_URL, "default",
                           f"cannot parse {config.path}{line}; using the default store {DEFAULT_URL} "
                           f"(give --url or ${URL_ENV} for another)")
    store = data.get("store") if isinstance(data, dict) else None
    if store is None:
        return StoreChoice(DEFAULT_URL, "default")  # the daemon uses the default too
    if not isinstance(store, str) or not store.strip():
        raise FlexiqdError(f"{config.path}: store: must be a store URL, got {store!r}; "
                           f"fix it or give --url")
    return _told(StoreChoice(store.strip(), config.path))


def _told(choice: StoreChoice) -> StoreChoice:
    """``choice`` with a note naming the store, unless it is the default."""
    if choice.url == DEFAULT_URL:
        return choice
    return dataclasses.replace(choice, note=f"using the store {safe_url(choice.url)} (from {choice.source})")


def opening_hint(choice: StoreChoice) -> str | None:
    """What to add when the chosen store cannot be opened: a store taken from the daemon's
    config may be reachable only as the daemon reaches it (a systemd credential, a password
    file for root), and the user may not know that is where it came from."""
    if choice.source in ("--url", "default"):
        return None
    return (f"(the store of {choice.source}; give --url, or ${URL_ENV}, to reach it another way, "
            f"e.g. with a password_file or ~/.pgpass you can read)")


def store_for_command(given: str | None, environ: Mapping[str, str] | None = None) -> StoreChoice:
    """``choose_store`` with the real environment and config file."""
    environ = os.environ if environ is None else environ
    if given or environ.get(URL_ENV):
        return choose_store(given, environ, ConfigText(config_location(environ)))
    return choose_store(given, environ, read_config_text(config_location(environ)))
