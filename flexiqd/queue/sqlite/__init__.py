"""The SQLite dialect (the embedded store): its SQL and transactions (``database``), its
schema and migrations (``schema``), its file checks (``check``), the disk under it
(``disk``) and its wake-ups (``watch`` over ``file_watch``).

Nothing is imported here, so a process loads only the parts it uses.
"""
