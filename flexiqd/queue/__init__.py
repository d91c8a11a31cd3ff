"""The job store: value types, the backend interface, and the store.

The lifecycle is written once (core.py) over a SQL dialect's interface
(dialect.py); sqlite.py and postgres.py are the two dialects: their SQL text,
transactions, schema and wake-ups.
"""

from .api import Queue
from .backend import Backend
from .tasks import Task
from .types import ClaimRequest, Job, JobState, NewJob, Outcome, OutcomeKind, Stats
from .url import default_url, open_backend

__all__ = ["Backend", "ClaimRequest", "Job", "JobState", "NewJob", "Outcome", "OutcomeKind",
           "Queue", "Stats", "Task", "default_url", "open_backend"]
