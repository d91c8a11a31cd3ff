"""The fence of a worker on a store shared by hosts: end the process before another host may
take a job it still runs.

Another host hands a job back once its lease has expired and its host stopped
beating (flexiqd.queue.hosts).  A worker cut off from the store (a network cut, a
database that hangs) cannot know when that happens, so it keeps, per job, when a
claim or renewal of it last went through -- timed from *before* the call was sent,
so the lease the store wrote runs at least that long -- and once one is older than
``after`` it ends itself: its tasks' processes killed, the process gone, with the
lease still running.  A thread of its own does the watching, so a blocked event
loop or a store call hung on a dead connection cannot delay it.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterable


class LeaseFence:
    """Per-job lease confirmations, and a watcher that calls ``on_breach`` once one is overdue.

    Thread-safe.  ``on_breach(job_ids)`` is called at most once, from the watcher thread,
    and is expected not to return (it ends the process).
    """

    def __init__(self, after: float, on_breach: Callable[[list[int]], None], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if after <= 0:
            raise ValueError(f"the fence needs a positive bound, got {after}")
        self.after = after
        self._on_breach = on_breach
        self._clock = clock
        self._confirmed: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def claimed(self, job_ids: Iterable[int], sent_at: float) -> None:
        """The store leased ``job_ids`` to this worker by a claim sent at ``sent_at`` (this clock)."""
        with self._lock:
            for job_id in job_ids:
                self._confirmed[job_id] = max(sent_at, self._confirmed.get(job_id, sent_at))

    def confirm(self, job_ids: Iterable[int], sent_at: float) -> None:
        """The store renewed ``job_ids`` by a call sent at ``sent_at``.  Jobs dropped meanwhile
        (finished while the renewal was under way) stay dropped."""
        with self._lock:
            for job_id in job_ids:
                if job_id in self._confirmed:
                    self._confirmed[job_id] = max(sent_at, self._confirmed[job_id])

    def drop(self, job_ids: Iterable[int]) -> None:
        """Nothing here runs ``job_ids`` any more (finished, handed back, never started)."""
        with self._lock:
            for job_id in job_ids:
                self._confirmed.pop(job_id, None)

    def overdue(self, now: float) -> list[int]:
        """The jobs whose last confirmation is older than ``after`` at ``now``."""
        with self._lock:
            return sorted(job_id for job_id, at in self._confirmed.items() if now - at > self.after)

    def start(self) -> None:
        """Watch on a daemon thread, checking ten times per bound."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="flexiq-fence", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        while not self._stopped.wait(self.after / 10):
            late = self.overdue(self._clock())
            if late:
                self._on_breach(late)
                return
