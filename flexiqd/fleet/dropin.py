"""The per-instance drop-in of a worker unit, with values escaped so systemd reads them back verbatim.

systemd reads ``Environment="K=V"`` by unquoting it with C escapes and only then
expanding ``%`` specifiers, so a value is written with ``\\`` and ``"``
backslashed, control characters (a newline would start a new directive) as C
escapes and ``%`` doubled.  ``LoadCredential=`` paths are taken as they stand
after specifier expansion: only ``%`` needs doubling (the config loader refuses
control characters in them).  Pure: no I/O.
"""

from __future__ import annotations

from ..runtime_files import PAUSED_FILE_ENV
from .base import WorkerSpec

CONFIG_ENV = "FLEXIQD_CONFIG"

_C_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\a": "\\a",
              "\b": "\\b", "\f": "\\f", "\v": "\\v", "%": "%%"}


def escape_quoted(text: str) -> str:
    """``text`` for inside a double-quoted systemd value that is C-unescaped, then specifier-expanded.

    NUL cannot be written at all (systemd refuses ``\\x00``): ValueError.
    """
    if "\0" in text:
        raise ValueError("a NUL character cannot reach a unit's environment")
    out = []
    for char in text:
        if char in _C_ESCAPES:
            out.append(_C_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return "".join(out)


def environment_line(key: str, value: str) -> str:
    return f'Environment="{escape_quoted(f"{key}={value}")}"'


def escape_specifiers(text: str) -> str:
    return text.replace("%", "%%")


def dropin_text(spec: WorkerSpec, *, config_path: str | None = None, paused_path: str | None = None) -> str:
    """The drop-in of one pool's worker instances (template drop-ins cannot be per pool)."""
    lines = ["# Written by flexiqd for this pool; replaced on every scale-up and reload.", "[Service]",
             # The drain budget plus time to release what could not finish.
             f"TimeoutStopSec={spec.stop_timeout:g}s"]
    if config_path:
        lines.append(environment_line(CONFIG_ENV, config_path))
    if paused_path:
        lines.append(environment_line(PAUSED_FILE_ENV, paused_path))
    for key, value in sorted(spec.environment.items()):
        lines.append(environment_line(key, str(value)))
    if spec.python:
        # The pool's own interpreter (a virtual environment): the template's command line is
        # replaced, since ExecStart= adds to a list unless it is first emptied.
        lines += ["ExecStart=", f"ExecStart={escape_specifiers(spec.python)} -m flexiqd.cli.flexiq worker --instance %i"]
    # The operator's grants for this pool (unit_settings), beside flexiqd's own lines.
    for name, value in spec.unit_settings:
        lines.append(f"{name}={escape_specifiers(value)}")
    for credential in spec.credentials:
        directive = "LoadCredentialEncrypted" if credential.encrypted else "LoadCredential"
        lines.append(f"{directive}={credential.name}:{escape_specifiers(credential.path)}")
    return "\n".join(lines) + "\n"
