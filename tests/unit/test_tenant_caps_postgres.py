"""Tenant caps on the PostgreSQL store from many connections at once: claims on many hosts
never lease past a tenant's cap.  Runs on the session's own server."""

from __future__ import annotations

import pytest

from flexiqd.queue import ClaimRequest, NewJob, Outcome, open_backend
from flexiqd.queue.limits import TenantCaps
from pg_server import in_ci

try:
    import psycopg  # noqa: F401
except ImportError:  # no psycopg: skipped on a laptop, a failure in CI
    if in_ci():
        raise
    pytest.skip("psycopg 3 is not installed", allow_module_level=True)

from test_queue_postgres import run_together

T0 = 1_700_000_000.0
CAPS = TenantCaps({"acme": 3, "*": 5})


def test_claims_from_many_connections_at_once_never_exceed_a_tenants_cap(pg_server):
    url = pg_server.fresh_url()
    stores = [open_backend(url) for _ in range(6)]
    stores[0].enqueue([NewJob(task="t", tenant="acme") for _ in range(40)]
                      + [NewJob(task="t", tenant="globex") for _ in range(40)], now=T0)

    def work(i):
        held: list[int] = []
        for step in range(15):
            now = T0 + step
            if held and step % 3 == 0:
                stores[i].settle(f"w{i}", [Outcome.ack(held.pop(0))], now=now)
            held += [job.id for job in stores[i].claim(
                ClaimRequest(f"w{i}", ("default",), 2, tenant_caps=CAPS), now=now)]
            stats = stores[i].stats("default", now=now)
            assert stats.tenants["acme"].running <= 3
            assert stats.tenants["globex"].running <= 5
        return held

    run_together(6, work)
    stats = stores[0].stats("default", now=T0 + 20)
    assert (stats.tenants["acme"].running, stats.tenants["globex"].running) == (3, 5)
    assert stats.held_by_tenant_cap > 0
    for store in stores:
        store.close()
