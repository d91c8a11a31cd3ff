"""flexiqd's HTTP endpoint: ``/metrics`` (Prometheus), ``/api/scaler`` (KEDA) and ``/health``.

- ``server``: the HTTP/1.1 server -- parsing, limits, the bearer token; knows no routes.
- ``routes``: which path answers what, from a snapshot or from the store.
- ``counters``: the true counters (arrivals, completions, durations ...) kept from the store.
- ``snapshot``: the immutable state the daemon publishes after each tick.
- ``metrics`` and ``scaler``: pure renderers, snapshot (or stats) in, answer out.
- ``daemon``: what the daemon wires in -- publishing snapshots and serving them.
- ``standalone``: ``flexiq scaler``, the KEDA endpoint served from the store alone.
"""
