"""The job store: value types, the backend interface, and the store.

The lifecycle and its contract are written once (the package ``store``) over a SQL
dialect's interface (``store/dialect.py``); the packages ``sqlite`` and ``postgres``
are the two dialects: their SQL text, transactions, schema, migrations and wake-ups.
"""

from .api import Queue
from .store.backend import Backend
from .tasks import Task
from .types import ClaimRequest, Job, JobState, NewJob, Outcome, OutcomeKind, Stats
from .url import default_url, open_backend

__all__ = ["Backend", "ClaimRequest", "Job", "JobState", "NewJob", "Outcome", "OutcomeKind",
           "Queue", "Stats", "Task", "default_url", "open_backend"]
