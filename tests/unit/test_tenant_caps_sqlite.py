"""The SQLite store's own side of tenant caps: a claim past a capped tenant's long backlog
reads index ranges of the other tenants, never the capped tenant's jobs one by one."""

from __future__ import annotations

from flexiqd.queue import ClaimRequest, NewJob
from flexiqd.queue.limits import TenantCaps
from flexiqd.queue.sqlite.database import SQLiteBackend

T0 = 1_700_000_000.0
CAPS = TenantCaps({"bulk": 2})


def _traced(store, call):
    issued: list[str] = []
    store.database.connection.set_trace_callback(issued.append)
    try:
        result = call()
    finally:
        store.database.connection.set_trace_callback(None)
    return result, issued


def test_a_claim_with_a_tenant_at_its_cap_reads_the_other_tenants_heads(tmp_path):
    store = SQLiteBackend(str(tmp_path / "queue.db"), synchronous="normal")
    store.enqueue([NewJob(task="t", tenant="bulk") for _ in range(3000)], now=T0)
    store.enqueue([NewJob(task="t", tenant="shop") for _ in range(5)], now=T0 + 1)
    store.claim(ClaimRequest("w0", ("default",), 2, tenant_caps=CAPS), now=T0 + 2)  # bulk at its cap
    claimed, issued = _traced(store, lambda: store.claim(
        ClaimRequest("w1", ("default",), 3, tenant_caps=CAPS), now=T0 + 2))
    assert [job.tenant for job in claimed] == ["shop"] * 3
    reads = [sql for sql in issued if sql.startswith("SELECT id, tenant") and "FROM jobs" in sql]
    assert reads and all("tenant = 'shop'" in sql for sql in reads), reads
    for sql in reads:
        plan = [row[-1] for row in store.database.connection.execute("EXPLAIN QUERY PLAN " + sql)]
        assert len(plan) == 1 and plan[0].startswith("SEARCH jobs USING INDEX jobs_tenant_claim"), plan
    store.close()
