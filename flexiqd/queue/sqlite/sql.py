"""The SQLite dialect's SQL: the statements of one transaction (``store.dialect.Tx``), in
SQLite's words, over the schema of ``schema.py``.  The transactions they run in, the
connection and the migrations are ``database.py``'s.
"""

from __future__ import annotations

import collections
import sqlite3
from typing import Any, Iterable, Mapping, Sequence

from ..store.dialect import RateRow, Tx
from ..declarations import TaskDeclaration
from ..store.endings import Endings, LeasedRow
from ..store.figures import COMING_DUE_LIMIT, DURATION_HORIZON, DURATION_SAMPLE, READ_BUCKETS, StatsRows, durations_of
from ..limits import TenantCaps
from ..store.rows import JOB_COLUMNS, NEW_JOB_COLUMNS, in_claim_order, job_from_row
from ..store.shares import Share
from ..types import RECENT_WINDOW, Job, JobState

_INSERT_JOB = (f"INSERT INTO jobs ({', '.join(NEW_JOB_COLUMNS)}) "
               f"VALUES ({', '.join(':' + name for name in NEW_JOB_COLUMNS)})")
# What every attempt that ends clears; a job back in the queue loses its start time too.
_UNLEASED = "lease_owner = NULL, lease_expires = NULL, lease_outcome = NULL"
_REQUEUED = f"state = 'queued', started_at = NULL, {_UNLEASED}"
# One statement per kind of ending (endings.Endings), run with executemany.
_ENDINGS = {
    "acks": f"UPDATE jobs SET state = 'done', finished_at = ?, result = ?, error = NULL, {_UNLEASED} WHERE id = ?",
    "releases": f"UPDATE jobs SET {_REQUEUED}, delayed = 0, attempts = attempts - 1 WHERE id = ?",
    "losses": f"UPDATE jobs SET {_REQUEUED}, delayed = 0, error = ? WHERE id = ?",
    "retries": f"UPDATE jobs SET {_REQUEUED}, delayed = ?, run_at = ?, error = ? WHERE id = ?",
    "deaths": f"UPDATE jobs SET state = 'dead', finished_at = ?, error = ?, {_UNLEASED} WHERE id = ?",
    "deferrals": (f"UPDATE jobs SET {_REQUEUED}, attempts = attempts - 1, delayed = 1, run_at = ?, "
                  f"waiting_for = ? WHERE id = ?"),
    "executions": ("INSERT INTO executions (job_id, attempt, worker, started_at, finished_at, outcome, error) "
                   "VALUES (?,?,?,?,?,?,?)"),
}
# The terms of the partial indexes' WHERE, which a query must repeat to use them:
# runnable jobs in claim order (jobs_claim, jobs_tenant_claim, jobs_age), delayed and
# waiting ones by run_at (jobs_due), delayed ones coming due (jobs_coming).
_DUE = "state = 'queued' AND delayed = 0"
_DELAYED = "state = 'queued' AND delayed = 1"
_LIVE = "state IN ('queued', 'running')"  # jobs an idempotency key belongs to
_LEASED = "id, attempts, max_attempts, lease_owner, started_at, queue, tenant, lease_outcome, error"
# The holds that count: of a job still running leased to the owner that took the hold.
_LIVE_HOLDS = ("SELECT h.dependency, h.since FROM dependency_holds h JOIN jobs j ON j.id = h.job_id "
               "WHERE h.dependency IN ({}) AND j.state = 'running' AND j.lease_owner = h.owner")
# A capped claim with tenants at their cap reads the head of each other tenant's due jobs
# (jobs_tenant_claim) while there are at most this many such tenants, instead of walking
# the claim order past the capped tenants' jobs.
_HEADS_MAX = 64
# Ids per statement: well under SQLite's host-parameter limit.
_CHUNK = 500


def _marks(values: Sequence[Any]) -> str:
    return ",".join("?" * len(values))


def _chunks(values: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for at in range(0, len(values), _CHUNK):
        yield values[at:at + _CHUNK]


class SQLiteTx(Tx):
    """The statements of one SQLite transaction (see ``dialect.Tx`` for what each does)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    # -- enqueue and promotion -------------------------------------------------------------

    def insert_jobs(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple[int, bool]]:
        placed = []
        for row in rows:
            key = row["idempotency_key"]
            if key is not None:
                existing = self.conn.execute(f"SELECT id FROM jobs WHERE idempotency_key = ? AND {_LIVE}",
                                             (key,)).fetchone()
                if existing:
                    placed.append((existing[0], False))
                    continue
            placed.append((self.conn.execute(_INSERT_JOB, row).lastrowid, True))
        return placed

    def bump_rates(self, rows: Sequence[RateRow]) -> None:
        if rows:
            self.conn.executemany(
                "INSERT INTO rates (queue, tenant, second, arrivals, completions, failures) "
                "VALUES (?,?,?,?,?,?) ON CONFLICT (queue, second, tenant) DO UPDATE SET "
                "arrivals = arrivals + excluded.arrivals, completions = completions + excluded.completions, "
                "failures = failures + excluded.failures", rows)

    def notify(self, queues: Iterable[str]) -> None:
        pass  # SQLite's workers poll: nothing pushes

    def _any_due(self, now: float) -> bool:
        return self.conn.execute(f"SELECT 1 FROM jobs WHERE {_DELAYED} AND run_at <= ? LIMIT 1",
                                 (now,)).fetchone() is not None

    def promote(self, now: float, limit: int) -> list[tuple[str, str, float, int, str | None]]:
        return self.conn.execute(
            f"UPDATE jobs SET delayed = 0 WHERE id IN (SELECT id FROM jobs WHERE {_DELAYED} "
            f"AND run_at <= ? ORDER BY run_at LIMIT ?) RETURNING queue, tenant, run_at, attempts, waiting_for",
            (now, limit)).fetchall()

    # -- claim -----------------------------------------------------------------------------

    def lease_next(self, queue: str, owner: str, expires: float, now: float, want: int) -> list[Job]:
        # run_at <= now still guards the walk: another process's clock may run ahead.
        rows = self.conn.execute(
            f"UPDATE jobs SET state = 'running', lease_owner = ?, lease_expires = ?, "
            f"attempts = attempts + 1, started_at = ?, waiting_for = NULL WHERE id IN ("
            f"  SELECT id FROM jobs WHERE {_DUE} AND queue = ? AND run_at <= ?"
            f"  ORDER BY priority DESC, run_at, id LIMIT ?) RETURNING {JOB_COLUMNS}",
            (owner, expires, now, queue, now, want)).fetchall()
        return in_claim_order([job_from_row(row) for row in rows])

    def lease(self, job_ids: Sequence[int], owner: str, expires: float, now: float) -> list[Job]:
        jobs = []
        for chunk in _chunks(job_ids):
            jobs += [job_from_row(row) for row in self.conn.execute(
                f"UPDATE jobs SET state = 'running', lease_owner = ?, lease_expires = ?, attempts = attempts + 1, "
                f"started_at = ?, waiting_for = NULL WHERE id IN ({_marks(chunk)}) RETURNING {JOB_COLUMNS}",
                (owner, expires, now, *chunk))]
        return in_claim_order(jobs)

    def store_caps(self, caps: TenantCaps) -> None:
        self.conn.execute("DELETE FROM tenant_caps")
        self.conn.executemany("INSERT INTO tenant_caps (tenant, max_running) VALUES (?, ?)",
                              sorted(caps.max_running.items()))

    def running_by_tenant(self, tenants: Sequence[str] | None = None) -> dict[str, int]:
        only = f" AND tenant IN ({_marks(tenants)})" if tenants else ""
        return dict(self.conn.execute(f"SELECT tenant, SUM(n) FROM counts WHERE state = 'running' "
                                      f"AND tenant <> ''{only} GROUP BY tenant", tuple(tenants or ())))

    def capped_candidates(self, queue: str, full: set[str], want: int,
                          now: float) -> tuple[list[tuple[int, str]], bool]:
        # With tenants at their cap, and few others with jobs here: the head of each other
        # tenant's jobs (one index range each), merged -- not a walk of the claim order past
        # every job of the capped tenants, however long their backlog.
        if full:
            tenants = [tenant for (tenant,) in self.conn.execute(
                "SELECT DISTINCT tenant FROM counts WHERE queue = ? AND state IN ('queued', 'waiting')", (queue,))
                if tenant not in full]
            if len(tenants) <= _HEADS_MAX:
                heads = [row for tenant in tenants for row in self.conn.execute(
                    f"SELECT id, tenant, priority, run_at FROM jobs WHERE {_DUE} AND queue = ? AND tenant = ? "
                    f"AND run_at <= ? ORDER BY priority DESC, run_at, id LIMIT ?", (queue, tenant, now, want))]
                heads.sort(key=lambda row: (-row[2], row[3], row[0]))
                return [(job_id, tenant) for job_id, tenant, _, _ in heads[:want]], True
        skip = sorted(full)
        return self.conn.execute(
            f"SELECT id, tenant FROM jobs WHERE {_DUE} AND queue = ? AND run_at <= ? "
            f"AND tenant NOT IN ({_marks(skip)}) ORDER BY priority DESC, run_at, id LIMIT ?",
            (queue, now, *skip, want)).fetchall(), True

    def lock_tenants(self, tenants: Sequence[str]) -> list[str]:
        return list(tenants)  # the write lock is the store's: every tenant is this claim's

    def stamped(self, owner: str, now: float) -> list[Job]:
        return [job_from_row(row) for row in self.conn.execute(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE state = 'running' AND lease_owner = ? AND started_at = ?",
            (owner, now))]

    # -- settle, renew, abandon ------------------------------------------------------------

    def leased_to(self, owner: str, job_ids: Sequence[int]) -> dict[int, tuple]:
        held: dict[int, tuple] = {}
        for chunk in _chunks(job_ids):
            for row in self.conn.execute(
                    f"SELECT id, queue, tenant, attempts, max_attempts, started_at FROM jobs "
                    f"WHERE id IN ({_marks(chunk)}) AND state = 'running' AND lease_owner = ?", (*chunk, owner)):
                held[row[0]] = row[1:]
        return held

    def write_endings(self, endings: Endings) -> None:
        for kind, statement in _ENDINGS.items():
            rows = getattr(endings, kind)
            if rows:
                self.conn.executemany(statement, rows)

    def free_holds(self, job_ids: Sequence[int], now: float, *, measure: bool) -> None:
        if not job_ids or self.conn.execute("SELECT 1 FROM dependency_holds LIMIT 1").fetchone() is None:
            return  # nothing is held anywhere: no lookup per job
        for job_id in job_ids:
            freed = self.conn.execute("DELETE FROM dependency_holds WHERE job_id = ? RETURNING dependency, since",
                                      (job_id,)).fetchall()
            if measure and freed:
                self.conn.executemany("INSERT INTO dependency_hold_times (dependency, ended_at, seconds) "
                                      "VALUES (?, ?, ?)", [(name, now, max(0.0, now - since)) for name, since in freed])

    def renew(self, owner: str, job_ids: Sequence[int], expires: float) -> set[int]:
        held: set[int] = set()
        for chunk in _chunks(job_ids):
            held.update(row[0] for row in self.conn.execute(
                f"UPDATE jobs SET lease_expires = ? WHERE id IN ({_marks(chunk)}) AND state = 'running' "
                f"AND lease_owner = ? RETURNING id", (expires, *chunk, owner)))
        return held

    def mark_abandoned(self, marks: Sequence[tuple[str, str | None, int, str]]) -> list[int]:
        return [mark[2] for mark in marks if self.conn.execute(
            "UPDATE jobs SET lease_outcome = ?, error = COALESCE(?, error) WHERE id = ? "
            "AND state = 'running' AND lease_owner = ?", mark).rowcount]

    # -- recovery and maintenance ----------------------------------------------------------

    def expired_leases(self, now: float) -> list[LeasedRow]:
        return [LeasedRow(*row) for row in self.conn.execute(
            f"SELECT {_LEASED} FROM jobs WHERE state = 'running' AND lease_expires < ?", (now,))]

    def leases_of(self, owner: str) -> list[LeasedRow]:
        return [LeasedRow(*row) for row in self.conn.execute(
            f"SELECT {_LEASED} FROM jobs WHERE state = 'running' AND lease_expires IS NOT NULL "
            f"AND lease_owner = ?", (owner,))]

    def host_names(self) -> set[str]:
        return {name for (name,) in self.conn.execute("SELECT name FROM hosts")}

    def lead(self, duty: str) -> bool:
        return True  # one machine, one writer at a time: whoever asks leads

    def fold(self) -> None:
        pass  # the counts and rates are kept in place (by triggers and upserts)

    def drop_old(self, rates_before: int, holds_before: float) -> None:
        self.conn.execute("DELETE FROM rates WHERE second < ?", (rates_before,))
        self.conn.execute("DELETE FROM dependency_events WHERE second < ?", (rates_before,))
        self.conn.execute("DELETE FROM dependency_hold_times WHERE ended_at < ?", (holds_before,))
        self.conn.execute("DELETE FROM dependency_shares WHERE expires < ?", (holds_before,))

    def lease_owners(self) -> dict[str, int]:
        return dict(self.conn.execute("SELECT lease_owner, COUNT(*) FROM jobs WHERE state = 'running' "
                                      "AND lease_expires IS NOT NULL GROUP BY lease_owner"))

    # -- management ------------------------------------------------------------------------

    def cancel(self, job_id: int, now: float) -> bool:
        return self.conn.execute(
            f"UPDATE jobs SET state = 'cancelled', finished_at = ?, {_UNLEASED} "
            f"WHERE id = ? AND state IN ('queued', 'running', 'dead')", (now, job_id)).rowcount > 0

    def job(self, job_id: int) -> Job | None:
        row = self.conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return job_from_row(row) if row is not None else None

    def jobs(self, queue: str | None, state: JobState | None, limit: int, *, task: str | None = None,
             tenant: str | None = None, before: int | None = None) -> list[Job]:
        where, args = _where(queue=queue, state=state.value if state is not None else None, task=task,
                             tenant=tenant, before=before)
        return [job_from_row(row) for row in self.conn.execute(
            f"SELECT {JOB_COLUMNS} FROM jobs {where} ORDER BY id DESC LIMIT ?", (*args, limit))]

    def revive_dead(self, now: float, queue: str | None, job_ids: Sequence[int] | None) -> list[tuple[str, str]]:
        where, args = _where(state="dead", queue=queue, ids=job_ids)
        return self.conn.execute(f"{_REVIVE} {where} AND idempotency_key IS NULL RETURNING queue, tenant",
                                 (now, *args)).fetchall()

    def dead_with_keys(self, queue: str | None, job_ids: Sequence[int] | None) -> list[tuple[int, str]]:
        where, args = _where(state="dead", queue=queue, ids=job_ids)
        return self.conn.execute(f"SELECT id, idempotency_key FROM jobs {where} AND idempotency_key IS NOT NULL "
                                 f"ORDER BY id DESC", args).fetchall()

    def revive_if_key_free(self, now: float, job_id: int, key: str) -> list[tuple[str, str]]:
        return self.conn.execute(
            f"{_REVIVE} WHERE id = ? AND NOT EXISTS (SELECT 1 FROM jobs WHERE idempotency_key = ? AND {_LIVE}) "
            f"RETURNING queue, tenant", (now, job_id, key)).fetchall()

    def queues(self) -> list[str]:
        return [row[0] for row in self.conn.execute("SELECT DISTINCT queue FROM counts ORDER BY queue")]

    def delete_finished(self, queue: str, state: JobState, before: float) -> int:
        gone = self.conn.execute("DELETE FROM jobs WHERE queue = ? AND state = ? AND finished_at < ? RETURNING id",
                                 (queue, state.value, before)).fetchall()
        self.conn.executemany("DELETE FROM executions WHERE job_id = ?", gone)
        return len(gone)

    def delete_finished_ids(self, job_ids: Sequence[int], states: Sequence[JobState], before: float) -> int:
        gone: list = []
        for chunk in _chunks(list(job_ids)):
            gone += self.conn.execute(
                f"DELETE FROM jobs WHERE id IN ({_marks(chunk)}) AND state IN ({_marks(states)}) AND finished_at < ? "
                f"RETURNING id", (*chunk, *(s.value for s in states), before)).fetchall()
        self.conn.executemany("DELETE FROM executions WHERE job_id = ?", gone)
        return len(gone)

    def executions(self, job_id: int | None, limit: int | None) -> list[tuple]:
        clause, args = ("WHERE job_id = ?", [job_id]) if job_id is not None else ("", [])
        return self.conn.execute(
            f"SELECT job_id, attempt, worker, started_at, finished_at, outcome, error FROM executions {clause} "
            f"ORDER BY id LIMIT ?", (*args, -1 if limit is None else limit)).fetchall()

    def last_attempt_id(self) -> int:
        return self.conn.execute("SELECT COALESCE(MAX(id), 0) FROM executions").fetchone()[0]

    def attempts_after(self, after: int, limit: int) -> list[tuple]:
        # A range of the primary key, each job found by its own: no scan, however many rows.
        # Ids are handed out at commit under the write lock: every gap is for good.
        return self.conn.execute(
            "SELECT e.id, j.queue, j.task, e.outcome, e.finished_at - e.started_at, "
            "e.outcome = 'dead' OR (e.outcome IN ('fail', 'lost') AND e.attempt >= j.max_attempts), 1 "
            "FROM executions e LEFT JOIN jobs j ON j.id = e.job_id WHERE e.id > ? ORDER BY e.id LIMIT ?",
            (after, limit)).fetchall()

    def arrivals_since(self, queue: str, second: int) -> dict[int, int]:
        return dict(self.conn.execute(
            "SELECT second, SUM(arrivals) FROM rates WHERE queue = ? AND second >= ? "
            "GROUP BY second HAVING SUM(arrivals) > 0", (queue, second)))

    def first_claims(self, owners: Sequence[str]) -> dict[str, float]:
        found: dict[str, float] = {}
        for owner in owners:
            running = self.conn.execute("SELECT MIN(started_at) FROM jobs WHERE state = 'running' "
                                        "AND lease_owner = ?", (owner,)).fetchone()[0]
            ended = self.conn.execute("SELECT MIN(started_at) FROM executions WHERE worker = ?",
                                      (owner,)).fetchone()[0]
            times = [t for t in (running, ended) if t is not None]
            if times:
                found[owner] = min(times)
        return found

    def stats_rows(self, queue: str, now: float, window: float, due_within: float, *,
                   unless_due: bool = False) -> StatsRows | None:
        # Each read only when the counts say it can find something: an idle queue is two
        # index lookups.
        if unless_due and self._any_due(now):
            return None
        counts: dict[str, dict[str, int]] = {}
        for state, tenant, n in self.conn.execute(
                f"SELECT state, tenant, n FROM counts WHERE queue = ? AND state IN ({_marks(READ_BUCKETS)})",
                (queue, *READ_BUCKETS)):
            counts.setdefault(tenant, {})[state] = n
        events: dict[str, tuple[int, int, int]] = {}
        by_second: dict[int, int] = {}
        recent = now - RECENT_WINDOW
        for second, tenant, arrivals, completions, failures in self.conn.execute(  # summed here: no sort
                "SELECT second, tenant, arrivals, completions, failures FROM rates WHERE queue = ? AND second > ?",
                (queue, min(now - window, recent))):
            if completions and second > recent:
                by_second[second] = by_second.get(second, 0) + completions
            if second <= now - window:
                continue
            before = events.get(tenant, (0, 0, 0))
            events[tenant] = (before[0] + arrivals, before[1] + completions, before[2] + failures)
        sample = []
        if counts or events:
            sample = self.conn.execute(
                f"SELECT tenant, finished_at, finished_at - started_at FROM jobs WHERE queue = ? "
                f"AND state = 'done' AND finished_at >= ? AND started_at IS NOT NULL "
                f"ORDER BY finished_at DESC LIMIT {DURATION_SAMPLE}",
                (queue, now - max(window, DURATION_HORIZON))).fetchall()
        first_run_at = {}
        for tenant, by_state in counts.items():
            if by_state.get("queued"):
                first_run_at[tenant] = self.conn.execute(
                    f"SELECT MIN(run_at) FROM jobs WHERE {_DUE} AND waiting_for IS NULL AND queue = ? "
                    f"AND tenant = ?", (queue, tenant)).fetchone()[0]
        caps: dict[str, int] = {}
        running_by_tenant: dict[str, int] = {}
        if first_run_at:
            caps = dict(self.conn.execute("SELECT tenant, max_running FROM tenant_caps"))
            if caps:
                running_by_tenant = self.running_by_tenant()
        coming, next_due = 0, None
        if any(by_state.get("delayed") for by_state in counts.values()):
            next_due = self.conn.execute(f"SELECT min(run_at) FROM jobs WHERE {_DELAYED} AND waiting_for IS NULL "
                                         f"AND queue = ?", (queue,)).fetchone()[0]
            if due_within > 0 and next_due is not None and next_due <= now + due_within:
                coming = self.conn.execute(
                    f"SELECT COUNT(*) FROM (SELECT 1 FROM jobs WHERE {_DELAYED} AND waiting_for IS NULL "
                    f"AND queue = ? AND run_at <= ? LIMIT {COMING_DUE_LIMIT})", (queue, now + due_within)).fetchone()[0]
        running = (0, 0.0)
        if any(by_state.get("running") for by_state in counts.values()):
            running = self.conn.execute(
                "SELECT COUNT(*), TOTAL(? - started_at) FROM jobs WHERE state = 'running' AND queue = ? "
                "AND started_at IS NOT NULL", (now, queue)).fetchone()
        return StatsRows(counts=counts, events=events, durations=durations_of(sample, now=now),
                         first_run_at=first_run_at, caps=caps,
                         running_by_tenant=running_by_tenant, coming_due=coming, running=tuple(running),
                         next_due=next_due, completions_by_second=by_second)

    # -- dependency limits -----------------------------------------------------------------

    def leased_ids(self, owner: str, job_ids: Sequence[int]) -> set[int]:
        return {row[0] for chunk in _chunks(job_ids) for row in self.conn.execute(
            f"SELECT id FROM jobs WHERE id IN ({_marks(chunk)}) AND state = 'running' AND lease_owner = ?",
            (*chunk, owner))}

    def admitted_ids(self, owner: str, job_ids: Sequence[int]) -> set[int]:
        return {row[0] for chunk in _chunks(job_ids) for row in self.conn.execute(
            f"SELECT DISTINCT job_id FROM dependency_holds WHERE job_id IN ({_marks(chunk)}) AND owner = ?",
            (*chunk, owner))}

    def lock_dependencies(self, names: Sequence[str]) -> dict[str, float | None]:
        # The write transaction holds the store's one write lock already.
        tats = dict(self.conn.execute(f"SELECT dependency, tat FROM dependency_tat WHERE dependency IN "
                                      f"({_marks(names)})", tuple(names)))
        return {name: tats.get(name) for name in names}

    def live_holds(self, names: Sequence[str]) -> list[tuple[str, float]]:
        return self.conn.execute(_LIVE_HOLDS.format(_marks(names)), tuple(names)).fetchall()

    def recent_hold_times(self, name: str, since: float, limit: int) -> list[float]:
        return [row[0] for row in self.conn.execute(
            "SELECT seconds FROM dependency_hold_times WHERE dependency = ? AND ended_at > ? "
            "ORDER BY ended_at DESC LIMIT ?", (name, since, limit))]

    def add_holds(self, holds: Sequence[tuple[str, int, str, float]], *, count: bool = False) -> None:
        self.conn.executemany(
            "INSERT OR REPLACE INTO dependency_holds (dependency, job_id, owner, since) SELECT ?1, ?2, ?3, ?4 "
            "WHERE EXISTS (SELECT 1 FROM jobs WHERE id = ?2 AND state = 'running' AND lease_owner = ?3)", holds)
        if count:
            admitted = collections.Counter((name, int(since)) for name, _, _, since in holds)
            for (name, second), n in sorted(admitted.items()):
                self.bump_dependency(name, second, n, 0)

    def own_shares(self, owner: str, names: Sequence[str]) -> dict[str, Share]:
        return {name: Share(slots, expires, wanted) for name, slots, expires, wanted in self.conn.execute(
            f"SELECT dependency, slots, expires, wanted FROM dependency_shares WHERE owner = ? "
            f"AND dependency IN ({_marks(names)})", (owner, *names))}

    def owner_holds(self, owner: str, names: Sequence[str]) -> dict[str, int]:
        return dict(self.conn.execute(
            f"SELECT h.dependency, COUNT(*) FROM dependency_holds h JOIN jobs j ON j.id = h.job_id "
            f"WHERE h.owner = ? AND h.dependency IN ({_marks(names)}) AND j.state = 'running' "
            f"AND j.lease_owner = h.owner GROUP BY h.dependency", (owner, *names)))

    def shares_of(self, name: str) -> dict[str, Share]:
        return {owner: Share(slots, expires, wanted) for owner, slots, expires, wanted in self.conn.execute(
            "SELECT owner, slots, expires, wanted FROM dependency_shares WHERE dependency = ?", (name,))}

    def holds_by_owner(self, name: str) -> dict[str, int]:
        return dict(self.conn.execute(
            "SELECT h.owner, COUNT(*) FROM dependency_holds h JOIN jobs j ON j.id = h.job_id "
            "WHERE h.dependency = ? AND j.state = 'running' AND j.lease_owner = h.owner GROUP BY h.owner", (name,)))

    def set_share(self, name: str, owner: str, share: Share) -> None:
        self.conn.execute(
            "INSERT INTO dependency_shares (dependency, owner, slots, expires, wanted) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (dependency, owner) DO UPDATE SET slots = excluded.slots, expires = excluded.expires, "
            "wanted = excluded.wanted", (name, owner, share.slots, share.expires, share.wanted))

    def wanted_by_others(self, owner: str, names: Sequence[str], now: float) -> dict[str, int]:
        return dict(self.conn.execute(
            f"SELECT dependency, SUM(wanted) FROM dependency_shares WHERE dependency IN ({_marks(names)}) "
            f"AND owner <> ? AND expires > ? AND wanted > 0 GROUP BY dependency", (*names, owner, now)))

    def drop_shares(self, owners: Sequence[str]) -> None:
        self.conn.executemany("DELETE FROM dependency_shares WHERE owner = ?", [(owner,) for owner in owners])

    def set_tat(self, name: str, tat: float) -> None:
        self.conn.execute("INSERT INTO dependency_tat (dependency, tat) VALUES (?, ?) "
                          "ON CONFLICT (dependency) DO UPDATE SET tat = excluded.tat", (name, tat))

    def bump_dependency(self, name: str, second: int, admitted: int, deferred: int) -> None:
        self.conn.execute(
            "INSERT INTO dependency_events (dependency, second, admitted, deferred) VALUES (?,?,?,?) "
            "ON CONFLICT (dependency, second) DO UPDATE SET admitted = admitted + excluded.admitted, "
            "deferred = deferred + excluded.deferred", (name, second, admitted, deferred))

    def waiting_for(self, name: str, limit: int) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM (SELECT 1 FROM jobs WHERE state = 'queued' "
                                 "AND waiting_for = ? LIMIT ?)", (name, limit)).fetchone()[0]

    def dependency_events(self, name: str, since: float) -> tuple[int, int]:
        admitted, deferred = self.conn.execute(
            "SELECT TOTAL(admitted), TOTAL(deferred) FROM dependency_events WHERE dependency = ? AND second > ?",
            (name, since)).fetchone()
        return int(admitted), int(deferred)

    # -- hosts -----------------------------------------------------------------------------

    def beat(self, host: str, now: float, interval: float, report: str) -> None:
        self.conn.execute(
            "INSERT INTO hosts (name, last_beat, interval, report, registered_at) VALUES (?,?,?,?,?) "
            "ON CONFLICT (name) DO UPDATE SET last_beat = excluded.last_beat, "
            "interval = excluded.interval, report = excluded.report", (host, now, interval, report, now))

    def host_rows(self) -> list[tuple[str, float, float, str, float]]:
        return self.conn.execute(
            "SELECT name, last_beat, interval, report, registered_at FROM hosts ORDER BY name").fetchall()

    def forget_host(self, host: str) -> bool:
        return self.conn.execute("DELETE FROM hosts WHERE name = ?", (host,)).rowcount > 0

    # -- the tasks' declarations -----------------------------------------------------------

    def declare_tasks(self, declared: Sequence[TaskDeclaration], by: str, now: float) -> int:
        written = 0
        for d in declared:
            written += self.conn.execute(
                "INSERT INTO task_declarations (task, queue, priority, max_attempts, timeout, declared_at, "
                "declared_by) VALUES (?,?,?,?,?,?,?) ON CONFLICT (task) DO UPDATE SET queue = excluded.queue, "
                "priority = excluded.priority, max_attempts = excluded.max_attempts, timeout = excluded.timeout, "
                "declared_at = excluded.declared_at, declared_by = excluded.declared_by "
                "WHERE queue IS NOT excluded.queue OR priority IS NOT excluded.priority "
                "OR max_attempts IS NOT excluded.max_attempts OR timeout IS NOT excluded.timeout",
                (d.task, d.queue, d.priority, d.max_attempts, d.timeout, now, by)).rowcount
        return written

    def task_declarations(self, tasks: Sequence[str] | None) -> dict[str, TaskDeclaration]:
        columns = "task, queue, priority, max_attempts, timeout, declared_at, declared_by"
        if tasks is None:
            rows = self.conn.execute(f"SELECT {columns} FROM task_declarations ORDER BY task").fetchall()
        else:
            rows = [row for task in tasks for row in self.conn.execute(
                f"SELECT {columns} FROM task_declarations WHERE task = ?", (task,))]
        return {row[0]: TaskDeclaration(*row) for row in rows}

    # -- schedules -------------------------------------------------------------------------

    def ensure_schedules(self, names: Sequence[str], now: float) -> None:
        self.conn.executemany("INSERT INTO schedules (name, since) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
                              [(name, now) for name in names])

    def insert_slot(self, schedule: str, kind: str, at: float, host: str, now: float) -> bool:
        return self.conn.execute(
            "INSERT INTO schedule_slots (schedule, kind, slot, host, decided_at) VALUES (?,?,?,?,?) "
            "ON CONFLICT (schedule, kind, slot) DO NOTHING", (schedule, kind, at, host, now)).rowcount > 0

    def decide_slot(self, schedule: str, kind: str, at: float, outcome: str, reason: str | None,
                    slots: int, job_id: int | None) -> None:
        self.conn.execute("UPDATE schedule_slots SET outcome = ?, reason = ?, slots = ?, job_id = ? "
                          "WHERE schedule = ? AND kind = ? AND slot = ?",
                          (outcome, reason, slots, job_id, schedule, kind, at))

    def schedule_paused(self, name: str) -> bool:
        row = self.conn.execute("SELECT paused FROM schedules WHERE name = ?", (name,)).fetchone()
        return bool(row and row[0])

    def previous_job_live(self, name: str, before: float) -> bool:
        row = self.conn.execute(
            "SELECT j.state FROM schedule_slots s LEFT JOIN jobs j ON j.id = s.job_id "
            "WHERE s.schedule = ? AND s.kind = 'slot' AND s.slot < ? AND s.outcome = 'fired' "
            "ORDER BY s.slot DESC LIMIT 1", (name, before)).fetchone()
        return bool(row and row[0] in ("queued", "running"))

    def count_slots(self, name: str, fired: int, skipped: int) -> None:
        self.conn.execute("UPDATE schedules SET fired = fired + ?, skipped = skipped + ? WHERE name = ?",
                          (fired, skipped, name))

    def set_paused(self, name: str, paused: bool, now: float) -> bool:
        self.ensure_schedules([name], now)
        return self.conn.execute("UPDATE schedules SET paused = ? WHERE name = ? AND paused != ?",
                                 (int(paused), name, int(paused))).rowcount > 0

    def schedule_rows(self, names: Sequence[str]) -> list[tuple[str, float, bool, int, int]]:
        if not names:
            return []
        return [(name, since, bool(paused), fired, skipped) for name, since, paused, fired, skipped in
                self.conn.execute(f"SELECT name, since, paused, fired, skipped FROM schedules "
                                  f"WHERE name IN ({_marks(names)}) ORDER BY name", list(names))]

    def newest_slot(self, name: str, kind: str) -> tuple | None:
        return self.conn.execute(f"{_LEDGER} WHERE s.schedule = ? AND s.kind = ? ORDER BY s.slot DESC LIMIT 1",
                                 (name, kind)).fetchone()

    def slot_rows(self, name: str, limit: int) -> list[tuple]:
        return self.conn.execute(f"{_LEDGER} WHERE s.schedule = ? ORDER BY s.decided_at DESC, s.slot DESC LIMIT ?",
                                 (name, limit)).fetchall()

    def prune_slots(self, before: float) -> int:
        return self.conn.execute(
            "DELETE FROM schedule_slots WHERE slot < ? AND slot < (SELECT MAX(n.slot) FROM schedule_slots n "
            "WHERE n.schedule = schedule_slots.schedule AND n.kind = schedule_slots.kind)", (before,)).rowcount


# A ledger row with its job's state now (schedules.ledger_row reads it).
_LEDGER = ("SELECT s.schedule, s.kind, s.slot, s.outcome, s.reason, s.slots, s.job_id, s.host, s.decided_at, "
           "j.state FROM schedule_slots s LEFT JOIN jobs j ON j.id = s.job_id")


# A revived job: queued again, due now, no attempt used yet.
_REVIVE = "UPDATE jobs SET state = 'queued', delayed = 0, attempts = 0, run_at = ?, finished_at = NULL"


def _where(*, state: str | None = None, queue: str | None = None, ids: Sequence[int] | None = None,
           task: str | None = None, tenant: str | None = None, before: int | None = None) -> tuple[str, list[Any]]:
    """A WHERE clause (empty when nothing is asked) and its arguments."""
    terms, args = [], []
    for column, value in (("state", state), ("queue", queue), ("task", task), ("tenant", tenant)):
        if value is not None:
            terms.append(f"{column} = ?")
            args.append(value)
    if before is not None:
        terms.append("id < ?")
        args.append(before)
    if ids is not None:
        terms.append(f"id IN ({_marks(ids)})")
        args.extend(ids)
    return (f"WHERE {' AND '.join(terms)}" if terms else ""), args
