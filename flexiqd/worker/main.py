"""The worker process's entry point: the only place that installs signal handlers."""

from __future__ import annotations

import asyncio
import logging
import signal

from ..errors import StoreUnavailable
from ..queue.url import open_backend
from .loader import load_app
from .runtime import EXIT_UNAVAILABLE, Worker, WorkerConfig

log = logging.getLogger(__name__)


def run_worker(app_spec: str, config: WorkerConfig, url: str | None = None) -> int:
    """Load the app, open the store, run until SIGTERM/SIGINT, drain; return the exit code.

    SIGUSR1 pauses claiming and SIGUSR2 resumes it (what a scale-in or an
    operator's pause asks of a worker before it is stopped).
    """
    app = load_app(app_spec)
    store_url = url or app.url
    try:
        backend = open_backend(store_url)
    except StoreUnavailable as exc:
        log.error("Worker %s cannot start: %s", config.name, exc)
        return EXIT_UNAVAILABLE
    worker = Worker(app, backend, config)

    async def main() -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, worker.request_stop)
        loop.add_signal_handler(signal.SIGUSR1, worker.pause)
        loop.add_signal_handler(signal.SIGUSR2, worker.resume)
        # The process fleet starts workers with these blocked: a pause sent while this one
        # started is delivered now, to its handler.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1, signal.SIGUSR2})
        return await worker.run()

    try:
        return asyncio.run(main())
    finally:
        backend.close()
