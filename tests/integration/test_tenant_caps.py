"""Tenant caps held by real worker processes sharing one SQLite store.

What ran when is read from the tasks' own marks (start and end times of every
execution, written by the task), never from the store's bookkeeping.
"""

from __future__ import annotations

from .test_dependency_limits import _app, _finish, _marks, _most_at_once
from .test_worker_processes import _start_worker


def test_workers_never_run_more_of_a_capped_tenants_jobs_than_its_cap(store, workers, tmp_path):
    app = _app(store)
    config = tmp_path / "flexiqd.yaml"
    config.write_text("tenants:\n  bulk: {max_running: 2}\n"
                      "pools:\n  default:\n    app: limited_app:queue\n    concurrency: 2\n")
    free = app.tasks["free"]
    # The capped tenant's jobs come first: without the cap they would take every slot.
    bulk = app.enqueue_many([free.new_job((0.1,), tenant="bulk") for _ in range(30)])
    shop = app.enqueue_many([free.new_job((0.1,), tenant="shop") for _ in range(30)])
    procs = [_start_worker(workers, "--instance", f"default-{n}", "--config", str(config))[0] for n in (1, 2, 3)]
    _finish(app, bulk + shop, procs)

    events = _marks(workers.marks)
    of_bulk = [e for e in events if e[2] in set(bulk)]
    of_shop = [e for e in events if e[2] in set(shop)]
    assert len(of_bulk) == 60 and len(of_shop) == 60  # each job started and ended once
    assert _most_at_once(of_bulk) == 2  # never more, with six slots in three workers free for them
    assert _most_at_once(events) > 2  # the other tenant's jobs ran beside them
    first_shop_start = min(at for at, what, _job, _pid in of_shop if what == "start")
    last_bulk_start = max(at for at, what, _job, _pid in of_bulk if what == "start")
    assert first_shop_start < last_bulk_start  # not held behind the capped tenant's backlog
    assert len({pid for _at, _what, _job, pid in events}) == 3, "a worker took no part"
    stats = app.stats()
    assert (stats.running, stats.held_by_tenant_cap, stats.runnable) == (0, 0, 0)
    app.close()
