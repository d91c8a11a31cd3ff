"""A pool's application seen from a worker's seat, before any worker starts.

``probe`` runs in the child (``python -m flexiqd.apps.probe module:attribute``): it imports
the app as a worker would and prints what it found.  ``check`` runs that child as the
workers' user, in the pool's interpreter and environment.  ``findings`` (pure) turns the
result into what is wrong and what is risky.
"""
