"""Keeping flexiqd's API on the bus: offered at start, and offered again whenever the bus
closes the connection.

A system bus goes away under running services: ``systemctl restart dbus`` (or
``dbus-broker``), or a bus daemon that crashed or was killed and that socket
activation starts again at the next client's connection.  Every connection it had
is gone, and with it the name ``org.flexiq.flexiqd1``.  The keeper connects again at
once and then backs off (``RETRY_FIRST`` doubling to ``RETRY_MAX``), exports the
objects and owns the name again.  Meanwhile flexiqctl finds no owner of the name
and says so (exit 3); the control loop never waits on any of this.

The same holds at start: a bus away when the daemon starts, or a name it may not own
yet (the policy file not installed, another flexiqd still leaving), is said once and
tried again -- every ``RETRY_MAX`` seconds while the bus cannot be reached, every
``REFUSED_RETRY_MAX`` while the name is refused -- instead of leaving the daemon
unreachable until its next restart.

Lives on the daemon's event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import logging

from ..busnames import BUS_NAME
from ..daemon.api_port import ApiPort
from ..errors import FlexiqdError
from .service import ApiService, NameRefused, serve_api

log = logging.getLogger(__name__)

RETRY_FIRST = 0.2   # seconds before the second attempt to connect again
RETRY_MAX = 1.0     # ... doubling up to this: connecting to a socket is cheap, the gap is not
REFUSED_RETRY_MAX = 30.0  # ... or to this while the bus refuses the name: that passes slowly, if at all


class ApiKeeper:
    """The API service of the moment (``service``; None while the bus is away), and the task
    that offers it again.  Make one with ``start``; ``close`` leaves the bus for good."""

    def __init__(self, port: ApiPort, address: str | None, service: ApiService | None,
                 reported: str | None = None) -> None:
        self.port = port
        self.address = address
        self.service: ApiService | None = service
        self._closing = False
        self._task = asyncio.get_running_loop().create_task(self._keep(reported))

    @classmethod
    async def start(cls, port: ApiPort, address: str | None) -> ApiKeeper:
        """Offer the API now; when it cannot be yet, say why and keep trying (never raises)."""
        try:
            return cls(port, address, await serve_api(port, address))
        except FlexiqdError as exc:
            log.warning("Not offering the D-Bus API yet (flexiqctl cannot reach this daemon; trying "
                        "again): %s", exc)
            return cls(port, address, None, reported=str(exc))

    async def _keep(self, reported: str | None) -> None:
        try:
            if self.service is None:
                self.service = await self._serve_again(reported, "the first attempt")
            await self._keep_serving()
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must not pass unseen: the API would be gone for good
            log.exception("Stopped offering the API again after a lost connection.")

    async def _keep_serving(self) -> None:
        while self.service is not None:
            why = await self.service.lost()
            if self._closing:
                return
            self.service.abandon()
            self.service = None
            log.warning("Lost the bus connection (%s): flexiqctl cannot reach this daemon until it is "
                        "connected again; connecting again.", why)
            self.service = await self._serve_again(None, "the connection was lost")

    async def _serve_again(self, reported: str | None, since_what: str) -> ApiService | None:
        """The API served on a new connection, trying until it is (None: closing meanwhile).
        ``reported``: the failure already said, not said again."""
        loop = asyncio.get_running_loop()
        since, delay = loop.time(), RETRY_FIRST
        while not self._closing:
            try:
                service = await serve_api(self.port, self.address)
            except FlexiqdError as exc:
                if str(exc) != reported:  # once per reason, not once per attempt
                    log.warning("Cannot offer the API on the bus yet (trying again): %s", exc)
                    reported = str(exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, REFUSED_RETRY_MAX if isinstance(exc, NameRefused) else RETRY_MAX)
                continue
            log.info("Offering %s on the bus again, %.1fs after %s.", BUS_NAME, loop.time() - since, since_what)
            return service
        return None

    async def close(self) -> None:
        """Leave the bus and stop offering the API again.  Idempotent."""
        self._closing = True
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:  # as asked
            pass
        if self.service is not None:
            await self.service.close()
            self.service = None
