"""A discrete-event simulator that drives the real scaling policy over workload traces.

``trace`` reads and realises workloads; ``engine`` simulates one pool under a
policy and its fleet semantics; ``policies`` and ``oracle`` are what is
compared; ``metrics`` summarises a run; ``bench`` runs every policy on a trace and
``report`` presents the runs.  The command lines are in ``flexiqd.cli.bench``.
"""
