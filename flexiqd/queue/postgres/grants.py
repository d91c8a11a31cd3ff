"""The privileges a PostgreSQL role needs to enqueue into the store, and nothing more.

A producer (a web application) adds jobs; it must not claim, settle, delete or read
other jobs' arguments and results.  An enqueue (``Store.enqueue``) touches exactly:

- ``flexiq_schema`` and ``flexiq_schema_steps``: the schema check every process makes when
  it opens the store; and, while a contract step waits for older hosts to go, the
  beats of ``flexiq_hosts`` (``last_beat``, ``interval``, ``report``: no job data);
- ``flexiq_task_declarations``: an enqueue by name takes the task's queue, priority,
  attempts and timeout from there (SELECT);
- ``flexiq_jobs``: INSERT, the id from its identity sequence, and SELECT on the three
  columns an idempotency key's conflict is resolved with (``id``, ``idempotency_key``,
  ``state``) -- never ``payload``, ``result`` or ``error``;
- ``flexiq_count_changes`` (written by the insert trigger, which runs as the caller) and
  ``flexiq_rate_changes`` (the arrivals): INSERT only;
- ``pg_notify``, which needs no privilege.

The SQL function ``flexiq_enqueue`` runs with its caller's privileges (and PostgreSQL lets
every role execute a function unless told otherwise), so these grants serve it too.

``tests/integration/test_postgres_producer_role.py`` enqueues as a role with exactly
these grants, and checks that it can do nothing else.  A schema change that makes an
enqueue touch another table must add it here: that test fails until it does.
"""

from __future__ import annotations

import re

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_$]*$")

# (privilege, object kind, object) in the order they are granted.
PRODUCER_PRIVILEGES: tuple[tuple[str, str, str], ...] = (
    ("SELECT", "TABLE", "flexiq_schema"),
    ("SELECT", "TABLE", "flexiq_schema_steps"),
    ("SELECT (last_beat, interval, report)", "TABLE", "flexiq_hosts"),
    ("SELECT", "TABLE", "flexiq_task_declarations"),
    ("INSERT", "TABLE", "flexiq_jobs"),
    ("SELECT (id, idempotency_key, state)", "TABLE", "flexiq_jobs"),
    ("USAGE", "SEQUENCE", "flexiq_jobs_id_seq"),
    ("INSERT", "TABLE", "flexiq_count_changes"),
    ("INSERT", "TABLE", "flexiq_rate_changes"),
)


def check_identifier(name: str, what: str) -> str:
    """``name`` when it is a plain lower-case SQL identifier (no quoting needed); ValueError otherwise."""
    if not _IDENTIFIER.match(name) or len(name) > 63:
        raise ValueError(f"{what} {name!r} is not a plain PostgreSQL name (lower-case letters, digits, "
                         f"_ and $, at most 63 characters, not starting with a digit)")
    return name


def producer_grants(role: str, schema: str = "public") -> list[str]:
    """The statements that let ``role`` enqueue into the store in ``schema``, one per line.

    Run them as the store's owner once its tables exist (the daemon's first start makes
    them).  Pure; raises ValueError for a name that would need quoting.
    """
    role = check_identifier(role, "role")
    schema = check_identifier(schema, "schema")
    return [f"GRANT USAGE ON SCHEMA {schema} TO {role};",
            *(f"GRANT {privilege} ON {kind} {schema}.{name} TO {role};"
              for privilege, kind, name in PRODUCER_PRIVILEGES)]
