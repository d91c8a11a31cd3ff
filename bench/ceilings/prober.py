"""The request path: a web application's requests through the same dependency, at a fixed rate.

``Prober(dependency, rate=10)`` sends one request every 1/rate seconds, on schedule whatever
the previous ones are doing (an open loop, as users arrive), each on a thread of a small
pool with its own warm connection.  A request's latency counts from its scheduled time to
its answer, so a request that waited for a free prober thread waited like a user would.
``summary(t0, t1)`` gives the p50/p95 of the requests scheduled in [t0, t1) (epoch seconds).
"""

from __future__ import annotations

import concurrent.futures
import math
import threading
import time

from .deps import Dependency


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


class Prober:
    def __init__(self, dependency: Dependency, *, rate: float = 10.0, threads: int = 16) -> None:
        self.dependency = dependency
        self.rate = rate
        self.samples: list[tuple[float, float, bool]] = []   # (scheduled epoch, latency s, ok)
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._local = threading.local()
        self._clients: list = []
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="prober")
        self._thread = threading.Thread(target=self._schedule, name="prober-clock", daemon=True)

    def __enter__(self) -> "Prober":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True)
        for client in self._clients:
            client.close()

    def _client(self):
        client = getattr(self._local, "client", None)
        if client is None:
            client = self.dependency.client(self.dependency.probe_op)
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    def _schedule(self) -> None:
        period = 1.0 / self.rate
        began_mono, began_wall = time.monotonic(), time.time()
        n = 0
        while not self._stop.is_set():
            due = began_mono + n * period
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return
            self._pool.submit(self._request, due, began_wall + (due - began_mono))
            n += 1

    def _request(self, due_mono: float, due_wall: float) -> None:
        ok = True
        try:
            self._client().call()
        except Exception as exc:  # a failed request is recorded, not fatal
            ok = False
            with self._lock:
                if len(self.errors) < 20:
                    self.errors.append(repr(exc)[:200])
        latency = time.monotonic() - due_mono
        with self._lock:
            self.samples.append((due_wall, latency, ok))

    def latencies(self, t0: float, t1: float) -> list[float]:
        with self._lock:
            return [lat for at, lat, ok in self.samples if t0 <= at < t1 and ok]

    def summary(self, t0: float, t1: float) -> dict:
        with self._lock:
            window = [(lat, ok) for at, lat, ok in self.samples if t0 <= at < t1]
        good = [lat for lat, ok in window if ok]
        p50, p95 = percentile(good, 50), percentile(good, 95)
        return {"requests": len(window), "failed": sum(1 for _, ok in window if not ok),
                "p50_ms": None if p50 is None else round(p50 * 1000, 2),
                "p95_ms": None if p95 is None else round(p95 * 1000, 2),
                "max_ms": round(max(good) * 1000, 2) if good else None}
