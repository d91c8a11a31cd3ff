"""The daemon's configuration file: its model and loader.

The schema of every setting is ``flexiqd.settings_schema`` and the files the daemon publishes
for its workers are ``flexiqd.runtime_files``: stdlib-only modules on the package's
ground floor, which ``fleet/``, ``policy/`` and the worker import without this package.
Its names are imported on first use: a module that needs the model alone must not pay
for the loader (YAML, the policy) to get it.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module that defines it
_EXPORTS = {"load_config": "load", "parse_config": "load", "DEFAULT_CONFIG_PATH": "model",
            "DaemonConfig": "model", "FlexiqOptions": "model", "PoolConfig": "model"}

__all__ = ["DEFAULT_CONFIG_PATH", "DaemonConfig", "FlexiqOptions", "PoolConfig", "load_config",
           "parse_config"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value
