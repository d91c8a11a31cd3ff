"""Dependencies' probes (``dependencies.<name>.probe``): a request timed every tick, off the loop.

Each probe runs on a thread of its own, once per ``interval``: a statement on a
PostgreSQL connection it keeps, a TCP connect, or an HTTP GET.  The control
loop never waits for one: it takes the newest reading it has not taken yet
(``ProbeSet.take``), and a probe that fails, or answers later than its timeout,
or has not answered since the last tick, gives None -- no information, which
the policy treats as neither load nor calm (``policy.evidence``).

Only the statement's (the connect's, the GET's) own time is measured: a
PostgreSQL probe that had to connect first does not count that round (a
connection is no request of the request path).  Passwords never reach a
message: targets are shown through ``ProbeConfig.shown``.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Callable, Mapping

from ..config.model import ProbeConfig
from ..errors import FlexiqdError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeResult:
    """One round of a probe: ``latency`` in seconds, or None and ``error`` (why: no information)."""

    latency: float | None
    error: str | None
    at: float          # time.monotonic() when it ended
    seq: int           # rounds counted from 1: the loop takes each once


class ProbeFailed(Exception):
    """A round gave no reading; the message says why, without any password."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


class _TcpRequest:
    def __init__(self, config: ProbeConfig) -> None:
        host, _, port = config.target.rpartition(":")
        self.address = (host.strip("[]"), int(port))
        self.timeout = config.timeout

    def __call__(self) -> float:
        started = time.monotonic()
        try:
            with socket.create_connection(self.address, timeout=self.timeout):
                return time.monotonic() - started
        except OSError as exc:
            raise ProbeFailed(f"cannot connect: {exc.strerror or _first_line(exc)}") from None

    def close(self) -> None:
        pass


class _HttpRequest:
    def __init__(self, config: ProbeConfig) -> None:
        self.url = config.target
        self.timeout = config.timeout

    def __call__(self) -> float:
        started = time.monotonic()
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout) as answer:  # noqa: S310 (http/https only)
                answer.read(65536)
        except urllib.error.HTTPError as exc:
            raise ProbeFailed(f"answered {exc.code} {exc.reason}") from None
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise ProbeFailed(f"no answer: {_first_line(reason) if isinstance(reason, BaseException) else reason}") \
                from None
        return time.monotonic() - started

    def close(self) -> None:
        pass


class _PostgresRequest:
    """The statement on one autocommit connection, kept from round to round (opened again after a
    failure).  Statements are never prepared: the probe may go through a pooler."""

    def __init__(self, config: ProbeConfig) -> None:
        self.config = config
        self.connection = None

    def _connect(self):
        import psycopg

        from ..errors import StoreUnavailable
        from ..queue.url import postgres_connect_options

        try:
            options = postgres_connect_options(self.config.target)
        except StoreUnavailable as exc:
            raise ProbeFailed(str(exc)) from None
        kwargs = {"autocommit": True, "connect_timeout": max(1, round(self.config.timeout + 0.5)),
                  "application_name": "flexiqd-probe"}
        if options.password is not None:
            kwargs["password"] = options.password
        try:
            connection = psycopg.connect(options.conninfo, **kwargs)
        except psycopg.Error as exc:
            raise ProbeFailed(f"cannot connect: {_first_line(exc)}") from None
        connection.prepare_threshold = None
        return connection

    def __call__(self) -> float:
        import psycopg

        if self.connection is None or self.connection.closed:
            self.connection = self._connect()
            raise ProbeFailed("connected (this round is not timed)")
        # A statement that outlasts the timeout is cancelled (a pooler forwards the cancel), so a
        # stuck server never keeps this thread from its next round for long.
        canceller = threading.Timer(self.config.timeout, self._cancel, args=(self.connection,))
        canceller.daemon = True
        started = time.monotonic()
        canceller.start()
        try:
            with self.connection.cursor() as cursor:
                cursor.execute(self.config.statement)
                if cursor.description is not None:
                    cursor.fetchall()
        except psycopg.Error as exc:
            self.close()
            raise ProbeFailed(f"the statement failed: {_first_line(exc)}") from None
        finally:
            canceller.cancel()
        return time.monotonic() - started

    @staticmethod
    def _cancel(connection) -> None:
        try:
            connection.cancel()
        except Exception:  # noqa: BLE001 -- the statement may have ended meanwhile
            pass

    def close(self) -> None:
        if self.connection is not None:
            try:
                self.connection.close()
            except Exception:  # noqa: BLE001 -- closing a broken connection may fail any way
                pass
            self.connection = None


REQUESTS: Mapping[str, Callable[[ProbeConfig], object]] = {
    "tcp": _TcpRequest, "http": _HttpRequest, "postgresql": _PostgresRequest}


class Probe:
    """One dependency's probe on a daemon thread of its own.  ``latest`` is thread-safe."""

    def __init__(self, config: ProbeConfig, interval: float, request: Callable[[], float] | None = None) -> None:
        self.config = config
        self.interval = interval
        self._request = request or REQUESTS[config.kind](config)
        self._lock = threading.Lock()
        self._result: ProbeResult | None = None
        self._stop = threading.Event()
        self._said: str | None = None  # the failure last logged, so a probe down is said once
        self._thread = threading.Thread(target=self._run, name=f"probe-{config.dependency}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end after its round (it is a daemon thread: a stuck round does not
        keep the process alive)."""
        self._stop.set()

    def latest(self) -> ProbeResult | None:
        with self._lock:
            return self._result

    def _run(self) -> None:
        seq = 0
        while not self._stop.is_set():
            began = time.monotonic()
            seq += 1
            latency, error = None, None
            try:
                latency = float(self._request())  # type: ignore[operator]
                if latency > self.config.timeout:
                    latency, error = None, f"answered after {latency:.2f}s, over its timeout"
            except ProbeFailed as exc:
                error = str(exc)
            except Exception as exc:  # noqa: BLE001 -- a probe must never end its thread
                error = f"{type(exc).__name__}: {_first_line(exc)}"
            with self._lock:
                self._result = ProbeResult(latency=latency, error=error, at=time.monotonic(), seq=seq)
            self._log(error)
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - began)))
        close = getattr(self._request, "close", None)
        if close is not None:
            close()

    def _log(self, error: str | None) -> None:
        if error is not None and error.startswith("connected"):
            return
        if error != self._said:
            if error is not None:
                log.warning("The probe of dependency %s (%s) gives no reading: %s. It neither holds nor "
                            "grows a pool meanwhile.", self.config.dependency, self.config.shown, error)
            elif self._said is not None:
                log.info("The probe of dependency %s answers again.", self.config.dependency)
            self._said = error


class ProbeSet:
    """Every configured probe: started, replaced on a reload, read once per tick.  Not thread-safe
    itself: the control loop alone calls it."""

    def __init__(self, probes: Mapping[str, ProbeConfig], interval: float) -> None:
        self._probes: dict[str, Probe] = {}
        self._taken: dict[str, int] = {}
        self.reconfigure(probes, interval)

    def reconfigure(self, probes: Mapping[str, ProbeConfig], interval: float) -> None:
        """Keep the probes whose settings did not change; start new ones, stop the others."""
        for name in list(self._probes):
            if probes.get(name) != self._probes[name].config or self._probes[name].interval != interval:
                self._probes.pop(name).stop()
                self._taken.pop(name, None)
        for name, config in probes.items():
            if name not in self._probes:
                try:
                    probe = Probe(config, interval)
                except (FlexiqdError, ValueError) as exc:
                    log.warning("Cannot set up the probe of dependency %s: %s", name, exc)
                    continue
                self._probes[name] = probe
                probe.start()

    def take(self, now_monotonic: float | None = None) -> dict[str, ProbeResult | None]:
        """Per dependency, its newest result not taken before, else None (no new information).
        A result older than two intervals and the timeout is stale: None."""
        now = time.monotonic() if now_monotonic is None else now_monotonic
        found: dict[str, ProbeResult | None] = {}
        for name, probe in self._probes.items():
            result = probe.latest()
            fresh = (result is not None and result.seq != self._taken.get(name)
                     and now - result.at <= 2 * probe.interval + probe.config.timeout)
            found[name] = result if fresh else None
            if result is not None:
                self._taken[name] = result.seq
        return found

    def latest(self) -> dict[str, ProbeResult | None]:
        """Each probe's last result, taken or not (for the status)."""
        return {name: probe.latest() for name, probe in self._probes.items()}

    def stop(self) -> None:
        for probe in self._probes.values():
            probe.stop()
        self._probes.clear()
