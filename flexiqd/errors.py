"""The one exception tree of flexiqd.

Errors are wrapped once, with context, at the layer that knows it (the store,
the config loader, the fleet); entry points print ``str(error)`` as one line
and never a traceback for these.
"""


class FlexiqdError(Exception):
    """Base of every error flexiqd raises on purpose."""


class ConfigError(FlexiqdError):
    """A configuration file or option is invalid; the message names the key."""


class QueueError(FlexiqdError):
    """The job store refused or failed an operation."""


class StoreUnavailable(QueueError):
    """The store cannot be opened or used: missing, read-only, corrupt or locked."""


class StoreUnreachable(StoreUnavailable):
    """The store cannot be used now, for a reason that passes by itself: its server is down or
    restarting, or its disk is full.  Retrying later may succeed; nothing about it is wrong."""


class StoreDamaged(StoreUnavailable):
    """The store's files are damaged (a page overwritten, a file cut short, its write-ahead log
    lost): waiting will not mend it, and nothing may run on a queue read in part.  Restored
    from a backup by an operator."""


class PayloadError(QueueError):
    """A job's payload is not JSON."""


class JobNotFound(QueueError):
    """No job has the given id."""


class TaskError(FlexiqdError):
    """A task could not be registered, found or loaded."""


class ControlError(FlexiqdError):
    """An operator's request cannot be done (unknown pool, a count out of range, ...)."""


class FleetError(FlexiqdError):
    """Starting, stopping or listing workers failed."""
