"""The worker process's entry point: the only place that handles signals and ends the process.

Order of start-up, each step for a reason:
1. signals are caught (by the ``flexiq worker`` command, before anything slow):
   a pause or stop sent to a starting worker is recorded, never fatal;
2. the worker becomes its descendants' subreaper, then loads the app, opens
   the store, writes its tasks' declarations there (for producers that enqueue by
   name), starts paused if its pool is paused (``$FLEXIQD_PAUSED_FILE``);
3. the recorded signals are replayed and the loop runs: READY=1 is sent only now.
At the end every descendant process is killed, and a worker that gave up on a
thread still running a job ends with ``os._exit`` instead of waiting for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import Callable

from ..errors import QueueError, StoreDamaged, StoreUnavailable, StoreUnreachable, TaskError
from ..logs import MessageId, journal
from ..notify import Notifier
from ..queue.api import Queue
from ..queue.store.backend import Backend
from ..queue.declarations import declarations_of
from ..queue.url import open_backend, safe_url
from ..runtime_files import PAUSED_FILE_ENV, is_paused
from .exit import become_subreaper, exit_now, kill_descendants
from .loader import load_app
from .runtime import EXIT_APP, EXIT_DAMAGED, EXIT_OK, EXIT_UNAVAILABLE, STORE_RETRY_MAX, Worker
from .settings_reader import LimitsReader, TenantCapsReader, WorkerSetup, drain_timeout_now
from .signals import STOP_SIGNALS, WorkerSignals

log = logging.getLogger(__name__)

# A store that cannot be reached now (its server restarting, its disk full) is waited for,
# trying again this often at most: exiting instead would loop through systemd's restarts
# (RestartSec=1s) into its start limit, and the unit would end failed while the store is away.
# The pause doubles up to the claim loop's (runtime.STORE_RETRY_MAX).
STORE_RETRY_FIRST = 0.25
# How far past the next try the start timeout is pushed each time (EXTEND_TIMEOUT_USEC).
STORE_WAIT_MARGIN = 10.0


def run_worker(setup: WorkerSetup, signals: WorkerSignals | None = None) -> int:
    """Run a worker until SIGTERM/SIGINT, drain, and return its exit code -- or end the process.

    SIGUSR1 pauses claiming and SIGUSR2 resumes it (what a scale-in or an
    operator's pause asks of a worker before it is stopped).  Main thread only.
    """
    signals = signals or WorkerSignals.install()
    become_subreaper()
    try:
        app = load_app(setup.app)
    except TaskError as exc:
        # Starting again at once would fail the same way: the unit does not restart on this
        # code (RestartPreventExitStatus=), and flexiqd's crash-loop backoff paces new starts.
        log.error("Worker %s cannot load its app: %s", setup.config.name, exc)
        return EXIT_APP
    store_url = setup.store_url or app.url
    try:
        backend = open_when_reachable(store_url, setup.config.name, signals, Notifier())
    except StoreDamaged as exc:
        log.error("Worker %s cannot start: %s", setup.config.name, exc,
                  extra=journal(MessageId.STORE_DAMAGED, STORE=safe_url(store_url), PROBLEM=exc))
        return EXIT_DAMAGED
    except StoreUnavailable as exc:
        log.error("Worker %s cannot start: %s", setup.config.name, exc)
        return EXIT_UNAVAILABLE
    if backend is None:
        log.info("Worker %s stopped while it waited for the store.", setup.config.name)
        return EXIT_OK
    if app.url != store_url:
        log.info("Worker %s: the application's Queue names %s; its tasks enqueue into the pool's "
                 "store %s, where this worker claims.", setup.config.name, safe_url(app.url),
                 safe_url(store_url))
    # A task's own .enqueue() (a follow-up job) must reach the store the workers claim from.
    app.use(store_url, backend=backend)
    publish_declarations(app, backend, setup.config.name)
    worker = Worker(app, backend, setup.config, drain_budget=lambda: drain_timeout_now(setup),
                    dependency_limits=LimitsReader(setup), tenant_caps=TenantCapsReader(setup))
    if setup.pool and is_paused(os.environ.get(PAUSED_FILE_ENV), setup.pool):
        log.info("Pool %s is paused by an operator: worker %s starts paused.", setup.pool, setup.config.name)
        worker.pause()
    runner = asyncio.Runner()
    try:
        signals.attach(runner.get_loop(), worker)
        code = runner.run(worker.run())
        signals.detach(runner.get_loop())
    finally:
        killed = kill_descendants()
        if killed:
            log.info("Worker %s killed %d processes its tasks had left running.", setup.config.name, killed)
    if worker.left_running or _other_threads_block_exit():
        # Interpreter shutdown would wait for them; the jobs they run are abandoned already.
        exit_now(code)
    runner.close()
    backend.close()
    return code


def publish_declarations(app: Queue, backend: Backend, name: str) -> None:
    """Write the app's tasks' declarations to the store, so a producer that enqueues by name
    gets their queue, priority, attempts and timeout.  A failure is logged, never fatal: the
    worker runs its jobs all the same, and producers fall back on the defaults."""
    try:
        changed = backend.declare_tasks(declarations_of(app.tasks), by=name, now=time.time())
    except QueueError as exc:
        log.warning("Worker %s could not write its tasks' declarations to the store: %s", name, exc)
        return
    if changed:
        log.info("Worker %s declared %d of its %d tasks anew in the store.", name, changed, len(app.tasks))


def open_when_reachable(url: str, name: str, signals: WorkerSignals, notifier: Notifier, *,
                        sleep: Callable[[float], None] = time.sleep) -> Backend | None:
    """The store, opened once it can be reached; None if a stop arrived while it could not.

    Blocking.  ``StoreUnreachable`` is waited out -- the start timeout extended, the
    watchdog fed, STATUS= saying why -- and every other ``StoreUnavailable`` (a wrong
    URL or password, a schema too new) is raised: waiting would not mend it.
    """
    delay, since = STORE_RETRY_FIRST, time.monotonic()
    while True:
        try:
            backend = open_backend(url)
        except StoreUnreachable as exc:
            if any(signum in STOP_SIGNALS for signum in signals.received):
                return None
            waited = time.monotonic() - since
            if delay == STORE_RETRY_FIRST:
                log.warning("Worker %s waits for the store: %s", name, exc)
            notifier.status(f"waiting {waited:.0f}s for the store: {exc}")
            notifier.extend_timeout(delay + STORE_WAIT_MARGIN)
            notifier.watchdog()
            sleep(delay)
            delay = min(delay * 2, STORE_RETRY_MAX)
            continue
        if delay != STORE_RETRY_FIRST:
            log.info("Worker %s reached the store after %.1fs.", name, time.monotonic() - since)
        return backend


def _other_threads_block_exit() -> bool:
    main = threading.main_thread()
    return any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate())

