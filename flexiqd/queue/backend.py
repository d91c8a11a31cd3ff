"""Where ``Backend`` was first documented; it lives in ``flexiqd.queue.store.backend``."""

from .store.backend import Backend, EndedAttempt

__all__ = ["Backend", "EndedAttempt"]
