"""Load an application's queue from ``module:attribute``."""

from __future__ import annotations

import importlib
import sys
import os

from ..errors import TaskError
from ..queue.api import Queue


def load_app(spec: str) -> Queue:
    """Import ``module`` and return its ``attribute``, which must be a ``Queue``.

    The current directory is importable, as for ``python -m``, so an app next
    to where the worker starts is found.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise TaskError(f"--app {spec!r}: expected module:attribute, as in myapp.tasks:queue")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise TaskError(f"--app {spec!r}: no module named {exc.name!r} "
                            f"(is it installed, or on PYTHONPATH?)") from None
        raise TaskError(f"--app {spec!r}: importing {module_name} failed: {exc}") from exc
    except Exception as exc:
        raise TaskError(f"--app {spec!r}: importing {module_name} raised "
                        f"{type(exc).__name__}: {exc}") from exc
    try:
        app = getattr(module, attribute)
    except AttributeError:
        raise TaskError(f"--app {spec!r}: module {module_name} has no attribute {attribute!r}") from None
    if not isinstance(app, Queue):
        raise TaskError(f"--app {spec!r}: {attribute} is a {type(app).__name__}, not a flexiqd.Queue")
    return app
