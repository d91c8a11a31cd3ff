"""The signals a worker answers, caught from its first moments.

``WorkerSignals.install()`` runs before the worker reads its config or imports
the application (which may take seconds): a SIGUSR1 (pause) or SIGTERM (stop)
arriving then is recorded instead of killing a worker that is still starting,
and replayed once the worker exists.  The process fleet starts workers with
SIGUSR1/SIGUSR2 blocked, so one sent even before this runs stays pending; it is
delivered -- to these handlers -- when ``install`` unblocks them.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Protocol

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
PAUSE_SIGNAL = signal.SIGUSR1
RESUME_SIGNAL = signal.SIGUSR2
HANDLED = (*STOP_SIGNALS, PAUSE_SIGNAL, RESUME_SIGNAL)


class Controllable(Protocol):
    def request_stop(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...


class WorkerSignals:
    """Records signals until ``attach`` hands them, and every later one, to a worker."""

    def __init__(self) -> None:
        self.received: list[int] = []

    @classmethod
    def install(cls) -> "WorkerSignals":
        """Catch the worker's signals now, then unblock them.  Main thread only."""
        signals = cls()
        for signum in HANDLED:
            signal.signal(signum, signals._record)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
        return signals

    def _record(self, signum: int, _frame: object) -> None:
        self.received.append(signum)  # only a flag: the worker acts on it in its loop

    def attach(self, loop: asyncio.AbstractEventLoop, worker: Controllable) -> None:
        """From now on ``loop`` dispatches the signals to ``worker``; replay the recorded ones in order."""
        actions = {PAUSE_SIGNAL: worker.pause, RESUME_SIGNAL: worker.resume,
                   **{signum: worker.request_stop for signum in STOP_SIGNALS}}
        for signum, action in actions.items():
            loop.add_signal_handler(signum, action)
        received, self.received = self.received, []
        for signum in received:
            actions[signum]()

    @staticmethod
    def detach(loop: asyncio.AbstractEventLoop) -> None:
        """Stop dispatching: from here a second SIGTERM is ignored, not fatal."""
        for signum in HANDLED:
            loop.remove_signal_handler(signum)
            signal.signal(signum, signal.SIG_IGN)
