"""flexiqd: a systemd-native autoscaler for job-queue workers, with its own job queue."""

__version__ = "0.1.0"

from .queue import Queue  # noqa: E402  (the application API: from flexiqd import Queue)

__all__ = ["Queue", "__version__"]
