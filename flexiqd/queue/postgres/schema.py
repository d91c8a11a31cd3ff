"""DDL of the PostgreSQL store, kept as constants so a reader sees the whole schema at once.

The same model as the SQLite store (see sqlite/schema.py): a queued job is *due*
(``delayed = false``) or *delayed*; partial indexes each serve one hot path
(flexiq_jobs_claim is walked in claim order with ``FOR UPDATE SKIP LOCKED``, so
workers claiming at once take different jobs and never wait on each other).

Depth per (queue, state, tenant) and events per (queue, second, tenant) are kept so
``stats()`` reads instead of counting -- but never by updating shared rows in the
transactions of enqueue, claim and settle: a row every transaction updates is a
lock every transaction waits for, held until its commit, and two such rows taken in
different orders by different transactions are a deadlock.  So those transactions
only *append* rows -- ``flexiq_count_changes`` (by statement-level triggers over
transition tables: a claim of 100 jobs appends two rows) and ``flexiq_rate_changes``
-- and a *fold* (``PostgresBackend._fold``, run by stats reads and maintenance) moves
them into the totals ``flexiq_counts`` and ``flexiq_rates`` in one statement each.
Readers add the changes not folded yet, so the figures are exact either way.

Tables carry a ``flexiq_`` prefix: the store may share a database (or schema) with
an application.  ``flexiq_schema`` holds the schema version; whichever process
opens the store first creates or migrates it under a transaction-scoped advisory
lock, so processes starting together never run the DDL twice.

Autovacuum is tuned per table where the write pattern is known (docs/postgresql.md):
jobs is vacuumed at 2% dead rows instead of 20%, the small tables that are
rewritten all day after a fixed number of dead rows.
"""

from ..store.schema_steps import Kind, fresh_level, newest, steps_of

VERSION_TABLE = "flexiq_schema"  # the level older code checks (see store/schema_steps.py)
STEPS_TABLE = "flexiq_schema_steps"  # which steps were applied, read by this code alone

_BUCKET = "CASE WHEN state = 'queued' AND delayed THEN 'delayed' ELSE state END"

# One function serves the three triggers: each names its transition tables
# new_rows / old_rows; a branch only reads the ones its event has.
_COUNT_FUNCTION = f"""CREATE FUNCTION flexiq_count_changes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO flexiq_count_changes (queue, state, tenant, n)
            SELECT queue, {_BUCKET}, tenant, count(*) FROM new_rows GROUP BY 1, 2, 3;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO flexiq_count_changes (queue, state, tenant, n)
            SELECT queue, {_BUCKET}, tenant, -count(*) FROM old_rows GROUP BY 1, 2, 3;
    ELSE
        INSERT INTO flexiq_count_changes (queue, state, tenant, n)
            SELECT queue, bucket, tenant, sum(n) FROM (
                SELECT queue, {_BUCKET} AS bucket, tenant, 1 AS n FROM new_rows
                UNION ALL
                SELECT queue, {_BUCKET}, tenant, -1 FROM old_rows) AS moves
            GROUP BY 1, 2, 3 HAVING sum(n) <> 0;
    END IF;
    RETURN NULL;
END
$$"""

# Small tables rewritten all day: vacuumed after a fixed number of dead rows (not a
# fraction of a tiny table); the totals leave room on each page for updates in place.
_VACUUM_OFTEN = ("autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, "
                 "autovacuum_vacuum_cost_delay = 0")
_SMALL_AND_BUSY = f"fillfactor = 50, {_VACUUM_OFTEN}"

# v2: dependency limits (Backend.admit), as the SQLite store's v5.  A job a worker deferred
# has ``waiting_for`` = the dependency until a worker claims it again, and is ``delayed``
# until its wait is over: promoted through flexiq_jobs_due without counting as an arrival,
# then claimable -- but counted under the bucket "waiting" all along, and left out of the
# oldest runnable job (flexiq_jobs_age) and of the jobs coming due (flexiq_jobs_coming).
# ``flexiq_dependencies`` has one row per limited dependency: its GCRA time, and the row an
# admission locks (FOR UPDATE), so admissions from many hosts to one dependency take turns
# and never exceed its limit.  Holds, hold times and per-second events as in SQLite.
# Tenant caps: ``flexiq_tenant_caps`` as SQLite's ``tenant_caps``; a claim that would take
# jobs of a capped tenant holds a transaction-scoped advisory lock of that tenant while it
# counts the tenant's running jobs and leases more, so claims on many hosts take turns.
_BUCKET_V2 = ("CASE WHEN state = 'queued' AND waiting_for IS NOT NULL THEN 'waiting' "
              "WHEN state = 'queued' AND delayed THEN 'delayed' ELSE state END")
_V2_TABLES = (
    f"""CREATE TABLE flexiq_dependencies (
    dependency text PRIMARY KEY,
    tat double precision
) WITH ({_SMALL_AND_BUSY})""",
    """CREATE TABLE flexiq_dependency_holds (
    dependency text NOT NULL,
    job_id bigint NOT NULL,
    owner text NOT NULL,
    since double precision NOT NULL,
    PRIMARY KEY (dependency, job_id)
)""",
    "CREATE INDEX flexiq_dependency_holds_job ON flexiq_dependency_holds (job_id)",
    """CREATE TABLE flexiq_dependency_hold_times (
    dependency text NOT NULL,
    ended_at double precision NOT NULL,
    seconds double precision NOT NULL
)""",
    "CREATE INDEX flexiq_dependency_hold_times_recent ON flexiq_dependency_hold_times (dependency, ended_at)",
    "CREATE INDEX flexiq_dependency_hold_times_age ON flexiq_dependency_hold_times (ended_at)",
    # Updated under the dependency's row lock only: no contention of its own.
    f"""CREATE TABLE flexiq_dependency_events (
    dependency text NOT NULL,
    second bigint NOT NULL,
    admitted bigint NOT NULL DEFAULT 0,
    deferred bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (dependency, second)
) WITH ({_SMALL_AND_BUSY})""",
    "CREATE INDEX flexiq_jobs_waiting_for ON flexiq_jobs (waiting_for) "
    "WHERE state = 'queued' AND waiting_for IS NOT NULL",
    # Tenant caps, as the workers last claimed with them (tenant "*": every other tenant).
    """CREATE TABLE flexiq_tenant_caps (
    tenant text PRIMARY KEY,
    max_running integer NOT NULL
)""",
    # One tenant's due jobs in claim order: the head of each tenant not at its cap.
    "CREATE INDEX flexiq_jobs_tenant_claim ON flexiq_jobs (queue, tenant, priority DESC, run_at, id) "
    "WHERE state = 'queued' AND NOT delayed",
)
_V2_AGE_INDEX = ("CREATE INDEX flexiq_jobs_age ON flexiq_jobs (queue, tenant, run_at) "
                 "WHERE state = 'queued' AND NOT delayed AND waiting_for IS NULL")
_V2_COMING_INDEX = ("CREATE INDEX flexiq_jobs_coming ON flexiq_jobs (queue, run_at) "
                    "WHERE state = 'queued' AND delayed AND waiting_for IS NULL")

SCHEMA: tuple[str, ...] = (
    """CREATE TABLE flexiq_jobs (
    id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    task text NOT NULL,
    payload text NOT NULL,
    priority integer NOT NULL DEFAULT 0,
    state text NOT NULL,
    delayed boolean NOT NULL DEFAULT false,
    run_at double precision NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL,
    timeout double precision,
    idempotency_key text,
    tenant text NOT NULL DEFAULT '',
    lease_owner text,
    lease_expires double precision,
    lease_outcome text,
    enqueued_at double precision NOT NULL,
    started_at double precision,
    finished_at double precision,
    result text,
    error text,
    waiting_for text
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02,
        autovacuum_vacuum_insert_scale_factor = 0.02)""",
    "CREATE INDEX flexiq_jobs_claim ON flexiq_jobs (queue, priority DESC, run_at, id) "
    "WHERE state = 'queued' AND NOT delayed",
    _V2_AGE_INDEX,
    "CREATE INDEX flexiq_jobs_due ON flexiq_jobs (run_at) WHERE state = 'queued' AND delayed",
    _V2_COMING_INDEX,
    "CREATE INDEX flexiq_jobs_lease ON flexiq_jobs (lease_expires) WHERE state = 'running'",
    "CREATE INDEX flexiq_jobs_owner ON flexiq_jobs (lease_owner) WHERE state = 'running'",
    "CREATE INDEX flexiq_jobs_running ON flexiq_jobs (queue, started_at) WHERE state = 'running'",
    "CREATE INDEX flexiq_jobs_finished ON flexiq_jobs (queue, state, finished_at) "
    "WHERE finished_at IS NOT NULL",
    "CREATE UNIQUE INDEX flexiq_jobs_idempotency ON flexiq_jobs (idempotency_key) "
    "WHERE idempotency_key IS NOT NULL AND state IN ('queued', 'running')",
    # Totals, written by the fold alone; a row whose count reaches 0 is deleted.
    f"""CREATE TABLE flexiq_counts (
    queue text NOT NULL,
    state text NOT NULL,
    tenant text NOT NULL,
    n bigint NOT NULL,
    PRIMARY KEY (queue, state, tenant)
) WITH ({_SMALL_AND_BUSY})""",
    # Appended by the triggers, moved into flexiq_counts by the fold.
    f"""CREATE TABLE flexiq_count_changes (
    queue text NOT NULL,
    state text NOT NULL,
    tenant text NOT NULL,
    n bigint NOT NULL
) WITH ({_VACUUM_OFTEN})""",
    "CREATE INDEX flexiq_count_changes_queue ON flexiq_count_changes (queue)",
    _COUNT_FUNCTION.replace(_BUCKET, _BUCKET_V2),
    "CREATE TRIGGER flexiq_jobs_count_insert AFTER INSERT ON flexiq_jobs "
    "REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION flexiq_count_changes()",
    "CREATE TRIGGER flexiq_jobs_count_update AFTER UPDATE ON flexiq_jobs "
    "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows "
    "FOR EACH STATEMENT EXECUTE FUNCTION flexiq_count_changes()",
    "CREATE TRIGGER flexiq_jobs_count_delete AFTER DELETE ON flexiq_jobs "
    "REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION flexiq_count_changes()",
    # Per-second totals: a rate over a window is the sum of its seconds' rows.
    f"""CREATE TABLE flexiq_rates (
    queue text NOT NULL,
    second bigint NOT NULL,
    tenant text NOT NULL,
    arrivals bigint NOT NULL DEFAULT 0,
    completions bigint NOT NULL DEFAULT 0,
    failures bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, second, tenant)
) WITH ({_SMALL_AND_BUSY})""",
    # Appended by each transaction with events, moved into flexiq_rates by the fold.
    f"""CREATE TABLE flexiq_rate_changes (
    queue text NOT NULL,
    second bigint NOT NULL,
    tenant text NOT NULL,
    arrivals bigint NOT NULL DEFAULT 0,
    completions bigint NOT NULL DEFAULT 0,
    failures bigint NOT NULL DEFAULT 0
) WITH ({_VACUUM_OFTEN})""",
    "CREATE INDEX flexiq_rate_changes_queue ON flexiq_rate_changes (queue, second)",
    # Who ran what: one row per attempt that ended (settled, or lost with its worker).
    """CREATE TABLE flexiq_executions (
    id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    worker text NOT NULL,
    started_at double precision,
    finished_at double precision NOT NULL,
    outcome text NOT NULL,
    error text,
    -- The server's clock when the row was written: ids are handed out before commit, so a
    -- reader by id must know how long ago a gap in them opened (Backend.ended_attempts).
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp()
)""",
    "CREATE INDEX flexiq_executions_job ON flexiq_executions (job_id)",
    "CREATE INDEX flexiq_executions_worker ON flexiq_executions (worker, started_at)",
    *_V2_TABLES,
)

# Hosts of a fleet (v3): each flexiqd's last heartbeat and what it reported
# (flexiqd.queue.hosts): one small row per machine, written by that machine's daemon
# alone, so no two hosts ever wait on one row.
_V3_HOSTS = """CREATE TABLE flexiq_hosts (
    name text PRIMARY KEY,
    last_beat double precision NOT NULL,
    interval double precision NOT NULL,
    report text NOT NULL DEFAULT '{}',
    registered_at double precision NOT NULL
)"""
SCHEMA = (*SCHEMA, _V3_HOSTS)

# v4: fleet-wide concurrency limits without a row every admission locks (flexiqd.queue.store.shares).
# Each process admits against its own share of a limit (its row here, locked by itself
# alone); only growing a share locks the dependency's row.  Admissions and refusals are
# appended (folded into flexiq_dependency_events with the counts), not upserted into the
# dependency's row of the second.
_V4_TABLES = (
    f"""CREATE TABLE flexiq_dependency_shares (
    dependency text NOT NULL,
    owner text NOT NULL,
    slots integer NOT NULL,
    expires double precision NOT NULL,
    wanted integer NOT NULL DEFAULT 0,
    PRIMARY KEY (dependency, owner)
) WITH ({_SMALL_AND_BUSY})""",
    "CREATE INDEX flexiq_dependency_holds_owner ON flexiq_dependency_holds (owner, dependency)",
    f"""CREATE TABLE flexiq_dependency_event_changes (
    dependency text NOT NULL,
    second bigint NOT NULL,
    admitted bigint NOT NULL DEFAULT 0,
    deferred bigint NOT NULL DEFAULT 0
) WITH ({_VACUUM_OFTEN})""",
)
SCHEMA = (*SCHEMA, *_V4_TABLES)

# v5: the schedules' ledger (flexiqd.queue.schedules): one row per decided slot, keyed by
# (schedule, kind, slot as UTC epoch seconds), apart from the jobs and their retention; and
# one row per schedule (first seen, paused, totals).  Expand-only: older daemons ignore them.
_V5_TABLES = (
    """CREATE TABLE flexiq_schedules (
    name text PRIMARY KEY,
    since double precision NOT NULL,
    paused boolean NOT NULL DEFAULT false,
    fired bigint NOT NULL DEFAULT 0,
    skipped bigint NOT NULL DEFAULT 0
)""",
    """CREATE TABLE flexiq_schedule_slots (
    schedule text NOT NULL,
    kind text NOT NULL,
    slot double precision NOT NULL,
    outcome text,
    reason text,
    slots bigint NOT NULL DEFAULT 1,
    job_id bigint,
    host text NOT NULL,
    decided_at double precision NOT NULL,
    PRIMARY KEY (schedule, kind, slot)
)""",
)
SCHEMA = (*SCHEMA, *_V5_TABLES)

# v6: the tasks' declarations and enqueue from SQL (docs/transactional-enqueue.md).
# ``flexiq_task_declarations``: the queue, priority, attempts and timeout each task declares,
# upserted by the workers that run it (flexiqd.queue.declarations), read by an enqueue by
# name.  ``flexiq_enqueue(...)``: one job, in the caller's own transaction, written as
# ``core.Store.enqueue`` writes it -- the row (counted by the jobs' triggers), its arrival
# appended to the rate changes, a NOTIFY on its queue's channel (postgres_listen.channel_of),
# delivered at the caller's commit -- and its id returned.  Options left NULL take the task's
# declaration, else the defaults of ``types.NewJob``.  Times are the server's clock.
# ``SET search_path FROM CURRENT``: the function finds the store's tables wherever the
# caller's search_path points.  Expand-only: older daemons ignore both.
_V6_DECLARATIONS = """CREATE TABLE flexiq_task_declarations (
    task text PRIMARY KEY,
    queue text NOT NULL,
    priority integer NOT NULL,
    max_attempts integer NOT NULL,
    timeout double precision,
    declared_at double precision NOT NULL,
    declared_by text NOT NULL
)"""
_V6_ENQUEUE = """CREATE FUNCTION flexiq_enqueue(
    task text,
    args jsonb DEFAULT '[]',
    kwargs jsonb DEFAULT '{}',
    queue text DEFAULT NULL,
    priority integer DEFAULT NULL,
    delay double precision DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    timeout double precision DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    tenant text DEFAULT NULL
) RETURNS bigint LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    now_s double precision := extract(epoch FROM clock_timestamp());
    declared record;
    job_queue text;
    job_priority integer;
    job_attempts integer;
    job_timeout double precision;
    job_run_at double precision;
    job_tenant text := coalesce(flexiq_enqueue.tenant, '');
    job_id bigint;
    channel text;
BEGIN
    IF flexiq_enqueue.task IS NULL OR flexiq_enqueue.task = '' THEN
        RAISE EXCEPTION 'flexiq_enqueue: a job needs a task name' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF args IS NOT NULL AND jsonb_typeof(args) <> 'array' THEN
        RAISE EXCEPTION 'flexiq_enqueue: args must be a JSON array, got a JSON %', jsonb_typeof(args)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF kwargs IS NOT NULL AND jsonb_typeof(kwargs) <> 'object' THEN
        RAISE EXCEPTION 'flexiq_enqueue: kwargs must be a JSON object, got a JSON %', jsonb_typeof(kwargs)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT d.queue, d.priority, d.max_attempts, d.timeout INTO declared
        FROM flexiq_task_declarations d WHERE d.task = flexiq_enqueue.task;
    job_queue := coalesce(flexiq_enqueue.queue, declared.queue, 'default');
    job_priority := coalesce(flexiq_enqueue.priority, declared.priority, 0);
    job_attempts := coalesce(flexiq_enqueue.max_attempts, declared.max_attempts, 3);
    job_timeout := coalesce(flexiq_enqueue.timeout, declared.timeout);
    IF job_queue = '' THEN
        RAISE EXCEPTION 'flexiq_enqueue: queue must be a name, got an empty string'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF job_attempts < 1 THEN
        RAISE EXCEPTION 'flexiq_enqueue: max_attempts must be at least 1, got %', job_attempts
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF job_timeout IS NOT NULL AND NOT job_timeout > 0 THEN
        RAISE EXCEPTION 'flexiq_enqueue: timeout must be more than 0 seconds, got %', job_timeout
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF job_timeout = 'infinity' THEN  -- "no timeout", whatever the declaration says
        job_timeout := NULL;
    END IF;
    IF flexiq_enqueue.run_at IS NOT NULL THEN
        job_run_at := extract(epoch FROM flexiq_enqueue.run_at);
    ELSE
        job_run_at := now_s + greatest(coalesce(delay, 0), 0);
    END IF;
    LOOP
        INSERT INTO flexiq_jobs (queue, task, payload, priority, state, delayed, run_at, max_attempts,
                                 timeout, idempotency_key, tenant, enqueued_at)
            VALUES (job_queue, flexiq_enqueue.task,
                    jsonb_build_object('args', coalesce(args, '[]'), 'kwargs', coalesce(kwargs, '{}'))::text,
                    job_priority, 'queued', job_run_at > now_s, job_run_at, job_attempts, job_timeout,
                    flexiq_enqueue.idempotency_key, job_tenant, now_s)
            ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL
                AND state IN ('queued', 'running') DO NOTHING
            RETURNING id INTO job_id;
        EXIT WHEN job_id IS NOT NULL;
        -- A queued or running job holds the key: it stands for this one (unless it ended
        -- meanwhile; then the insert is tried again).
        SELECT j.id INTO job_id FROM flexiq_jobs j
            WHERE j.idempotency_key = flexiq_enqueue.idempotency_key AND j.state IN ('queued', 'running');
        IF job_id IS NOT NULL THEN
            RETURN job_id;
        END IF;
    END LOOP;
    IF job_run_at <= now_s THEN  -- a delayed job arrives, and wakes workers, when it comes due
        INSERT INTO flexiq_rate_changes (queue, second, tenant, arrivals)
            VALUES (job_queue, floor(now_s)::bigint, job_tenant, 1);
        channel := 'flexiq.' || job_queue;
        IF octet_length(channel) > 63 THEN
            channel := 'flexiq.' || left(encode(sha256(convert_to(job_queue, 'UTF8')), 'hex'), 40);
        END IF;
        PERFORM pg_notify(channel, '');
    END IF;
    RETURN job_id;
END
$$"""
_V6 = (_V6_DECLARATIONS, _V6_ENQUEUE)
SCHEMA = (*SCHEMA, *_V6)

# Statements that bring a store of the version before each key up to it, in order;
# a new store gets SCHEMA whole.  Append, never edit: stores in the field ran them.
#
# Each step declares its kind in KINDS (flexiqd.queue.store.schema_steps, docs/postgresql.md
# "Upgrading"): hosts of this version and of the one before share the schema during a
# rolling upgrade, so a step is EXPAND (a new table, a nullable column or one with a
# default, an index, a function: the older version does not see it) or CONTRACT (a drop,
# a rename, NOT NULL on an existing column, a new meaning for existing rows: applied only
# once no older host is alive, and this version's code must work without it).  Never
# both at once: a change the older version cannot live with is an expand step in one
# release and its contract step in the next.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: (
        "ALTER TABLE flexiq_jobs ADD COLUMN waiting_for text",
        _COUNT_FUNCTION.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION").replace(_BUCKET, _BUCKET_V2),
        "DROP INDEX flexiq_jobs_age",
        _V2_AGE_INDEX,
        "DROP INDEX flexiq_jobs_coming",
        _V2_COMING_INDEX,
        *_V2_TABLES,
    ),
    3: (_V3_HOSTS,),
    4: _V4_TABLES,
    5: _V5_TABLES,
    6: _V6,
}

# Steps 1-4 came before the rule: each refused the code before it.
KINDS: dict[int, Kind] = {
    1: Kind.BREAKING,
    2: Kind.BREAKING,
    3: Kind.BREAKING,
    4: Kind.BREAKING,
    5: Kind.EXPAND,
    6: Kind.EXPAND,
}

STEPS = steps_of(MIGRATIONS, KINDS)
SCHEMA_VERSION = newest(STEPS)  # the newest step, as reported
SCHEMA_LEVEL = fresh_level(STEPS)  # what a store this code creates records for older code
