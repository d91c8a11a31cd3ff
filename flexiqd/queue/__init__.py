"""The job store: value types, the backend interface, and the backends."""

from .api import Queue
from .backend import Backend
from .tasks import Task
from .types import ClaimRequest, Job, JobState, NewJob, Outcome, OutcomeKind, Stats
from .url import default_url, open_backend

__all__ = ["Backend", "ClaimRequest", "Job", "JobState", "NewJob", "Outcome", "OutcomeKind",
           "Queue", "Stats", "Task", "default_url", "open_backend"]
