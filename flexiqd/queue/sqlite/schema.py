"""DDL of the SQLite store, kept as constants so a reader sees the whole schema at once.

A queued job is either *due* (``delayed = 0``: its run_at has come, it may be
claimed) or *delayed* (``delayed = 1``: waiting for its run_at).  Enqueue and
retries decide which; promotion (``SQLiteBackend._promote``) makes delayed jobs
whose run_at has come due, in the transaction of the claim or stats read that
needs them, at a cost of the jobs promoted.  The public state of both is "queued".

Indexes are partial so each serves one hot path and costs nothing for rows
outside it:
- jobs_claim walks due jobs in claim order (priority, run_at, id) -- the
  claim is an index walk, never a sort, however long the backlog;
- jobs_age answers "oldest runnable" per tenant in O(log n);
- jobs_due finds the delayed jobs whose run_at has come, for promotion;
- jobs_lease finds expired leases in O(log n);
- jobs_finished serves duration percentiles and retention;
- jobs_coming counts one queue's delayed jobs due within a horizon (bounded: see
  ``COMING_DUE_LIMIT``); jobs_running gives one queue's running jobs' start times;
- executions_worker finds a worker's first claim (its start cost).

``counts`` is kept by triggers so depth, delayed, running and dead are read, not
counted: one row per (queue, state, tenant) that holds jobs, delayed jobs under
the state "delayed".  A row whose count reaches 0 is deleted, so tenants that
once had jobs cost nothing.  ``rates`` is keyed by second before tenant, so a
window is one range however many tenants ever had events.

``lease_outcome`` ('release' or 'fail') is set by ``abandon``: applied when the
lease's owner is gone, instead of counting the job as lost.

Dependency limits (v5, re-encoded in v8 as store/rows.py says for both stores): a
queued job a worker deferred because a dependency was full has ``waiting_for``
= the dependency until a worker claims it again, and ``delayed = 1`` until its
run_at: promoted through jobs_due without counting as an arrival, outside the
jobs_coming range (not work coming due), and then claimable -- but counted
under the state "waiting" all along, and left out of jobs_age (the oldest
runnable job): more workers would not start it sooner.  ``dependency_holds`` has one row per job inside a
limited dependency (the concurrency slots), ``dependency_tat`` one GCRA time
per rate-limited dependency, ``dependency_hold_times`` the recent hold
durations and ``dependency_events`` per-second admissions and refusals.

Tenant caps (v6): ``tenant_caps`` holds the caps the workers last claimed with
(``ClaimRequest.tenant_caps``; tenant "*" for every other tenant), so that
``stats`` can tell the due jobs a cap holds back.  A claim counts a tenant's
running jobs from ``counts``; with tenants at their cap it reads the head of each
other tenant's due jobs through jobs_tenant_claim.
"""

from ..store.schema_steps import Kind, fresh_level, newest, steps_of

STEPS_TABLE = "schema_steps"  # which steps were applied; PRAGMA user_version: the level (store/schema_steps.py)

# -- pieces of the v3 schema: a new store and the migration to v3 share their text ----------

# The counts bucket of a job: its state, or "delayed" for a queued job not yet due.
_BUCKET = "CASE WHEN {row}.state = 'queued' AND {row}.delayed THEN 'delayed' ELSE {row}.state END"
_COUNT_ONE = f"""INSERT INTO counts (queue, state, tenant, n)
        VALUES (NEW.queue, {_BUCKET.format(row="NEW")}, NEW.tenant, 1)
        ON CONFLICT (queue, state, tenant) DO UPDATE SET n = n + 1;"""
_UNCOUNT_ONE = f"""UPDATE counts SET n = n - 1
        WHERE queue = OLD.queue AND state = {_BUCKET.format(row="OLD")} AND tenant = OLD.tenant;
    DELETE FROM counts
        WHERE queue = OLD.queue AND state = {_BUCKET.format(row="OLD")} AND tenant = OLD.tenant AND n = 0;"""

_V3_INDEXES = (
    "CREATE INDEX jobs_claim ON jobs(queue, priority DESC, run_at, id) "
    "WHERE state = 'queued' AND delayed = 0",
    "CREATE INDEX jobs_age ON jobs(queue, tenant, run_at) WHERE state = 'queued' AND delayed = 0",
    "CREATE INDEX jobs_due ON jobs(run_at) WHERE state = 'queued' AND delayed = 1",
)
_V3_COUNTS = """CREATE TABLE counts (
    queue TEXT NOT NULL,
    state TEXT NOT NULL,
    tenant TEXT NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (queue, state, tenant)
) WITHOUT ROWID"""
_V3_COUNT_TRIGGERS = (
    f"""CREATE TRIGGER jobs_count_insert AFTER INSERT ON jobs BEGIN
    {_COUNT_ONE}
END""",
    f"""CREATE TRIGGER jobs_count_update AFTER UPDATE OF state, delayed ON jobs
    WHEN OLD.state IS NOT NEW.state OR OLD.delayed IS NOT NEW.delayed BEGIN
    {_UNCOUNT_ONE}
    {_COUNT_ONE}
END""",
    f"""CREATE TRIGGER jobs_count_delete AFTER DELETE ON jobs BEGIN
    {_UNCOUNT_ONE}
END""",
)
# Per-second buckets: a rate over a window is the sum of its seconds' rows.
_V3_RATES = """CREATE TABLE rates (
    queue TEXT NOT NULL,
    second INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    arrivals INTEGER NOT NULL DEFAULT 0,
    completions INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, second, tenant)
) WITHOUT ROWID"""

# v4: work coming due counted per queue (a bounded index range), running jobs' ages read
# per queue, and a worker's first claim found among its finished attempts (start cost).
_V4_INDEXES = (
    "CREATE INDEX jobs_coming ON jobs(queue, run_at) WHERE state = 'queued' AND delayed = 1",
    "CREATE INDEX jobs_running ON jobs(queue, started_at) WHERE state = 'running'",
    "CREATE INDEX executions_worker ON executions(worker, started_at)",
)

# v5: dependency limits (Backend.admit).  The counts bucket learns "waiting" (waiting_for set).
_BUCKET_V5 = ("CASE WHEN {row}.state = 'queued' AND {row}.waiting_for IS NOT NULL THEN 'waiting' "
              "WHEN {row}.state = 'queued' AND {row}.delayed THEN 'delayed' ELSE {row}.state END")
_COUNT_ONE_V5 = f"""INSERT INTO counts (queue, state, tenant, n)
        VALUES (NEW.queue, {_BUCKET_V5.format(row="NEW")}, NEW.tenant, 1)
        ON CONFLICT (queue, state, tenant) DO UPDATE SET n = n + 1;"""
_UNCOUNT_ONE_V5 = f"""UPDATE counts SET n = n - 1
        WHERE queue = OLD.queue AND state = {_BUCKET_V5.format(row="OLD")} AND tenant = OLD.tenant;
    DELETE FROM counts
        WHERE queue = OLD.queue AND state = {_BUCKET_V5.format(row="OLD")} AND tenant = OLD.tenant AND n = 0;"""
_V5_COUNT_TRIGGERS = (
    f"""CREATE TRIGGER jobs_count_insert AFTER INSERT ON jobs BEGIN
    {_COUNT_ONE_V5}
END""",
    f"""CREATE TRIGGER jobs_count_update AFTER UPDATE OF state, delayed, waiting_for ON jobs
    WHEN OLD.state IS NOT NEW.state OR OLD.delayed IS NOT NEW.delayed
        OR OLD.waiting_for IS NOT NEW.waiting_for BEGIN
    {_UNCOUNT_ONE_V5}
    {_COUNT_ONE_V5}
END""",
    f"""CREATE TRIGGER jobs_count_delete AFTER DELETE ON jobs BEGIN
    {_UNCOUNT_ONE_V5}
END""",
)
_V5_TABLES = (
    """CREATE TABLE dependency_holds (
    dependency TEXT NOT NULL,
    job_id INTEGER NOT NULL,
    owner TEXT NOT NULL,
    since REAL NOT NULL,
    PRIMARY KEY (dependency, job_id)
) WITHOUT ROWID""",
    "CREATE INDEX dependency_holds_job ON dependency_holds(job_id)",
    """CREATE TABLE dependency_tat (
    dependency TEXT PRIMARY KEY,
    tat REAL NOT NULL
) WITHOUT ROWID""",
    """CREATE TABLE dependency_hold_times (
    dependency TEXT NOT NULL,
    ended_at REAL NOT NULL,
    seconds REAL NOT NULL
)""",
    "CREATE INDEX dependency_hold_times_recent ON dependency_hold_times(dependency, ended_at)",
    "CREATE INDEX dependency_hold_times_age ON dependency_hold_times(ended_at)",
    """CREATE TABLE dependency_events (
    dependency TEXT NOT NULL,
    second INTEGER NOT NULL,
    admitted INTEGER NOT NULL DEFAULT 0,
    deferred INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (dependency, second)
) WITHOUT ROWID""",
    # Waiting jobs whose wait is over, for promotion; the ones waiting for a dependency.
    "CREATE INDEX jobs_waiting ON jobs(run_at) WHERE state = 'queued' AND delayed = 2",
    "CREATE INDEX jobs_waiting_for ON jobs(waiting_for) WHERE state = 'queued' AND waiting_for IS NOT NULL",
)
# The oldest runnable job leaves out the ones waiting for a dependency.
_V5_AGE_INDEX = ("CREATE INDEX jobs_age ON jobs(queue, tenant, run_at) "
                 "WHERE state = 'queued' AND delayed = 0 AND waiting_for IS NULL")

# v6: tenant caps, as the workers last claimed with them.
_V6_TABLES = (
    """CREATE TABLE tenant_caps (
    tenant TEXT PRIMARY KEY,
    max_running INTEGER NOT NULL
) WITHOUT ROWID""",
    # One tenant's due jobs in claim order: the head of each tenant not at its cap.
    "CREATE INDEX jobs_tenant_claim ON jobs(queue, tenant, priority DESC, run_at, id) "
    "WHERE state = 'queued' AND delayed = 0",
)
# Hosts of a fleet (v7): each flexiqd's last heartbeat and what it reported
# (flexiqd.queue.hosts).  On SQLite there is one host, kept by the same code as on
# PostgreSQL.
_V7_HOSTS = """CREATE TABLE hosts (
    name TEXT PRIMARY KEY,
    last_beat REAL NOT NULL,
    interval REAL NOT NULL,
    report TEXT NOT NULL DEFAULT '{}',
    registered_at REAL NOT NULL
) WITHOUT ROWID"""

# v8: one encoding of a job waiting for a dependency in both stores (store/rows.py): ``waiting_for``
# set, and ``delayed`` (1, not 2) until its wait is over -- promoted through jobs_due like
# any delayed job (promotion tells them apart by waiting_for), left out of jobs_coming.
_V8_COMING_INDEX = ("CREATE INDEX jobs_coming ON jobs(queue, run_at) "
                    "WHERE state = 'queued' AND delayed = 1 AND waiting_for IS NULL")

# v9: shares of concurrency limits (flexiqd.queue.store.shares), as on PostgreSQL: each worker
# admits against its own share, in memory between its exchanges.
_V9_TABLES = (
    """CREATE TABLE dependency_shares (
    dependency TEXT NOT NULL,
    owner TEXT NOT NULL,
    slots INTEGER NOT NULL,
    expires REAL NOT NULL,
    wanted INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (dependency, owner)
) WITHOUT ROWID""",
    "CREATE INDEX dependency_holds_owner ON dependency_holds(owner, dependency)",
)

# v10: the schedules' ledger (flexiqd.queue.schedules): one row per decided slot, keyed by
# (schedule, kind, slot as UTC epoch seconds), apart from the jobs and their retention; and
# one row per schedule (first seen, paused, totals).  Expand-only: older daemons ignore them.
_V10_TABLES = (
    """CREATE TABLE schedules (
    name TEXT PRIMARY KEY,
    since REAL NOT NULL,
    paused INTEGER NOT NULL DEFAULT 0,
    fired INTEGER NOT NULL DEFAULT 0,
    skipped INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID""",
    """CREATE TABLE schedule_slots (
    schedule TEXT NOT NULL,
    kind TEXT NOT NULL,
    slot REAL NOT NULL,
    outcome TEXT,
    reason TEXT,
    slots INTEGER NOT NULL DEFAULT 1,
    job_id INTEGER,
    host TEXT NOT NULL,
    decided_at REAL NOT NULL,
    PRIMARY KEY (schedule, kind, slot)
) WITHOUT ROWID""",
)

# v11: the tasks' declarations (flexiqd.queue.declarations): the queue, priority, attempts
# and timeout each task declares, written by the workers that run it, read by an enqueue by
# name.  Expand-only: older daemons ignore the table.
_V11_TABLES = (
    """CREATE TABLE task_declarations (
    task TEXT PRIMARY KEY,
    queue TEXT NOT NULL,
    priority INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    timeout REAL,
    declared_at REAL NOT NULL,
    declared_by TEXT NOT NULL
) WITHOUT ROWID""",
)

# v12: the store's clock (flexiqd.queue.store.clock): the anchor every process of one boot counts
# from, so a step of the wall clock moves no lease and no run-at.  One row.  Expand-only.
_V12_CLOCK = """CREATE TABLE clock (
    boot TEXT NOT NULL,
    at REAL NOT NULL,
    since REAL NOT NULL
)"""

# Statements that bring a store of the version before each key up to it, in order;
# a new store gets SCHEMA whole.  Append, never edit: stores in the field ran them.
#
# Each step declares its kind in KINDS, as postgres/schema.py's (flexiqd.queue.store.schema_steps):
# EXPAND (new tables, columns with a default or NULL, indexes, triggers older code's writes
# satisfy) is applied at once; CONTRACT (a drop, a rename, a new meaning for existing rows)
# waits until no host of an older flexiqd beats -- here the one host, whose workers an
# upgrade leaves running the older code until they end.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    # v2: what to do with a job whose worker exits while it may still run (Backend.abandon).
    2: ("ALTER TABLE jobs ADD COLUMN lease_outcome TEXT",),
    # v3: stats cheap at any shape -- delayed jobs counted apart and promoted when due,
    # counts rows of emptied tenants deleted, rates read by window.
    3: (
        "ALTER TABLE jobs ADD COLUMN delayed INTEGER NOT NULL DEFAULT 0",
        "DROP TRIGGER jobs_count_insert",
        "DROP TRIGGER jobs_count_update",
        "DROP TRIGGER jobs_count_delete",
        "UPDATE jobs SET delayed = 1 WHERE state = 'queued' "
        "AND run_at > (julianday('now') - 2440587.5) * 86400.0",
        "DROP INDEX jobs_claim",
        "DROP INDEX jobs_age",
        *_V3_INDEXES,
        "DROP TABLE counts",
        _V3_COUNTS,
        f"INSERT INTO counts (queue, state, tenant, n) "
        f"SELECT queue, {_BUCKET.format(row='jobs')}, tenant, COUNT(*) FROM jobs GROUP BY 1, 2, 3",
        *_V3_COUNT_TRIGGERS,
        "ALTER TABLE rates RENAME TO rates_v2",
        _V3_RATES,
        "INSERT INTO rates (queue, second, tenant, arrivals, completions, failures) "
        "SELECT queue, second, tenant, arrivals, completions, failures FROM rates_v2",
        "DROP TABLE rates_v2",
    ),
    4: _V4_INDEXES,
    5: (
        "ALTER TABLE jobs ADD COLUMN waiting_for TEXT",
        "DROP TRIGGER jobs_count_insert",
        "DROP TRIGGER jobs_count_update",
        "DROP TRIGGER jobs_count_delete",
        *_V5_COUNT_TRIGGERS,
        "DROP INDEX jobs_age",
        _V5_AGE_INDEX,
        *_V5_TABLES,
    ),
    6: _V6_TABLES,
    7: (_V7_HOSTS,),
    8: (
        "UPDATE jobs SET delayed = 1 WHERE delayed = 2",
        "DROP INDEX jobs_waiting",
        "DROP INDEX jobs_coming",
        _V8_COMING_INDEX,
    ),
    9: _V9_TABLES,
    10: _V10_TABLES,
    11: _V11_TABLES,
    12: (_V12_CLOCK,),
}

SCHEMA: tuple[str, ...] = (
    """CREATE TABLE jobs (
    id INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    task TEXT NOT NULL,
    payload TEXT NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL,
    run_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    timeout REAL,
    idempotency_key TEXT,
    tenant TEXT NOT NULL DEFAULT '',
    lease_owner TEXT,
    lease_expires REAL,
    enqueued_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    result TEXT,
    error TEXT,
    lease_outcome TEXT,
    delayed INTEGER NOT NULL DEFAULT 0,
    waiting_for TEXT
)""",
    *(index for index in _V3_INDEXES if not index.startswith("CREATE INDEX jobs_age ")),
    _V5_AGE_INDEX,
    "CREATE INDEX jobs_lease ON jobs(lease_expires) WHERE state = 'running'",
    "CREATE INDEX jobs_finished ON jobs(queue, state, finished_at) WHERE finished_at IS NOT NULL",
    "CREATE UNIQUE INDEX jobs_idempotency ON jobs(idempotency_key) "
    "WHERE idempotency_key IS NOT NULL AND state IN ('queued', 'running')",
    _V3_COUNTS,
    *_V5_COUNT_TRIGGERS,
    _V3_RATES,
    # Who ran what: one row per attempt that ended (settled, or lost with its worker).
    """CREATE TABLE executions (
    id INTEGER PRIMARY KEY,
    job_id INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    worker TEXT NOT NULL,
    started_at REAL,
    finished_at REAL NOT NULL,
    outcome TEXT NOT NULL,
    error TEXT
)""",
    "CREATE INDEX executions_job ON executions(job_id)",
    *(index for index in _V4_INDEXES if not index.startswith("CREATE INDEX jobs_coming ")),
    _V8_COMING_INDEX,
    *(statement for statement in _V5_TABLES if not statement.startswith("CREATE INDEX jobs_waiting ")),
    *_V6_TABLES,
    _V7_HOSTS,
    *_V9_TABLES,
    *_V10_TABLES,
    *_V11_TABLES,
    _V12_CLOCK,
)

# Steps 1-9 came before the rule: each refused the code before it.
KINDS: dict[int, Kind] = {**{number: Kind.BREAKING for number in range(1, 10)},
                          10: Kind.EXPAND, 11: Kind.EXPAND, 12: Kind.EXPAND}

STEPS = steps_of(MIGRATIONS, KINDS)
SCHEMA_VERSION = newest(STEPS)  # the newest step, as reported
SCHEMA_LEVEL = fresh_level(STEPS)  # what a store this code creates records for older code
