"""DDL of the SQLite store, kept as constants so a reader sees the whole schema at once.

Indexes are partial so each serves one hot path and costs nothing for rows
outside it:
- jobs_claim walks runnable jobs in claim order (priority, run_at, id) -- the
  claim is an index walk, never a sort, however long the backlog;
- jobs_age answers "oldest runnable" and "how many delayed" per tenant in O(log n);
- jobs_lease finds expired leases in O(log n);

``lease_outcome`` ('release' or 'fail') is set by ``abandon``: applied when the
lease's owner is gone, instead of counting the job as lost.
- jobs_finished serves duration percentiles and retention;
- counts is kept by triggers so depth/running/dead are read, not counted.
"""

SCHEMA_VERSION = 2

# Statements that bring a store of the version before each key up to it, in order;
# a new store gets SCHEMA whole.  Append, never edit: stores in the field ran them.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    # v2: what to do with a job whose worker exits while it may still run (Backend.abandon).
    2: ("ALTER TABLE jobs ADD COLUMN lease_outcome TEXT",),
}

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
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
    lease_outcome TEXT
);
CREATE INDEX IF NOT EXISTS jobs_claim ON jobs(queue, priority DESC, run_at, id)
    WHERE state = 'queued';
CREATE INDEX IF NOT EXISTS jobs_age ON jobs(queue, tenant, run_at)
    WHERE state = 'queued';
CREATE INDEX IF NOT EXISTS jobs_lease ON jobs(lease_expires)
    WHERE state = 'running';
CREATE INDEX IF NOT EXISTS jobs_finished ON jobs(queue, state, finished_at)
    WHERE finished_at IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS jobs_idempotency ON jobs(idempotency_key)
    WHERE idempotency_key IS NOT NULL AND state IN ('queued', 'running');

CREATE TABLE IF NOT EXISTS counts (
    queue TEXT NOT NULL,
    tenant TEXT NOT NULL,
    state TEXT NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (queue, tenant, state)
) WITHOUT ROWID;

CREATE TRIGGER IF NOT EXISTS jobs_count_insert AFTER INSERT ON jobs BEGIN
    INSERT INTO counts(queue, tenant, state, n) VALUES (NEW.queue, NEW.tenant, NEW.state, 1)
        ON CONFLICT(queue, tenant, state) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER IF NOT EXISTS jobs_count_update AFTER UPDATE OF state ON jobs
    WHEN OLD.state IS NOT NEW.state BEGIN
    UPDATE counts SET n = n - 1
        WHERE queue = OLD.queue AND tenant = OLD.tenant AND state = OLD.state;
    INSERT INTO counts(queue, tenant, state, n) VALUES (NEW.queue, NEW.tenant, NEW.state, 1)
        ON CONFLICT(queue, tenant, state) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER IF NOT EXISTS jobs_count_delete AFTER DELETE ON jobs BEGIN
    UPDATE counts SET n = n - 1
        WHERE queue = OLD.queue AND tenant = OLD.tenant AND state = OLD.state;
END;

-- Per-second buckets: a rate over a window is a sum of at most `window` rows.
CREATE TABLE IF NOT EXISTS rates (
    queue TEXT NOT NULL,
    tenant TEXT NOT NULL,
    second INTEGER NOT NULL,
    arrivals INTEGER NOT NULL DEFAULT 0,
    completions INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, tenant, second)
) WITHOUT ROWID;

-- Who ran what: one row per attempt that ended (settled, or lost with its worker).
CREATE TABLE IF NOT EXISTS executions (
    id INTEGER PRIMARY KEY,
    job_id INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    worker TEXT NOT NULL,
    started_at REAL,
    finished_at REAL NOT NULL,
    outcome TEXT NOT NULL,
    error TEXT
);
CREATE INDEX IF NOT EXISTS executions_job ON executions(job_id);
"""
