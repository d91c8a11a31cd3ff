"""The store's lifecycle and its contract, written once over every SQL dialect.

``backend`` is the interface every caller uses; ``lifecycle.Store`` implements it over
a dialect's ``dialect.Database``; ``admission`` decides which jobs enter their
dependencies; ``endings``, ``figures``, ``rows``, ``shares``, ``clock`` and
``schema_steps`` are what both dialects share.  The dialects are packages beside this
one (``flexiqd.queue.sqlite``, ``flexiqd.queue.postgres``): each holds only its SQL,
its transactions, its schema and its migrations.  Nothing is imported here, so a
process loads only the parts it uses.
"""
