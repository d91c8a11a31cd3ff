"""The counting app, with what real applications add around it: a database connection of its
own, held from import to exit, and a flush at exit that takes a while.

An application's own pool (SQLAlchemy, psycopg_pool) connects when the app is loaded and
closes at interpreter exit; an error reporter or tracer flushes there first (Sentry waits up
to 2 s by default).  So a stopped worker holds a connection, and its process, for
``$SLOW_EXIT_SECONDS`` (default 1) after its drain.  The connection is made when
``$SLOW_EXIT_DSN`` is set, with the password systemd hands the unit as the credential
``flexiq-db`` (when there is one); its application_name is ``slow_exit_app``.
"""

import atexit
import os
import time

import psycopg

from counting_app import queue  # noqa: F401  (the app: its tasks are the counting app's)


def _connect():
    dsn = os.environ.get("SLOW_EXIT_DSN")
    if not dsn:
        return None
    password = None
    credentials = os.environ.get("CREDENTIALS_DIRECTORY")
    if credentials and os.path.exists(os.path.join(credentials, "flexiq-db")):
        with open(os.path.join(credentials, "flexiq-db")) as handle:
            password = handle.read().strip()
    return psycopg.connect(dsn, password=password, application_name="slow_exit_app", autocommit=True)


_connection = _connect()


@atexit.register
def _shut_down() -> None:
    time.sleep(float(os.environ.get("SLOW_EXIT_SECONDS", "1")))
    if _connection is not None:
        _connection.close()
