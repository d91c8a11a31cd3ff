"""Periodic jobs (``schedules:`` in the config): the calendar and the decisions, both pure.

- ``calendar``: a cron expression in an IANA time zone -> the UTC instants it fires at,
  with the DST rules flexiqd promises (docs/schedules.md);
- ``plan``: the slots due since the ledger's newest one, and what becomes of each
  (fire, or skip and why), given ``now`` -- no clock reads, no I/O.

The store writes each decision in one transaction with the slot's ledger row
(``Backend.fire_slot``); the daemon's firing loop (``flexiqd.daemon.schedules``)
sequences them.
"""
