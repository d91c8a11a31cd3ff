"""The PostgreSQL dialect (a store shared by many machines): its SQL and transactions
(``database``), its schema and migrations (``schema``), its wake-ups (``listen``) and
the grants of a producer role (``grants``).

Nothing is imported here, so a process loads only the parts it uses.
"""
