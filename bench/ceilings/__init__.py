"""A real dependency ceiling under flexiqd's workers, for bench/ceiling_bench.py and the tests.

    from ceilings import ceiling, Prober, knee_sweep, flash_crowd, Settings

``ceiling(kind, capacity)`` sets up a dependency (``cpu``: a CPU-capped PostgreSQL;
``connections``: pgbouncer with a fixed pool; ``threads``: an HTTP service with fixed
threads) and yields its address and the environment tests/apps/ceiling_app.py's
workers need; ``Prober`` is the request path through it; ``knee_sweep`` measures where
more workers stop adding throughput; ``flash_crowd`` runs one policy on a burst.
"""

from .deps import KINDS, Dependency, ceiling, unavailable_reason
from .prober import Prober, percentile
from .runs import (AutoscalerFleet, DaemonFleet, FixedFleet, KedaFleet, Settings, Store, WorkerSampler, flash_crowd,
                   kill_leftovers, knee_of, knee_sweep, probe_of, read_marks, sweep_counts)

__all__ = ["KINDS", "Dependency", "ceiling", "unavailable_reason", "Prober", "percentile", "AutoscalerFleet",
           "DaemonFleet", "FixedFleet", "KedaFleet", "Settings", "Store", "WorkerSampler", "flash_crowd", "kill_leftovers",
           "knee_of", "knee_sweep", "probe_of", "read_marks", "sweep_counts"]
