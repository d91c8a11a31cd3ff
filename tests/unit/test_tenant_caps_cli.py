"""``flexiq stats`` shows the jobs a tenant cap holds back, per queue and per tenant."""

from __future__ import annotations

import json
import time

from flexiqd.cli.flexiq import main
from flexiqd.queue import ClaimRequest, NewJob, open_backend
from flexiqd.queue.limits import TenantCaps


def test_stats_shows_the_tenants_at_their_cap(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    backend = open_backend(url)
    now = time.time()
    backend.enqueue([NewJob(task="t", tenant="acme") for _ in range(5)]
                    + [NewJob(task="t", tenant="shop") for _ in range(2)], now=now)
    backend.claim(ClaimRequest("w1", ("default",), 3, tenant_caps=TenantCaps({"acme": 2})), now=now)
    backend.close()
    assert main(["--url", url, "stats"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    table = {row.split()[0]: dict(zip(header.split(), row.split())) for row in rows}
    assert (table["default"]["RUNNABLE"], table["default"]["CAPPED"], table["default"]["RUNNING"]) == ("1", "3", "3")
    assert (table["acme"]["RUNNABLE"], table["acme"]["CAPPED"]) == ("0", "3")
    assert (table["shop"]["RUNNABLE"], table["shop"]["CAPPED"]) == ("1", "0")
    assert main(["--url", url, "stats", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["default"]
    assert (shown["held_by_tenant_cap"], shown["tenants"]["acme"]["held_by_tenant_cap"]) == (3, 3)
