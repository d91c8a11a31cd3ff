"""flexiqd: a systemd-native autoscaler for job-queue workers, with its own job queue."""

__version__ = "0.1.0"

from .credentials import credential  # noqa: E402  (secrets: from flexiqd import credential)
from .queue import Queue  # noqa: E402  (the application API: from flexiqd import Queue)

__all__ = ["Autoscaler", "Queue", "__version__", "credential", "serve_autoscaler"]


def __getattr__(name: str):
    # The autoscaler pulls in the daemon's controller: import it only when asked for.
    if name in ("Autoscaler", "serve_autoscaler", "AutoscaleConfig"):
        from . import autoscale

        return getattr(autoscale, name)
    raise AttributeError(f"module 'flexiqd' has no attribute {name!r}")
