"""0 -> 40 workers of a PostgreSQL pool under a real systemd, with and without a binding start_burst.

    .venv/bin/python bench/start_burst_bench.py [--runs 1] [--json bench/results-start-burst.json]

Each scenario installs flexiqd afresh in the nspawn sandbox on a fresh database of the
sandbox's PostgreSQL 15 (max_connections 100), with the pool ``burst`` (0..40 workers of
``flexiqd.demo:queue``, concurrency 1) using the dependency ``db`` (capacity 100, 2 per
worker), and scales it to 40 while the system test's sampler
(tests/system/test_start_burst_systemd.py) reads systemd's unit states and the server's
``pg_stat_activity`` every ~20 ms.  Scenarios:

- ``policy/8``: ``start_burst: 8``; the policy asks for 40 at once (400 delayed 10 s jobs
  come due: the "due" signal sizes the pool for all of them in one decision).
- ``policy/40``: the same with ``start_burst: 40`` -- a burst that does not bind.
- ``pin/8``: ``start_burst: 8``; an operator's ``flexiqctl scale burst 40``.

For each: the peaks (workers starting, workers connecting, connections of starting
workers, worker connections opened within one second, client connections on the
server), the time from the daemon's first scale-up decision (its scale event) to the
40th unit active (systemd's ActiveEnterTimestamp, i.e. READY=1), the server's connection
count over time, and what went wrong (``too many clients`` and other FATAL lines in the
server's log, worker units that failed).  Not a test: numbers go to bench/README.md (start bursts).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from system import test_start_burst_systemd as sb  # noqa: E402
from system.sandbox import Sandbox  # noqa: E402

PG_LOG = "/var/log/postgresql/postgresql-15-main.log"
# name -> (trigger, start_burst, seconds the server delays each new connection of the workers' role)
SCENARIOS = {"policy/8": ("policy", 8, 0), "policy/40": ("policy", 40, 0), "pin/8": ("pin", 8, 0),
             "policy/8 slow connect": ("policy", 8, 2), "policy/40 slow connect": ("policy", 40, 2)}
READY_MARKS = (1, 8, 20, 40)


def log_lines(sbx: Sandbox) -> int:
    return int(sbx.run(f"wc -l < {PG_LOG} 2>/dev/null || echo 0").stdout.strip() or 0)


def new_log(sbx: Sandbox, since: int) -> list[str]:
    return sbx.run(f"tail -n +{since + 1} {PG_LOG} 2>/dev/null || true").stdout.splitlines()


def every(timeline: list, step: float) -> list:
    """One row of the timeline per ``step`` seconds (the first sample at or after each)."""
    rows, next_at = [], None
    for row in timeline:
        if next_at is None or row[0] >= next_at:
            rows.append(row)
            next_at = (row[0] // step + 1) * step
    return rows


def scenario(sbx: Sandbox, name: str) -> dict:
    how, burst, delay = SCENARIOS[name]
    sb.prepare(sbx, burst)
    if delay:
        # After the daemon connected: its connection is not delayed; every new one is (the server
        # sleeps after forking the backend, before authentication), as a slow remote server or a
        # pooler with a queue would.
        sb.psql(sbx, f"ALTER SYSTEM SET pre_auth_delay = '{delay}s'")
        sb.psql(sbx, "SELECT pg_reload_conf()")
    max_connections = int(sbx.run(["runuser", "-u", "postgres", "--", "psql", "-tAc", "SHOW max_connections"])
                          .stdout.strip())
    before = log_lines(sbx)
    try:
        result, document = sb.scale_up(sbx, how, limit=90.0)
    finally:
        if delay:
            sb.psql(sbx, "ALTER SYSTEM RESET pre_auth_delay")
            sb.psql(sbx, "SELECT pg_reload_conf()")
    log = new_log(sbx, before)
    ups = [e for e in document["events"] if e["pool"] == sb.POOL and e["desired"] > e["previous"]]
    decided = min((e["at"] for e in ups), default=None)
    failed = sorted({unit for sample in document["samples"] for unit, state in sample["units"].items()
                     if state == "f"})
    restarts = sum(int(value) for value in sbx.run(
        f"systemctl show -p NRestarts --value 'flexiq-worker@{sb.POOL}-*.service'").stdout.split())
    # Why a worker failed, if one did (a failed start is restarted by systemd: Restart=on-failure).
    worker_errors = sbx.run(f"journalctl --no-pager -o cat -p warning -u 'flexiq-worker@{sb.POOL}-*' "
                            f"--since @{int(document['asked']) - 1} | head -20", check=False).stdout.splitlines()
    sb.stop_flexiqd(sbx)
    row = {
        "scenario": name, "trigger": how, "start_burst": burst, "connect_delay_s": delay,
        "max_connections": max_connections,
        **{k: v for k, v in result.as_dict().items() if k not in ("timeline", "ready_times")},
        "decision_to_all_active_s": (result.all_ready - decided) if decided and result.all_ready else None,
        "asked_to_decision_s": (decided - document["asked"]) if decided else None,
        "first_start_to_all_active_s": (result.all_ready - result.first_start)
        if result.all_ready and result.first_start else None,
        "decision_to_nth_active_s": {str(n): result.ready_times[n - 1] - decided for n in READY_MARKS
                                     if decided and len(result.ready_times) >= n},
        "scale_events": [[e["previous"], e["desired"], e["reason"], round(e["at"] - decided, 3)] for e in ups],
        "too_many_clients": sum("too many clients" in line for line in log),
        "fatal_lines": [line for line in log if "FATAL" in line][:20],
        "failed_units": failed,
        "restarts": restarts,
        "worker_errors": worker_errors,
        "timeline_250ms": every(result.timeline, 0.25),
    }
    print(f"  {name}: peak starting {row['peak_starting']} (exact {row['peak_starting_exact']}), "
          f"connecting {row['peak_connecting']} "
          f"(sampled {row['peak_connecting_sampled']}), connections of starting workers "
          f"{row['peak_starting_connections']}, opened within 1 s {row['peak_new_connections_1s']}, "
          f"on the server {row['peak_connections']}/{max_connections}; decision -> 40 active "
          f"{fmt(row['decision_to_all_active_s'])} s (1st/8th/20th: "
          f"{', '.join(fmt(row['decision_to_nth_active_s'].get(str(n))) for n in READY_MARKS[:3])}); "
          f"steps {[(a, b) for a, b, _, _ in row['scale_events']]}; "
          f"too many clients {row['too_many_clients']}, failed units {len(failed)}", flush=True)
    return row


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--json", default=str(REPO / "bench" / "results-start-burst.json"))
    args = parser.parse_args()
    names = [n for n in args.scenarios.split(",") if n]
    rows = []
    started = time.time()
    with Sandbox() as sbx:
        try:
            for run in range(args.runs):
                print(f"Run {run + 1}:", flush=True)
                for name in names:
                    rows.append({"run": run + 1, **scenario(sbx, name)})
        finally:
            sb.stop_flexiqd(sbx)
    summary = {}
    for name in names:
        mine = [r for r in rows if r["scenario"] == name]
        summary[name] = {key: statistics.median(r[key] for r in mine) for key in (
            "peak_starting", "peak_starting_exact", "peak_connecting", "peak_connecting_sampled",
            "peak_starting_connections",
            "peak_new_connections_1s", "peak_new_connections_250ms", "peak_connections", "decision_to_all_active_s",
            "first_start_to_all_active_s", "too_many_clients") if all(r[key] is not None for r in mine)}
    document = {"date": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)), "runs": args.runs,
                "cores": os.cpu_count(), "summary": summary, "rows": rows}
    pathlib.Path(args.json).write_text(json.dumps(document, indent=1) + "\n")
    print(f"Wrote {args.json}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
