"""The SQLite dialect (the embedded store): its SQL (``sql``); its connection, transactions
and the running of its migrations (``database``); its schema and migration steps
(``schema``); its file checks (``check``); the disk under it (``disk``); and its wake-ups
(``watch`` over ``file_watch``).

Nothing is imported here, so a process loads only the parts it uses.
"""
