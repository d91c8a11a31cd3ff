"""``flexiq scaler``: the KEDA endpoint and the queue metrics served straight from the store,
without the daemon."""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import signal

from ..errors import FlexiqdError
from ..queue.url import open_backend
from .daemon import read_token
from .routes import store_routes
from .server import HttpServer

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ScalerOptions:
    url: str
    host: str
    port: int
    target: int
    queues: tuple[str, ...] | None
    token_file: str | None


def check_options(options: ScalerOptions) -> None:
    """One-line ``FlexiqdError`` for a bad host, or a non-loopback one without a token."""
    if options.host != "localhost":
        try:
            address = ipaddress.ip_address(options.host)
        except ValueError:
            raise FlexiqdError(f"--host must be an IP address or localhost, got {options.host!r}") from None
        if not address.is_loopback and options.token_file is None:
            raise FlexiqdError(f"--host {options.host} is not loopback: give --token-file too, so other "
                               f"machines must present a bearer token")


async def serve_scaler(options: ScalerOptions) -> None:
    """Serve until SIGINT or SIGTERM."""
    check_options(options)
    token = read_token(options.token_file)
    backend = open_backend(options.url)
    server = HttpServer(options.host, options.port, store_routes(backend, options.target, options.queues),
                        token=token)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await server.start()
        log.info("Serving /api/scaler and /metrics for %s on %s:%d.", ", ".join(options.queues or ["every queue"]),
                 options.host, server.port)
        await stop.wait()
    finally:
        await server.close()
        backend.close()
