"""Emitting a signal on a bus that may be going away.

dbus-fast writes a signal at once; when the socket fails, it finalizes the bus
inside that write, unexporting the interface from the very set of buses the
emission is iterating, and the emission raises ``RuntimeError: Set changed
size during iteration``.  That only says the bus is gone: the keeper connects
again and publishes everything anew, so the signal is dropped, not raised into
the loop as a task exception.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

log = logging.getLogger(__name__)


def emit_while_connected(bus: Any, emit: Callable[..., Any], *args: Any) -> None:
    """Call ``emit(*args)`` (a signal method or ``emit_properties_changed``) unless ``bus`` is gone."""
    if not bus.connected:
        return
    try:
        emit(*args)
    except RuntimeError:
        if bus.connected:
            raise
        log.debug("The bus went away while emitting %s; dropped.", getattr(emit, "__name__", emit))
