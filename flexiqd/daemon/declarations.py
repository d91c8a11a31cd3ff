"""The daemon writes what its pools' tasks declare to the store, after each app check.

A pool that scales to zero may have no worker for a long time, and its workers are the
ones that write their tasks' declarations (``flexiq worker`` at start).  Until one
starts, a producer that enqueues by name would get the defaults -- often another queue
than the pool's, where nothing would ever start a worker for it.  So the daemon writes
the declarations its app check found (``flexiqd.apps.check``: the pool's app imported
as its workers would import it, at the daemon's start and on every reload), as a
worker would: the one written last wins (flexiqd.queue.declarations).
"""

from __future__ import annotations

import logging
import time
from typing import Sequence

from ..apps.check import AppProbe
from ..errors import QueueError
from ..queue.store.backend import Backend

log = logging.getLogger(__name__)


def publish_declarations(backend: Backend, probes: Sequence[AppProbe], *, now: float | None = None) -> int:
    """Write the declarations of every pool whose app imported; how many were new or changed.
    Blocking (one transaction per pool); a store that refuses is logged, never raised."""
    changed = 0
    for probe in probes:
        if probe.error is not None or not probe.declared:
            continue
        try:
            changed += backend.declare_tasks(probe.declared, by=f"flexiqd (pool {probe.pool})",
                                             now=time.time() if now is None else now)
        except QueueError as exc:
            log.warning("Pool %s: could not write its tasks' declarations to the store: %s", probe.pool, exc)
    if changed:
        log.info("Wrote %d tasks' declarations to the store (what the pools' apps declare).", changed)
    return changed
