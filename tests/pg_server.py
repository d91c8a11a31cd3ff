"""A throw-away PostgreSQL 15 server for the tests, run from Debian's postgresql-15 binaries.

One server per test session: ``initdb`` into a fresh temporary directory, listening on a
unix socket in that directory and on 127.0.0.1 at a free port.  Each test gets a schema
of its own (``fresh_url``), which costs a few milliseconds, not a database.  The server is
tuned for tests (no fsync): durability is not what these tests check.

Root cannot run postgres, so as root the server runs as the ``postgres`` user.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import pwd
import shutil
import socket
import subprocess
import tempfile
from urllib.parse import quote

BIN = pathlib.Path(os.environ.get("FLEXIQ_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
DATABASE = "flexiq"
# A role that logs in over TCP with a password, for the password-file and auth tests.
PASSWORD_ROLE = "flexiq_pw"
PASSWORD = "s3cret-for-tests"


def in_ci() -> bool:
    """True when ``CI`` is set to anything but "", "0", "false" or "no"."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable_reason() -> str | None:
    """Why this machine cannot run the test server, or None when it can."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg 3 is not installed (apt-get install python3-psycopg)"
    for tool in ("initdb", "pg_ctl", "postgres"):
        if not (BIN / tool).exists():
            return f"PostgreSQL server binaries not found ({BIN / tool} is missing)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, but there is no 'postgres' user to run the server as"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PostgresServer:
    """Start with ``start()``, stop and remove with ``stop()`` (or use it as a context manager)."""

    def __init__(self, *, socket_dirs: tuple[os.PathLike | str, ...] = ()) -> None:
        """``socket_dirs``: more folders for its unix socket, beside its own (one a container sees)."""
        self.directory = pathlib.Path(tempfile.mkdtemp(prefix="flexiq-pg-"))
        self.socket_dirs = tuple(str(folder) for folder in socket_dirs)
        self.data = self.directory / "data"
        self.port = _free_port()
        self.pid: int | None = None
        self._schemas = itertools.count(1)

    # -- running commands as the server's user ----------------------------------------------

    def _as_owner(self, *argv: str) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *argv]
        return list(argv)

    def _run(self, *argv: str) -> None:
        done = subprocess.run(self._as_owner(*argv), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): "
                               f"{done.stderr.strip() or done.stdout.strip()}")

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> "PostgresServer":
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.directory, owner.pw_uid, owner.pw_gid)
        self._run(str(BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-E", "UTF8",
                  "--locale=C", "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync")
        # The superuser logs in over TCP without a password; everyone else needs theirs.
        hba = self.data / "pg_hba.conf"
        self._run("sh", "-c", f"printf '%s\\n' 'local all all trust' "
                              f"'host all postgres 127.0.0.1/32 trust' "
                              f"'host all all 127.0.0.1/32 scram-sha-256' > {hba}")
        sockets = ",".join([str(self.directory), *self.socket_dirs])
        settings = (f"-k {sockets} -p {self.port} -c listen_addresses=127.0.0.1 "
                    "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                    "-c max_connections=200 -c shared_buffers=64MB")
        self._run(str(BIN / "pg_ctl"), "start", "-w", "-t", "60", "-D", str(self.data),
                  "-l", str(self.directory / "server.log"), "-o", settings)
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
        self.admin(f"CREATE DATABASE {DATABASE}")
        self.admin(f"CREATE ROLE {PASSWORD_ROLE} LOGIN PASSWORD '{PASSWORD}'")
        self.admin(f"GRANT ALL ON SCHEMA public TO {PASSWORD_ROLE}", database=DATABASE)
        return self

    def stop(self) -> None:
        """Stop the server (immediate: nothing here needs a clean shutdown) and remove its files."""
        try:
            if self.pid is not None and (self.data / "postmaster.pid").exists():
                try:
                    self._run(str(BIN / "pg_ctl"), "stop", "-m", "immediate", "-w", "-D", str(self.data))
                except (RuntimeError, subprocess.TimeoutExpired):
                    os.kill(self.pid, 9)  # the postmaster we started, by its pid
        finally:
            self.pid = None
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> "PostgresServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses -----------------------------------------------------------------------------

    def url(self, database: str = DATABASE, *, user: str = "postgres", schema: str | None = None,
            **params: str) -> str:
        """A ``postgresql://`` URL to ``database`` over TCP; ``schema`` puts it on the search path."""
        query = dict(params)
        if schema is not None:
            query["options"] = f"-csearch_path={schema}"
        tail = "&".join(f"{key}={quote(value, safe='')}" for key, value in query.items())
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}" + (f"?{tail}" if tail else "")

    def socket_url(self, database: str = DATABASE, *, schema: str | None = None,
                   directory: os.PathLike | str | None = None) -> str:
        """A URL to ``database`` over the unix socket (the fastest way in, for most tests); ``directory``:
        one of its ``socket_dirs`` instead of its own folder."""
        folder = str(directory or self.directory)
        url = f"postgresql://postgres@/{database}?host={quote(folder, safe='')}&port={self.port}"
        return url + (f"&options={quote(f'-csearch_path={schema}', safe='')}" if schema else "")

    def admin(self, sql: str, *, database: str = "postgres") -> list[tuple]:
        """Run one statement as the superuser (autocommit) and return its rows."""
        import psycopg

        with psycopg.connect(host=str(self.directory), port=self.port, user="postgres",
                             dbname=database, autocommit=True) as conn:
            cursor = conn.execute(sql)
            return cursor.fetchall() if cursor.description else []

    def fresh_schema(self) -> str:
        schema = f"t{os.getpid()}_{next(self._schemas)}"
        self.admin(f"CREATE SCHEMA {schema} AUTHORIZATION postgres", database=DATABASE)
        return schema

    def fresh_url(self, *, tcp: bool = False, **params: str) -> str:
        """The URL of a new, empty schema: a store of its own for one test."""
        schema = self.fresh_schema()
        if tcp:
            return self.url(schema=schema, **params)
        tail = "".join(f"&{key}={quote(value, safe='')}" for key, value in params.items())
        return self.socket_url(schema=schema) + tail
