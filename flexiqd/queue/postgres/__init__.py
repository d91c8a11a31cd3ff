"""The PostgreSQL dialect (a store shared by many machines): its SQL (``sql``); its
connection, transactions and the running of its migrations (``database``); its schema and
migration steps (``schema``); its wake-ups (``listen``); and the grants of a producer role
(``grants``).

Nothing is imported here, so a process loads only the parts it uses.
"""
