"""The PostgreSQL dialect's SQL: the statements of one transaction (``store.dialect.Tx``), in
PostgreSQL's words, over the schema of ``schema.py``.  The transactions they run in, the
connection, its retries and the migrations are ``database.py``'s.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import psycopg

from ..store.dialect import RateRow, Tx
from ..declarations import TaskDeclaration
from ..store.endings import Endings, LeasedRow
from ..store.figures import COMING_DUE_LIMIT, DURATION_HORIZON, DURATION_SAMPLE, READ_BUCKETS, Durations, StatsRows
from ..limits import TenantCaps
from .listen import channel_of
from ..store.rows import JOB_COLUMNS, in_claim_order, job_from_row
from ..store.shares import Share
from ..types import RECENT_WINDOW, Job, JobState

# A batch is one INSERT of arrays (one trigger run, one round trip), with ids taken from
# the sequence first so they follow the batch's order.  A live idempotency key makes a
# row's insert a no-op (the unique partial index decides, so two producers racing with
# one key cannot both insert); the job that holds the key is looked up after.
_NEW_JOB_TYPES = (("id", "bigint"), ("queue", "text"), ("task", "text"), ("payload", "text"),
                  ("priority", "integer"), ("state", "text"), ("delayed", "boolean"),
                  ("run_at", "double precision"), ("max_attempts", "integer"),
                  ("timeout", "double precision"), ("idempotency_key", "text"), ("tenant", "text"),
                  ("enqueued_at", "double precision"))
_INSERT_JOBS = (f"INSERT INTO flexiq_jobs ({', '.join(name for name, _ in _NEW_JOB_TYPES)}) "
                f"SELECT * FROM unnest({', '.join(f'%s::{kind}[]' for _, kind in _NEW_JOB_TYPES)}) "
                f"ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL "
                f"AND state IN ('queued', 'running') DO NOTHING RETURNING id")
_NEW_IDS = "SELECT nextval(pg_get_serial_sequence('flexiq_jobs', 'id')) FROM generate_series(1, %s)"

# A gap in the attempts' ids this old (seconds, server clock) will not be filled: no
# transaction of the store stays open that long after recording an attempt.
_GAP_SETTLE = 10.0

_UNLEASED = "lease_owner = NULL, lease_expires = NULL, lease_outcome = NULL"
_REQUEUED = f"state = 'queued', started_at = NULL, {_UNLEASED}"
# One statement per kind of ending (endings.Endings), and for the two a busy worker's
# batches are made of, one statement for the whole batch: psycopg 3.1's executemany
# sends a statement per row.
_ENDINGS = {
    "acks": (f"UPDATE flexiq_jobs SET state = 'done', finished_at = %s, result = %s, error = NULL, {_UNLEASED} "
             f"WHERE id = %s",
             f"UPDATE flexiq_jobs SET state = 'done', finished_at = v.finished_at, result = v.result, "
             f"error = NULL, {_UNLEASED} FROM unnest(%s::float8[], %s::text[], %s::bigint[]) "
             f"AS v(finished_at, result, id) WHERE flexiq_jobs.id = v.id"),
    "releases": (f"UPDATE flexiq_jobs SET {_REQUEUED}, delayed = false, attempts = attempts - 1 WHERE id = %s",
                 None),
    "losses": (f"UPDATE flexiq_jobs SET {_REQUEUED}, delayed = false, error = %s WHERE id = %s", None),
    "retries": (f"UPDATE flexiq_jobs SET {_REQUEUED}, delayed = %s, run_at = %s, error = %s WHERE id = %s", None),
    "deaths": (f"UPDATE flexiq_jobs SET state = 'dead', finished_at = %s, error = %s, {_UNLEASED} WHERE id = %s",
               None),
    "deferrals": (f"UPDATE flexiq_jobs SET {_REQUEUED}, attempts = attempts - 1, delayed = true, run_at = %s, "
                  f"waiting_for = %s WHERE id = %s", None),
    "executions": ("INSERT INTO flexiq_executions (job_id, attempt, worker, started_at, finished_at, outcome, error) "
                   "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                   "INSERT INTO flexiq_executions (job_id, attempt, worker, started_at, finished_at, outcome, error) "
                   "SELECT * FROM unnest(%s::bigint[], %s::integer[], %s::text[], %s::float8[], %s::float8[], "
                   "%s::text[], %s::text[])"),
}
_LIVE = "state IN ('queued', 'running')"
_DUE = "state = 'queued' AND NOT delayed"
_DELAYED = "state = 'queued' AND delayed"
_LEASED = "id, attempts, max_attempts, lease_owner, started_at, queue, tenant, lease_outcome, error"
# The holds that count: of a job still running leased to the owner that took the hold.
_LIVE_HOLDS = ("SELECT h.dependency, h.since FROM flexiq_dependency_holds h JOIN flexiq_jobs j ON j.id = h.job_id "
               "WHERE h.dependency = ANY(%s) AND j.state = 'running' AND j.lease_owner = h.owner")
# Depth per (state, tenant): the totals plus the changes not folded yet.
_COUNTS = ("SELECT queue, state, tenant, sum(n) AS n FROM ("
           "SELECT queue, state, tenant, n FROM flexiq_counts {where} UNION ALL "
           "SELECT queue, state, tenant, n FROM flexiq_count_changes {where}) AS parts "
           "GROUP BY queue, state, tenant HAVING sum(n) > 0")
# A queue's stats in one statement (``PostgresTx.stats_rows``): each part an array, each read
# only when the counts say it can find something, so an idle queue costs a few index probes.
# Whether delayed jobs came due comes first: then the caller promotes them and reads again.
_STATS = f"""WITH changes AS (
    SELECT state, tenant, n FROM flexiq_count_changes WHERE queue = %(queue)s AND state = ANY(%(buckets)s)),
counts AS (
    SELECT state, tenant, sum(n)::bigint AS n FROM (
        SELECT state, tenant, n FROM flexiq_counts WHERE queue = %(queue)s AND state = ANY(%(buckets)s)
        UNION ALL SELECT state, tenant, n FROM changes
    ) AS parts GROUP BY state, tenant HAVING sum(n) > 0),
events AS (
    SELECT tenant, sum(arrivals)::bigint AS a, sum(completions)::bigint AS c, sum(failures)::bigint AS f FROM (
        SELECT tenant, arrivals, completions, failures FROM flexiq_rates
        WHERE queue = %(queue)s AND second > %(since)s
        UNION ALL
        SELECT tenant, arrivals, completions, failures FROM flexiq_rate_changes
        WHERE queue = %(queue)s AND second > %(since)s
    ) AS parts GROUP BY tenant),
durations AS (
    SELECT tenant, finished_at, finished_at - started_at AS seconds FROM flexiq_jobs
    WHERE queue = %(queue)s AND state = 'done' AND finished_at >= %(horizon)s AND started_at IS NOT NULL
    ORDER BY finished_at DESC LIMIT {DURATION_SAMPLE}),
queued AS (SELECT tenant FROM counts WHERE state = 'queued'),
caps AS (SELECT tenant, max_running FROM flexiq_tenant_caps WHERE EXISTS (SELECT 1 FROM queued))
SELECT
    EXISTS (SELECT 1 FROM flexiq_jobs WHERE {_DELAYED} AND run_at <= %(now)s), c.*, e.*, d.*, t.*, rd.*, q.*,
    k.*, r.*, ps.*,
    CASE WHEN %(within)s > 0 AND EXISTS (SELECT 1 FROM counts WHERE state = 'delayed') THEN (
        SELECT count(*) FROM (SELECT 1 FROM flexiq_jobs WHERE {_DELAYED} AND waiting_for IS NULL
                              AND queue = %(queue)s AND run_at <= %(until)s LIMIT {COMING_DUE_LIMIT}) AS coming)
    ELSE 0 END,
    CASE WHEN EXISTS (SELECT 1 FROM counts WHERE state = 'delayed') THEN (
        SELECT min(run_at) FROM flexiq_jobs WHERE {_DELAYED} AND waiting_for IS NULL AND queue = %(queue)s)
    END,
    CASE WHEN EXISTS (SELECT 1 FROM counts WHERE state = 'running') THEN (
        SELECT ARRAY[count(*), COALESCE(sum(%(now)s - started_at), 0)] FROM flexiq_jobs
        WHERE state = 'running' AND queue = %(queue)s AND started_at IS NOT NULL)
    END,
    (SELECT count(*) FROM changes)
FROM (SELECT array_agg(state), array_agg(tenant), array_agg(n) FROM counts) AS c,
     (SELECT array_agg(tenant), array_agg(a), array_agg(c), array_agg(f) FROM events) AS e,
     (SELECT percentile_disc(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY seconds) FROM durations) AS d,
     (SELECT array_agg(tenant), array_agg(p) FROM (
         SELECT tenant, percentile_disc(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY seconds) AS p
         FROM durations WHERE tenant <> '' GROUP BY tenant) AS shares) AS t,
     (SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY seconds), count(*),
             percentile_disc(0.95) WITHIN GROUP (ORDER BY seconds) FROM durations
      WHERE finished_at >= %(recent)s) AS rd,
     (SELECT array_agg(tenant), array_agg(
         (SELECT min(run_at) FROM flexiq_jobs WHERE {_DUE} AND waiting_for IS NULL
          AND queue = %(queue)s AND tenant = queued.tenant)) FROM queued) AS q,
     (SELECT array_agg(tenant), array_agg(max_running) FROM caps) AS k,
     (SELECT array_agg(tenant), array_agg(n) FROM (
         SELECT tenant, sum(n)::bigint AS n FROM (
             SELECT tenant, n FROM flexiq_counts WHERE state = 'running' AND tenant <> ''
             UNION ALL
             SELECT tenant, n FROM flexiq_count_changes WHERE state = 'running' AND tenant <> ''
         ) AS parts WHERE EXISTS (SELECT 1 FROM caps) GROUP BY tenant HAVING sum(n) > 0) AS running) AS r,
     (SELECT array_agg(second ORDER BY second), array_agg(n ORDER BY second) FROM (
         SELECT second, sum(completions)::bigint AS n FROM (
             SELECT second, completions FROM flexiq_rates WHERE queue = %(queue)s AND second > %(recent)s
             UNION ALL
             SELECT second, completions FROM flexiq_rate_changes WHERE queue = %(queue)s AND second > %(recent)s
         ) AS parts GROUP BY second HAVING sum(completions) > 0) AS seconds) AS ps"""
# Tenants at most whose heads a capped claim reads (see the SQLite dialect's).
_HEADS_MAX = 64
# A revived job: queued again, due now, no attempt used yet.
_REVIVE = "UPDATE flexiq_jobs SET state = 'queued', delayed = false, attempts = 0, run_at = %s, finished_at = NULL"
# Advisory locks of a fleet-wide duty, one per schema (transaction-scoped: a crash frees them).
_DUTIES = {"maintenance": "flexiq maintenance of ", "rescue": "flexiq rescue of "}


class PostgresTx(Tx):
    """The statements of one PostgreSQL transaction (see ``dialect.Tx`` for what each does)."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    # -- enqueue and promotion -------------------------------------------------------------

    def insert_jobs(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple[int, bool]]:
        new_ids = sorted(row[0] for row in self.conn.execute(_NEW_IDS, (len(rows),)))
        columns = [new_ids] + [[row[name] for row in rows] for name, _ in _NEW_JOB_TYPES[1:]]
        inserted = {row[0] for row in self.conn.execute(_INSERT_JOBS, columns)}
        # Rows left out hold a key that is live: the job holding it stands for them.
        keys = [row["idempotency_key"] for row, job_id in zip(rows, new_ids) if job_id not in inserted]
        holders = dict(self.conn.execute(
            f"SELECT idempotency_key, id FROM flexiq_jobs WHERE idempotency_key = ANY(%s) AND {_LIVE}",
            (keys,)).fetchall()) if keys else {}
        return [(job_id, True) if job_id in inserted else (holders[row["idempotency_key"]], False)
                for row, job_id in zip(rows, new_ids)]

    def bump_rates(self, rows: Sequence[RateRow]) -> None:
        # Appended, never updated in place: no lock for concurrent transactions to wait on.
        if rows:
            self.conn.execute(
                "INSERT INTO flexiq_rate_changes (queue, tenant, second, arrivals, completions, failures) "
                "SELECT * FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::bigint[], %s::bigint[], "
                "%s::bigint[])", [list(column) for column in zip(*rows)])

    def notify(self, queues: Iterable[str]) -> None:
        # Delivered at commit, once per channel.
        for queue in sorted(set(queues)):
            self.conn.execute("SELECT pg_notify(%s, '')", (channel_of(queue),))

    def promote(self, now: float, limit: int) -> list[tuple[str, str, float, int, str | None]]:
        # = ANY(ARRAY(...)): the rows found by primary key. With IN (...) and a large LIMIT the
        # planner may hash-join the whole table against the few rows due (185 ms at 10^6 jobs).
        return self.conn.execute(
            f"UPDATE flexiq_jobs SET delayed = false WHERE id = ANY(ARRAY(SELECT id FROM flexiq_jobs "
            f"WHERE {_DELAYED} AND run_at <= %s ORDER BY run_at LIMIT %s FOR UPDATE SKIP LOCKED)) "
            f"RETURNING queue, tenant, run_at, attempts, waiting_for", (now, limit)).fetchall()

    # -- claim -----------------------------------------------------------------------------

    def lease_next(self, queue: str, owner: str, expires: float, now: float, want: int) -> list[Job]:
        # run_at <= now still guards the walk: another machine's clock may run ahead.
        rows = self.conn.execute(
            f"UPDATE flexiq_jobs SET state = 'running', lease_owner = %s, lease_expires = %s, "
            f"attempts = attempts + 1, started_at = %s, waiting_for = NULL WHERE id IN ("
            f"  SELECT id FROM flexiq_jobs WHERE {_DUE} AND queue = %s AND run_at <= %s"
            f"  ORDER BY priority DESC, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED) "
            f"RETURNING {JOB_COLUMNS}", (owner, expires, now, queue, now, want)).fetchall()
        return in_claim_order([job_from_row(row) for row in rows])

    def lease(self, job_ids: Sequence[int], owner: str, expires: float, now: float) -> list[Job]:
        rows = self.conn.execute(
            f"UPDATE flexiq_jobs SET state = 'running', lease_owner = %s, lease_expires = %s, "
            f"attempts = attempts + 1, started_at = %s, waiting_for = NULL WHERE id = ANY(%s) "
            f"RETURNING {JOB_COLUMNS}", (owner, expires, now, list(job_ids))).fetchall()
        return in_claim_order([job_from_row(row) for row in rows])

    def store_caps(self, caps: TenantCaps) -> None:
        # Upserted in key order, so workers storing them at once neither conflict nor deadlock.
        items = sorted(caps.max_running.items())
        self.conn.execute("DELETE FROM flexiq_tenant_caps WHERE tenant <> ALL(%s::text[])",
                          ([name for name, _ in items],))
        if items:
            self.conn.execute(
                "INSERT INTO flexiq_tenant_caps AS c (tenant, max_running) SELECT * FROM unnest(%s::text[], "
                "%s::integer[]) ON CONFLICT (tenant) DO UPDATE SET max_running = excluded.max_running",
                [list(column) for column in zip(*items)])

    def running_by_tenant(self, tenants: Sequence[str] | None = None) -> dict[str, int]:
        where = "WHERE state = 'running' AND tenant <> ''" + (" AND tenant = ANY(%(tenants)s)" if tenants else "")
        running: dict[str, int] = {}
        for _, _, tenant, n in self.conn.execute(_COUNTS.format(where=where), {"tenants": list(tenants or ())}):
            running[tenant] = running.get(tenant, 0) + int(n)
        return running

    def capped_candidates(self, queue: str, full: set[str], want: int,
                          now: float) -> tuple[list[tuple[int, str]], bool]:
        # With tenants at their cap, and few others with jobs here: the head of each other
        # tenant's jobs (flexiq_jobs_tenant_claim), merged, then locked -- not a walk of the
        # claim order past every job of the capped tenants, however long their backlog.
        if full:
            tenants = sorted({tenant for _, _, tenant, _ in self.conn.execute(
                _COUNTS.format(where="WHERE queue = %(queue)s AND state IN ('queued', 'waiting')"),
                {"queue": queue})} - full)
            if len(tenants) <= _HEADS_MAX:
                heads = [row[0] for row in self.conn.execute(
                    f"SELECT j.id FROM unnest(%s::text[]) AS t(tenant) CROSS JOIN LATERAL ("
                    f"  SELECT id, priority, run_at FROM flexiq_jobs WHERE {_DUE} AND queue = %s "
                    f"  AND tenant = t.tenant AND run_at <= %s ORDER BY priority DESC, run_at, id LIMIT %s) AS j "
                    f"ORDER BY j.priority DESC, j.run_at, j.id LIMIT %s", (tenants, queue, now, want, want))]
                if not heads:
                    return [], True
                # By primary key alone, then checked here and put back in claim order: with the
                # terms of the claim index in the query, the planner may walk that index instead.
                locked = {job_id: tenant for job_id, tenant, state, delayed in self.conn.execute(
                    "SELECT id, tenant, state, delayed FROM flexiq_jobs WHERE id = ANY(%s) FOR UPDATE SKIP LOCKED",
                    (heads,)) if state == JobState.QUEUED.value and not delayed}
                return [(job_id, locked[job_id]) for job_id in heads if job_id in locked], len(locked) == len(heads)
        rows = self.conn.execute(
            f"SELECT id, tenant FROM flexiq_jobs WHERE {_DUE} AND queue = %s AND run_at <= %s "
            f"AND tenant <> ALL(%s::text[]) ORDER BY priority DESC, run_at, id LIMIT %s "
            f"FOR UPDATE SKIP LOCKED", (queue, now, sorted(full), want)).fetchall()
        return rows, True

    def lock_tenants(self, tenants: Sequence[str]) -> list[str]:
        # In READ COMMITTED, the running jobs counted after this lock include every claim
        # that held it before.
        return [tenant for tenant in tenants if self.conn.execute(
            "SELECT pg_try_advisory_xact_lock(hashtext('flexiq tenant cap'), "
            "hashtext(current_schema() || '/' || %s))", (tenant,)).fetchone()[0]]

    def stamped(self, owner: str, now: float) -> list[Job]:
        return [job_from_row(row) for row in self.conn.execute(
            f"SELECT {JOB_COLUMNS} FROM flexiq_jobs WHERE state = 'running' AND lease_owner = %s "
            f"AND started_at = %s", (owner, now))]

    # -- settle, renew, abandon ------------------------------------------------------------

    def leased_to(self, owner: str, job_ids: Sequence[int]) -> dict[int, tuple]:
        return {row[0]: row[1:] for row in self.conn.execute(
            "SELECT id, queue, tenant, attempts, max_attempts, started_at FROM flexiq_jobs "
            "WHERE id = ANY(%s) AND state = 'running' AND lease_owner = %s ORDER BY id FOR UPDATE",
            (list(job_ids), owner))}

    def write_endings(self, endings: Endings) -> None:
        cursor = self.conn.cursor()
        for kind, (statement, batch) in _ENDINGS.items():
            rows = getattr(endings, kind)
            if batch is not None and len(rows) > 1:
                cursor.execute(batch, [list(column) for column in zip(*rows)])
            elif rows:
                cursor.executemany(statement, rows)

    def free_holds(self, job_ids: Sequence[int], now: float, *, measure: bool) -> None:
        if not job_ids:
            return
        # One statement: the holds deleted, and (``measure``) how long each was held recorded.
        self.conn.execute(
            "WITH freed AS (DELETE FROM flexiq_dependency_holds WHERE job_id = ANY(%(ids)s) "
            "RETURNING dependency, since) "
            "INSERT INTO flexiq_dependency_hold_times (dependency, ended_at, seconds) "
            "SELECT dependency, %(now)s, greatest(0, %(now)s - since) FROM freed WHERE %(measure)s",
            {"ids": sorted(set(job_ids)), "now": float(now), "measure": measure})

    def renew(self, owner: str, job_ids: Sequence[int], expires: float) -> set[int]:
        return {row[0] for row in self.conn.execute(
            "UPDATE flexiq_jobs SET lease_expires = %s WHERE id = ANY(%s) AND state = 'running' "
            "AND lease_owner = %s RETURNING id", (expires, sorted(set(job_ids)), owner))}

    def mark_abandoned(self, marks: Sequence[tuple[str, str | None, int, str]]) -> list[int]:
        return [mark[2] for mark in marks if self.conn.execute(
            "UPDATE flexiq_jobs SET lease_outcome = %s, error = COALESCE(%s, error) "
            "WHERE id = %s AND state = 'running' AND lease_owner = %s", mark).rowcount]

    # -- recovery and maintenance ----------------------------------------------------------

    def expired_leases(self, now: float) -> list[LeasedRow]:
        # Rows another transaction holds are skipped: their owner is settling or renewing
        # them, or another process is recovering them.
        return [LeasedRow(*row) for row in self.conn.execute(
            f"SELECT {_LEASED} FROM flexiq_jobs WHERE state = 'running' AND lease_expires < %s "
            f"ORDER BY id FOR UPDATE SKIP LOCKED", (now,))]

    def leases_of(self, owner: str) -> list[LeasedRow]:
        return [LeasedRow(*row) for row in self.conn.execute(
            f"SELECT {_LEASED} FROM flexiq_jobs WHERE state = 'running' AND lease_expires IS NOT NULL "
            f"AND lease_owner = %s ORDER BY id FOR UPDATE", (owner,))]

    def host_names(self) -> set[str]:
        return {name for (name,) in self.conn.execute("SELECT name FROM flexiq_hosts")}

    def lead(self, duty: str) -> bool:
        return self.conn.execute("SELECT pg_try_advisory_xact_lock(hashtext(%s || current_schema()))",
                                 (_DUTIES[duty],)).fetchone()[0]

    def fold(self) -> None:
        _fold(self.conn)

    def drop_old(self, rates_before: int, holds_before: float) -> None:
        self.conn.execute("DELETE FROM flexiq_rates WHERE second < %s", (rates_before,))
        self.conn.execute("DELETE FROM flexiq_dependency_events WHERE second < %s", (rates_before,))
        self.conn.execute("DELETE FROM flexiq_dependency_hold_times WHERE ended_at < %s", (holds_before,))
        self.conn.execute("DELETE FROM flexiq_dependency_event_changes WHERE second < %s", (rates_before,))
        self.conn.execute("DELETE FROM flexiq_dependency_shares WHERE expires < %s", (holds_before,))

    def lease_owners(self) -> dict[str, int]:
        return dict(self.conn.execute("SELECT lease_owner, count(*) FROM flexiq_jobs WHERE state = 'running' "
                                      "AND lease_expires IS NOT NULL GROUP BY lease_owner").fetchall())

    # -- management ------------------------------------------------------------------------

    def cancel(self, job_id: int, now: float) -> bool:
        return self.conn.execute(
            f"UPDATE flexiq_jobs SET state = 'cancelled', finished_at = %s, {_UNLEASED} "
            f"WHERE id = %s AND state IN ('queued', 'running', 'dead')", (now, job_id)).rowcount > 0

    def job(self, job_id: int) -> Job | None:
        row = self.conn.execute(f"SELECT {JOB_COLUMNS} FROM flexiq_jobs WHERE id = %s", (job_id,)).fetchone()
        return job_from_row(row) if row is not None else None

    def jobs(self, queue: str | None, state: JobState | None, limit: int, *, task: str | None = None,
             tenant: str | None = None, before: int | None = None) -> list[Job]:
        where, args = _where(queue=queue, state=state.value if state is not None else None, task=task,
                             tenant=tenant, before=before)
        return [job_from_row(row) for row in self.conn.execute(
            f"SELECT {JOB_COLUMNS} FROM flexiq_jobs {where} ORDER BY id DESC LIMIT %s", (*args, limit))]

    def revive_dead(self, now: float, queue: str | None, job_ids: Sequence[int] | None) -> list[tuple[str, str]]:
        where, args = _where(state="dead", queue=queue, ids=job_ids)
        return self.conn.execute(f"{_REVIVE} {where} AND idempotency_key IS NULL RETURNING queue, tenant",
                                 (now, *args)).fetchall()

    def dead_with_keys(self, queue: str | None, job_ids: Sequence[int] | None) -> list[tuple[int, str]]:
        where, args = _where(state="dead", queue=queue, ids=job_ids)
        return self.conn.execute(f"SELECT id, idempotency_key FROM flexiq_jobs {where} "
                                 f"AND idempotency_key IS NOT NULL ORDER BY id DESC", args).fetchall()

    def revive_if_key_free(self, now: float, job_id: int, key: str) -> list[tuple[str, str]]:
        return self.conn.execute(
            f"{_REVIVE} WHERE id = %s AND NOT EXISTS (SELECT 1 FROM flexiq_jobs WHERE idempotency_key = %s "
            f"AND {_LIVE}) RETURNING queue, tenant", (now, job_id, key)).fetchall()

    def queues(self) -> list[str]:
        return [row[0] for row in self.conn.execute(
            f"SELECT DISTINCT queue FROM ({_COUNTS.format(where='')}) AS counts ORDER BY queue")]

    def delete_finished(self, queue: str, state: JobState, before: float) -> int:
        gone = [row[0] for row in self.conn.execute(
            "DELETE FROM flexiq_jobs WHERE queue = %s AND state = %s AND finished_at < %s RETURNING id",
            (queue, state.value, before))]
        if gone:
            self.conn.execute("DELETE FROM flexiq_executions WHERE job_id = ANY(%s)", (gone,))
        return len(gone)

    def delete_finished_ids(self, job_ids: Sequence[int], states: Sequence[JobState], before: float) -> int:
        gone = [row[0] for row in self.conn.execute(
            "DELETE FROM flexiq_jobs WHERE id = ANY(%s) AND state = ANY(%s) AND finished_at < %s RETURNING id",
            (list(job_ids), [s.value for s in states], before))]
        if gone:
            self.conn.execute("DELETE FROM flexiq_executions WHERE job_id = ANY(%s)", (gone,))
        return len(gone)

    def executions(self, job_id: int | None, limit: int | None) -> list[tuple]:
        clause, args = ("WHERE job_id = %s", [job_id]) if job_id is not None else ("", [])
        return self.conn.execute(
            f"SELECT job_id, attempt, worker, started_at, finished_at, outcome, error FROM flexiq_executions "
            f"{clause} ORDER BY id LIMIT %s", (*args, limit)).fetchall()

    def last_attempt_id(self) -> int:
        return self.conn.execute("SELECT COALESCE(max(id), 0) FROM flexiq_executions").fetchone()[0]

    def attempts_after(self, after: int, limit: int) -> list[tuple]:
        # Ids are handed out before commit: a gap is settled once the row after it is
        # _GAP_SETTLE seconds old by the server's clock.
        return self.conn.execute(
            "SELECT e.id, j.queue, j.task, e.outcome, e.finished_at - e.started_at, "
            "e.outcome = 'dead' OR (e.outcome IN ('fail', 'lost') AND e.attempt >= j.max_attempts), "
            "e.recorded_at < clock_timestamp() - make_interval(secs => %s) "
            "FROM flexiq_executions e LEFT JOIN flexiq_jobs j ON j.id = e.job_id "
            "WHERE e.id > %s ORDER BY e.id LIMIT %s", (_GAP_SETTLE, after, limit)).fetchall()

    def arrivals_since(self, queue: str, second: int) -> dict[int, int]:
        return {int(at): int(n) for at, n in self.conn.execute(
            "SELECT second, sum(arrivals) FROM (SELECT second, arrivals FROM flexiq_rates "
            "WHERE queue = %(queue)s AND second >= %(second)s UNION ALL SELECT second, arrivals "
            "FROM flexiq_rate_changes WHERE queue = %(queue)s AND second >= %(second)s) AS parts "
            "GROUP BY second HAVING sum(arrivals) > 0", {"queue": queue, "second": second})}

    def first_claims(self, owners: Sequence[str]) -> dict[str, float]:
        found: dict[str, float] = {}
        for owner, started in self.conn.execute(
                "SELECT lease_owner, min(started_at) FROM flexiq_jobs WHERE state = 'running' "
                "AND lease_owner = ANY(%s) GROUP BY lease_owner "
                "UNION ALL SELECT worker, min(started_at) FROM flexiq_executions "
                "WHERE worker = ANY(%s) GROUP BY worker", (list(owners), list(owners))):
            if started is not None:
                found[owner] = min(started, found.get(owner, started))
        return found

    def stats_rows(self, queue: str, now: float, window: float, due_within: float, *,
                   unless_due: bool = False) -> StatsRows | None:
        # One statement, so one round trip and one snapshot (see Database.read_one).
        row = self.conn.execute(_STATS, {
            "queue": queue, "buckets": list(READ_BUCKETS), "now": float(now), "since": now - window,
            "horizon": now - max(window, DURATION_HORIZON), "recent": now - RECENT_WINDOW,
            "within": float(due_within), "until": now + due_within}, binary=True).fetchone()
        (due, states, tenants, counted, event_tenants, arrivals, completions, failures, overall,
         share_tenants, shares, recent_p50, recent, recent_p95, first_tenants, firsts, cap_tenants, caps,
         running_tenants, running_counts, series_seconds, series_counts, coming, next_due, running,
         unfolded) = row
        if unless_due and due:
            return None
        counts: dict[str, dict[str, int]] = {}
        for state, tenant, n in zip(states or (), tenants or (), counted or ()):
            counts.setdefault(tenant, {})[state] = n
        return StatsRows(
            counts=counts,
            events={tenant: (a, c, f) for tenant, a, c, f in zip(
                event_tenants or (), arrivals or (), completions or (), failures or ())},
            durations=Durations(overall=tuple(overall) if overall else None,
                                by_tenant={tenant: tuple(p) for tenant, p in zip(share_tenants or (), shares or ())},
                                recent_p50=recent_p50, recent=recent, recent_p95=recent_p95),
            first_run_at={tenant: first for tenant, first in zip(first_tenants or (), firsts or ())
                          if first is not None},
            caps=dict(zip(cap_tenants or (), caps or ())),
            running_by_tenant=dict(zip(running_tenants or (), running_counts or ())),
            coming_due=coming or 0,
            running=(int(running[0]), float(running[1])) if running else (0, 0.0),
            next_due=next_due, unfolded=unfolded,
            completions_by_second=dict(zip(series_seconds or (), series_counts or ())))

    # -- dependency limits -----------------------------------------------------------------

    def leased_ids(self, owner: str, job_ids: Sequence[int]) -> set[int]:
        # FOR SHARE: none of these jobs can end until this transaction does.
        return {row[0] for row in self.conn.execute(
            "SELECT id FROM flexiq_jobs WHERE id = ANY(%s) AND state = 'running' AND lease_owner = %s "
            "ORDER BY id FOR SHARE", (list(job_ids), owner))}

    def admitted_ids(self, owner: str, job_ids: Sequence[int]) -> set[int]:
        return {row[0] for row in self.conn.execute(
            "SELECT DISTINCT job_id FROM flexiq_dependency_holds WHERE job_id = ANY(%s) AND owner = %s",
            (list(job_ids), owner))}

    def lock_dependencies(self, names: Sequence[str]) -> dict[str, float | None]:
        self.conn.execute("INSERT INTO flexiq_dependencies (dependency) SELECT unnest(%s::text[]) ORDER BY 1 "
                          "ON CONFLICT (dependency) DO NOTHING", (list(names),))
        # The lock that makes admissions from every host take turns (in name order: never
        # crosswise).  In READ COMMITTED each statement after it sees what the previous
        # holder of the lock committed.
        return dict(self.conn.execute("SELECT dependency, tat FROM flexiq_dependencies WHERE dependency = ANY(%s) "
                                      "ORDER BY dependency FOR UPDATE", (list(names),)).fetchall())

    def live_holds(self, names: Sequence[str]) -> list[tuple[str, float]]:
        return self.conn.execute(_LIVE_HOLDS, (list(names),)).fetchall()

    def recent_hold_times(self, name: str, since: float, limit: int) -> list[float]:
        return [row[0] for row in self.conn.execute(
            "SELECT seconds FROM flexiq_dependency_hold_times WHERE dependency = %s AND ended_at > %s "
            "ORDER BY ended_at DESC LIMIT %s", (name, since, limit))]

    def add_holds(self, holds: Sequence[tuple[str, int, str, float]], *, count: bool = False) -> None:
        # One statement either way: the holds, and (``count``) their admissions appended.
        self.conn.execute(
            "WITH h AS (SELECT * FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::float8[]) "
            "AS h(dependency, job_id, owner, since)), "
            "held AS (INSERT INTO flexiq_dependency_holds (dependency, job_id, owner, since) "
            "SELECT h.* FROM h JOIN flexiq_jobs j ON j.id = h.job_id AND j.state = 'running' "
            "AND j.lease_owner = h.owner ON CONFLICT (dependency, job_id) DO UPDATE SET owner = excluded.owner, "
            "since = excluded.since) "
            "INSERT INTO flexiq_dependency_event_changes (dependency, second, admitted, deferred) "
            "SELECT dependency, floor(since)::bigint, count(*), 0 FROM h WHERE %s GROUP BY 1, 2",
            [*(list(column) for column in zip(*holds)), count])

    def own_shares(self, owner: str, names: Sequence[str]) -> dict[str, Share]:
        return {name: Share(slots, expires, wanted) for name, slots, expires, wanted in self.conn.execute(
            "SELECT dependency, slots, expires, wanted FROM flexiq_dependency_shares WHERE owner = %s "
            "AND dependency = ANY(%s)", (owner, list(names)))}

    def owner_holds(self, owner: str, names: Sequence[str]) -> dict[str, int]:
        return dict(self.conn.execute(
            "SELECT h.dependency, count(*) FROM flexiq_dependency_holds h JOIN flexiq_jobs j ON j.id = h.job_id "
            "WHERE h.owner = %s AND h.dependency = ANY(%s) AND j.state = 'running' AND j.lease_owner = h.owner "
            "GROUP BY h.dependency", (owner, list(names))))

    def shares_of(self, name: str) -> dict[str, Share]:
        return {owner: Share(slots, expires, wanted) for owner, slots, expires, wanted in self.conn.execute(
            "SELECT owner, slots, expires, wanted FROM flexiq_dependency_shares WHERE dependency = %s",
            (name,))}

    def holds_by_owner(self, name: str) -> dict[str, int]:
        return dict(self.conn.execute(
            "SELECT h.owner, count(*) FROM flexiq_dependency_holds h JOIN flexiq_jobs j ON j.id = h.job_id "
            "WHERE h.dependency = %s AND j.state = 'running' AND j.lease_owner = h.owner GROUP BY h.owner", (name,)))

    def set_share(self, name: str, owner: str, share: Share) -> None:
        self.conn.execute(
            "INSERT INTO flexiq_dependency_shares AS s (dependency, owner, slots, expires, wanted) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (dependency, owner) DO UPDATE SET slots = excluded.slots, "
            "expires = excluded.expires, wanted = excluded.wanted",
            (name, owner, share.slots, share.expires, share.wanted))

    def wanted_by_others(self, owner: str, names: Sequence[str], now: float) -> dict[str, int]:
        return {name: int(n) for name, n in self.conn.execute(
            "SELECT dependency, sum(wanted) FROM flexiq_dependency_shares WHERE dependency = ANY(%s) "
            "AND owner <> %s AND expires > %s AND wanted > 0 GROUP BY dependency", (list(names), owner, now))}

    def drop_shares(self, owners: Sequence[str]) -> None:
        self.conn.execute("DELETE FROM flexiq_dependency_shares WHERE owner = ANY(%s)", (list(owners),))

    def set_tat(self, name: str, tat: float) -> None:
        self.conn.execute("UPDATE flexiq_dependencies SET tat = %s WHERE dependency = %s", (tat, name))

    def bump_dependency(self, name: str, second: int, admitted: int, deferred: int) -> None:
        # Appended, never updated in place: admissions of many processes wait on no row.
        self.conn.execute("INSERT INTO flexiq_dependency_event_changes (dependency, second, admitted, deferred) "
                          "VALUES (%s, %s, %s, %s)", (name, second, admitted, deferred))

    def waiting_for(self, name: str, limit: int) -> int:
        return int(self.conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM flexiq_jobs WHERE state = 'queued' AND waiting_for = %s "
            "LIMIT %s) AS waiting", (name, limit)).fetchone()[0])

    def dependency_events(self, name: str, since: float) -> tuple[int, int]:
        admitted, deferred = self.conn.execute(
            "SELECT COALESCE(sum(admitted), 0), COALESCE(sum(deferred), 0) FROM ("
            "SELECT admitted, deferred FROM flexiq_dependency_events WHERE dependency = %(name)s AND second > %(since)s "
            "UNION ALL SELECT admitted, deferred FROM flexiq_dependency_event_changes "
            "WHERE dependency = %(name)s AND second > %(since)s) AS parts", {"name": name, "since": since}).fetchone()
        return int(admitted), int(deferred)

    # -- hosts -----------------------------------------------------------------------------

    def beat(self, host: str, now: float, interval: float, report: str) -> None:
        self.conn.execute(
            "INSERT INTO flexiq_hosts AS h (name, last_beat, interval, report, registered_at) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (name) DO UPDATE SET "
            "last_beat = excluded.last_beat, interval = excluded.interval, report = excluded.report",
            (host, now, interval, report, now))

    def host_rows(self) -> list[tuple[str, float, float, str, float]]:
        return self.conn.execute(
            "SELECT name, last_beat, interval, report, registered_at FROM flexiq_hosts ORDER BY name").fetchall()

    def forget_host(self, host: str) -> bool:
        return self.conn.execute("DELETE FROM flexiq_hosts WHERE name = %s", (host,)).rowcount > 0

    # -- the tasks' declarations -----------------------------------------------------------

    def declare_tasks(self, declared: Sequence[TaskDeclaration], by: str, now: float) -> int:
        columns = [[d.task for d in declared], [d.queue for d in declared], [d.priority for d in declared],
                   [d.max_attempts for d in declared], [d.timeout for d in declared]]
        return self.conn.execute(
            "INSERT INTO flexiq_task_declarations AS d (task, queue, priority, max_attempts, timeout, declared_at, "
            "declared_by) SELECT t.*, %s::float8, %s::text FROM unnest(%s::text[], %s::text[], %s::integer[], %s::integer[], "
            "%s::float8[]) AS t ON CONFLICT (task) DO UPDATE SET queue = excluded.queue, "
            "priority = excluded.priority, max_attempts = excluded.max_attempts, timeout = excluded.timeout, "
            "declared_at = excluded.declared_at, declared_by = excluded.declared_by "
            "WHERE (d.queue, d.priority, d.max_attempts, d.timeout) IS DISTINCT FROM "
            "(excluded.queue, excluded.priority, excluded.max_attempts, excluded.timeout)",
            [now, by, *columns]).rowcount

    def task_declarations(self, tasks: Sequence[str] | None) -> dict[str, TaskDeclaration]:
        columns = "task, queue, priority, max_attempts, timeout, declared_at, declared_by"
        if tasks is None:
            rows = self.conn.execute(f"SELECT {columns} FROM flexiq_task_declarations ORDER BY task")
        else:
            rows = self.conn.execute(f"SELECT {columns} FROM flexiq_task_declarations WHERE task = ANY(%s)",
                                     (list(tasks),))
        return {row[0]: TaskDeclaration(*row) for row in rows}

    # -- schedules -------------------------------------------------------------------------

    def ensure_schedules(self, names: Sequence[str], now: float) -> None:
        if names:
            self.conn.execute("INSERT INTO flexiq_schedules (name, since) SELECT unnest(%s::text[]), %s "
                              "ON CONFLICT (name) DO NOTHING", (list(names), now))

    def insert_slot(self, schedule: str, kind: str, at: float, host: str, now: float) -> bool:
        # Waits for a transaction inserting the same key; inserts only if that one rolled back.
        return self.conn.execute(
            "INSERT INTO flexiq_schedule_slots (schedule, kind, slot, host, decided_at) VALUES (%s,%s,%s,%s,%s) "
            "ON CONFLICT (schedule, kind, slot) DO NOTHING", (schedule, kind, at, host, now)).rowcount > 0

    def decide_slot(self, schedule: str, kind: str, at: float, outcome: str, reason: str | None,
                    slots: int, job_id: int | None) -> None:
        self.conn.execute("UPDATE flexiq_schedule_slots SET outcome = %s, reason = %s, slots = %s, job_id = %s "
                          "WHERE schedule = %s AND kind = %s AND slot = %s",
                          (outcome, reason, slots, job_id, schedule, kind, at))

    def schedule_paused(self, name: str) -> bool:
        row = self.conn.execute("SELECT paused FROM flexiq_schedules WHERE name = %s", (name,)).fetchone()
        return bool(row and row[0])

    def previous_job_live(self, name: str, before: float) -> bool:
        row = self.conn.execute(
            "SELECT j.state FROM flexiq_schedule_slots s LEFT JOIN flexiq_jobs j ON j.id = s.job_id "
            "WHERE s.schedule = %s AND s.kind = 'slot' AND s.slot < %s AND s.outcome = 'fired' "
            "ORDER BY s.slot DESC LIMIT 1", (name, before)).fetchone()
        return bool(row and row[0] in ("queued", "running"))

    def count_slots(self, name: str, fired: int, skipped: int) -> None:
        self.conn.execute("UPDATE flexiq_schedules SET fired = fired + %s, skipped = skipped + %s WHERE name = %s",
                          (fired, skipped, name))

    def set_paused(self, name: str, paused: bool, now: float) -> bool:
        self.ensure_schedules([name], now)
        return self.conn.execute("UPDATE flexiq_schedules SET paused = %s WHERE name = %s AND paused <> %s",
                                 (paused, name, paused)).rowcount > 0

    def schedule_rows(self, names: Sequence[str]) -> list[tuple[str, float, bool, int, int]]:
        if not names:
            return []
        return [tuple(row) for row in self.conn.execute(
            "SELECT name, since, paused, fired, skipped FROM flexiq_schedules WHERE name = ANY(%s) ORDER BY name",
            (list(names),))]

    def newest_slot(self, name: str, kind: str) -> tuple | None:
        return self.conn.execute(f"{_LEDGER} WHERE s.schedule = %s AND s.kind = %s ORDER BY s.slot DESC LIMIT 1",
                                 (name, kind)).fetchone()

    def slot_rows(self, name: str, limit: int) -> list[tuple]:
        return self.conn.execute(f"{_LEDGER} WHERE s.schedule = %s ORDER BY s.decided_at DESC, s.slot DESC "
                                 f"LIMIT %s", (name, limit)).fetchall()

    def prune_slots(self, before: float) -> int:
        return self.conn.execute(
            "DELETE FROM flexiq_schedule_slots s WHERE slot < %s AND slot < (SELECT max(n.slot) "
            "FROM flexiq_schedule_slots n WHERE n.schedule = s.schedule AND n.kind = s.kind)", (before,)).rowcount


# A ledger row with its job's state now (schedules.ledger_row reads it).
_LEDGER = ("SELECT s.schedule, s.kind, s.slot, s.outcome, s.reason, s.slots, s.job_id, s.host, s.decided_at, "
           "j.state FROM flexiq_schedule_slots s LEFT JOIN flexiq_jobs j ON j.id = s.job_id")


def _where(*, state: str | None = None, queue: str | None = None, ids: Sequence[int] | None = None,
           task: str | None = None, tenant: str | None = None, before: int | None = None) -> tuple[str, list[Any]]:
    """A WHERE clause (empty when nothing is asked) and its arguments."""
    terms, args = [], []
    for column, value in (("state", state), ("queue", queue), ("task", task), ("tenant", tenant)):
        if value is not None:
            terms.append(f"{column} = %s")
            args.append(value)
    if before is not None:
        terms.append("id < %s")
        args.append(before)
    if ids is not None:
        terms.append("id = ANY(%s)")
        args.append(list(ids))
    return (f"WHERE {' AND '.join(terms)}" if terms else ""), args


def _fold(conn: psycopg.Connection) -> None:
    """Move the appended count and rate changes into their totals (see schema.py).

    Safe from several processes at once: a change row is deleted -- and so added --
    by one fold only, and the totals are upserted in key order.  Readers add the
    changes not folded yet, so the figures are the same before and after.
    """
    conn.execute(
        "WITH moved AS (DELETE FROM flexiq_count_changes RETURNING queue, state, tenant, n) "
        "INSERT INTO flexiq_counts AS c (queue, state, tenant, n) "
        "SELECT queue, state, tenant, sum(n) FROM moved GROUP BY 1, 2, 3 HAVING sum(n) <> 0 "
        "ORDER BY 1, 2, 3 ON CONFLICT (queue, state, tenant) DO UPDATE SET n = c.n + excluded.n")
    conn.execute("DELETE FROM flexiq_counts WHERE n = 0")
    conn.execute(
        "WITH moved AS (DELETE FROM flexiq_rate_changes "
        "RETURNING queue, second, tenant, arrivals, completions, failures) "
        "INSERT INTO flexiq_rates AS r (queue, second, tenant, arrivals, completions, failures) "
        "SELECT queue, second, tenant, sum(arrivals), sum(completions), sum(failures) FROM moved "
        "GROUP BY 1, 2, 3 ORDER BY 1, 2, 3 ON CONFLICT (queue, second, tenant) DO UPDATE SET "
        "arrivals = r.arrivals + excluded.arrivals, completions = r.completions + excluded.completions, "
        "failures = r.failures + excluded.failures")
    conn.execute(
        "WITH moved AS (DELETE FROM flexiq_dependency_event_changes RETURNING dependency, second, admitted, deferred) "
        "INSERT INTO flexiq_dependency_events AS e (dependency, second, admitted, deferred) "
        "SELECT dependency, second, sum(admitted), sum(deferred) FROM moved GROUP BY 1, 2 ORDER BY 1, 2 "
        "ON CONFLICT (dependency, second) DO UPDATE SET admitted = e.admitted + excluded.admitted, "
        "deferred = e.deferred + excluded.deferred")
