"""Secrets for tasks, from systemd credentials (``LoadCredential=`` in the worker's unit).

A pool's ``credentials:`` config names each secret and the file it comes from;
systemd copies it into a directory only that worker unit can read and names
the directory in ``$CREDENTIALS_DIRECTORY``.  Secrets never pass through the
environment, the config file or a command line::

    from flexiqd import credential
    password = credential("db-password")
"""

from __future__ import annotations

import os

from .errors import FlexiqdError

CREDENTIALS_ENV = "CREDENTIALS_DIRECTORY"


class CredentialError(FlexiqdError):
    """A credential the application asked for is not there."""


def credential(name: str) -> str:
    """The text of credential ``name``, exactly as stored (a trailing newline is kept).

    Raises ``CredentialError`` naming the credential and the directory when it is missing.
    """
    if not name or "/" in name or name in (".", ".."):
        raise CredentialError(f"credential {name!r}: not a credential name (a file name, no '/')")
    directory = os.environ.get(CREDENTIALS_ENV)
    if not directory:
        raise CredentialError(f"credential {name!r}: ${CREDENTIALS_ENV} is not set -- this process "
                              f"was given no credentials (list it under the pool's credentials:)")
    path = os.path.join(directory, name)
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        try:
            given = ", ".join(sorted(os.listdir(directory)))
        except OSError:
            given = ""
        raise CredentialError(f"credential {name!r} is not in {directory} (given: {given or 'none'}; "
                              f"list it under the pool's credentials:)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CredentialError(f"credential {name!r} in {directory} cannot be read: {exc}") from None
