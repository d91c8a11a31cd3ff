"""A test app whose one task calls a shared dependency with a fixed capacity (bench/ceilings/).

``ceiling_op(i)`` does one operation on the dependency the harness set up, then returns.
The dependency comes from the environment:

- ``FLEXIQ_CEILING_KIND``: ``cpu`` or ``connections`` (a PostgreSQL server, reached with
  psycopg: a CPU-capped server, or a pgbouncer with a fixed pool of server connections),
  or ``threads`` (an HTTP service with a fixed number of handler threads, reached with
  urllib);
- ``FLEXIQ_CEILING_TARGET``: its address (a libpq conninfo, or an http:// base URL, or
  ``unix:<path>`` for the HTTP service's unix socket);
- ``FLEXIQ_CEILING_OP``: what one job does there (an SQL statement, or a path and query);
- ``FLEXIQ_CEILING_OUTSIDE_MS`` (optional): milliseconds of the job's own work before it
  calls the dependency, blocked in ``time.sleep`` (a job that spends only a share of its
  time inside the dependency).

The task blocks the way a real one does: in C, on the dependency's socket (psycopg's
libpq, or urllib's read), never in an asyncio trick.  Each start appends
``start <job> <attempt> <pid> <epoch>`` and each end ``end <job> <attempt> <pid> <epoch>``
to ``$FLEXIQ_CEILING_MARKS/<pid>.log`` (O_APPEND), so a run counts executions, not
completions.  ``DependencyClient`` is also what the harness's request-path prober uses.
"""

from __future__ import annotations

import http.client
import os
import socket
import threading
import time
import urllib.request

import marks
from flexiqd import Queue
from flexiqd.worker.execution import current_job

KIND_ENV = "FLEXIQ_CEILING_KIND"
TARGET_ENV = "FLEXIQ_CEILING_TARGET"
OP_ENV = "FLEXIQ_CEILING_OP"
MARKS_ENV = "FLEXIQ_CEILING_MARKS"
OUTSIDE_ENV = "FLEXIQ_CEILING_OUTSIDE_MS"

queue = Queue()


class DependencyClient:
    """One kind of operation on the dependency, with a small pool of connections (thread-safe).

    PostgreSQL connections are opened on demand, kept for reuse (as an application's pool
    does) and never prepared: pgbouncer's transaction mode (1.18) has no prepared statements.
    """

    def __init__(self, kind: str, target: str, op: str) -> None:
        if kind not in ("cpu", "connections", "threads"):
            raise ValueError(f"unknown dependency kind {kind!r}")
        self.kind = kind
        self.target = target
        self.op = op
        self._idle: list = []
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls) -> "DependencyClient":
        return cls(os.environ[KIND_ENV], os.environ[TARGET_ENV], os.environ[OP_ENV])

    def call(self, op: str | None = None) -> None:
        """Run one operation (``op``, else the default one) and wait for its answer."""
        op = op or self.op
        if self.kind == "threads" and self.target.startswith("unix:"):
            connection = _UnixHTTPConnection(self.target[len("unix:"):], timeout=120)
            try:
                connection.request("GET", op)
                connection.getresponse().read()
            finally:
                connection.close()
            return
        if self.kind == "threads":
            with urllib.request.urlopen(self.target.rstrip("/") + op, timeout=120) as answer:
                answer.read()
            return
        connection = self._take()
        try:
            connection.execute(op).fetchall()
        except BaseException:
            connection.close()
            raise
        with self._lock:
            self._idle.append(connection)

    def _take(self):
        import psycopg

        with self._lock:
            if self._idle:
                return self._idle.pop()
        return psycopg.connect(self.target, autocommit=True, prepare_threshold=None, connect_timeout=30)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket: one connection, one request (as urllib does over TCP here)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


_client: DependencyClient | None = None
_client_lock = threading.Lock()


def _dependency() -> DependencyClient:
    global _client
    with _client_lock:
        if _client is None:
            _client = DependencyClient.from_environment()
        return _client


def _mark(what: str) -> None:
    job = current_job()
    pid = os.getpid()
    marks.append(f"{what} {job.id} {job.attempts} {pid} {time.time():.6f}\n", directory=os.environ[MARKS_ENV])


@queue.task("ceiling_op")
def ceiling_op(i: int = 0) -> None:
    _mark("start")
    outside = float(os.environ.get(OUTSIDE_ENV) or 0.0)
    if outside > 0:
        time.sleep(outside / 1000.0)
    _dependency().call()
    _mark("end")
