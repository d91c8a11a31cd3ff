"""The workers' cgroup pressure (PSI) under the real systemd: read from each worker unit's own cgroup,
and a CPU-bound pool on a full machine held where its workers start to stall.

The container's systemd runs its units in cgroups of the unified (v2) hierarchy -- on these
machines mounted beside v1's controllers (``/sys/fs/cgroup/unified``) -- whose
``cpu.pressure`` the kernel keeps per unit.  The pool's jobs burn CPU (in C) on a machine of 2
cores; with its throughput knee off, what holds it below max_workers is the pressure alone.
"""

from __future__ import annotations

import json

from .flexiqd_install import BIN, DAEMON, REPO, flexiq, install, workers
from .sandbox import Sandbox

MAX_WORKERS = 8
PRESSURE_CONFIG = f"""
store: sqlite:////var/lib/flexiq/queue.db
tick: 1s
pools:
  default:
    app: spin_app:queue
    concurrency: 1
    min_workers: 1
    max_workers: {MAX_WORKERS}
    drain_timeout: 20s
    environment:
      PYTHONPATH: {REPO / "tests" / "apps"}
    targets: {{age: 2s}}
    knee: {{enabled: false}}
    pressure: {{cpu: 40}}
"""


def status(sbx: Sandbox) -> dict:
    return json.loads(sbx.run([str(BIN / "flexiqctl"), "status", "--json"]).stdout)


def cpu_evidence(sbx: Sandbox) -> dict | None:
    pool = status(sbx)["pools"]["default"]
    return next((e for e in pool.get("evidence") or () if e["source"] == "pressure:cpu"), None)


def test_a_cpu_bound_pool_is_held_by_its_workers_cpu_pressure(sandbox: Sandbox):
    install(sandbox, PRESSURE_CONFIG)
    try:
        sandbox.wait_for(lambda: len(workers(sandbox)) == 1, 30, what="the minimum worker unit")
        # Idle, its worker's pressure is read from its own unit's cgroup: a reading, not "no PSI".
        idle = sandbox.wait_for(lambda: (lambda e: e if e and e["reading"] is not None else None)(
            cpu_evidence(sandbox)), 30, interval=0.5, what="a cpu.pressure reading of the worker unit")
        assert idle["note"] is None and 0.0 <= idle["reading"] <= 100.0
        flexiq(sandbox, "enqueue", "spin", "1.0", "--count", "400")
        # A backlog of CPU-bound jobs on 2 cores: the signals want max_workers; the workers stall on
        # the CPU, and the pool is held at the count before the pressure rose.
        held = sandbox.wait_for(
            lambda: (lambda p: p if p.get("binding_cap") == "pressure:cpu" else None)(
                status(sandbox)["pools"]["default"]),
            90, interval=0.5, what="the pool held by its cpu pressure")
        assert held["binding_cap_workers"] < MAX_WORKERS, held
        assert held["decision"]["reason"] == "CappedByPressure", held
        assert "pressure:cpu caps at" in held["decision"]["rationale"], held
        evidence = cpu_evidence(sandbox)
        assert evidence["held_at"] is not None and evidence["level"] is not None, evidence
        journal = sandbox.run(["journalctl", "--no-pager", "-u", DAEMON]).stdout
        assert "bounded by cap pressure:cpu=" in journal
    finally:
        sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*'", check=False)
