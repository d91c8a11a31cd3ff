"""The hidden_ceiling family as drawn, and the same workloads with the ceiling shaped as the real runs fit it.

    .venv/bin/python bench/ceiling_family_check.py --count 30           # ~1 min per workload and variant
    .venv/bin/python bench/ceiling_family_check.py --count 30 --record  # -> results-ceilings-family.json

The random benchmark's undeclared ceilings (flexiqd/sim/families.py, ``_flash``) use the
``contention`` dependency model, its overload penalty drawn from 0.2-1.0.  The real ceilings
(bench/ceilings-sim.md) fit the ``queue`` model: a penalty of 0-0.005, and a request path that
waits a job's hold over the capacity per unit of load past about 57 % of the capacity left to
the jobs.  This runs every policy and the oracle on the same drawn workloads both ways and
counts, per variant, the workloads on which flexiqd meets the goal (``report.check_goal``) and
each part of it.  It changes nothing in the family; it tells what such a change would move.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import sys
import time
from dataclasses import replace

BENCH = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from flexiqd.sim import families  # noqa: E402
from flexiqd.sim.bench import bench_trace  # noqa: E402
from flexiqd.sim.report import KEDA, SUBJECT, check_goal  # noqa: E402
from flexiqd.sim.trace import QUEUE, Trace  # noqa: E402

RECORD = BENCH / "results-ceilings-family.json"
FITTED_PENALTY = 0.003      # the real ceilings: 0-0.005 per unit of excess utilisation
FITTED_WAIT_FROM = 0.57     # the request path starts to wait at this share of the jobs' capacity (median fit)


def as_fitted(trace: Trace) -> Trace:
    """``trace`` with its dependency shaped as the real ceilings fit it (the same capacity and jobs)."""
    dep = trace.dependency
    assert dep is not None
    hold = sum(source.duration.mean for source in trace.sources) / len(trace.sources) * dep.share * dep.per_job
    wait_from = dep.request_load + FITTED_WAIT_FROM * (dep.capacity - dep.request_load)
    fitted = replace(dep, model=QUEUE, overload_penalty=FITTED_PENALTY, request_wait=hold / dep.capacity,
                     request_wait_from=wait_from)
    return replace(trace, dependency=fitted)


def run(count: int, seed: int) -> dict:
    rng = random.Random(f"ceiling-family:{seed}")
    seeds = [rng.randrange(1_000_000) for _ in range(count)]
    rows = []
    for draw_seed in seeds:
        drawn = families.draw("hidden_ceiling", draw_seed)
        row = {"trace": drawn.name}
        for variant, trace in (("drawn", drawn), ("fitted", as_fitted(drawn))):
            report = bench_trace(trace)
            goal = check_goal(report)
            subject, keda = report.result(SUBJECT), report.result(KEDA)
            row[variant] = {
                "met": bool(goal and goal.met), "shortfalls": goal.shortfalls() if goal else ["no oracle"],
                "over_capacity_s": round(subject.over_capacity_seconds, 1),
                "keda_over_capacity_s": round(keda.over_capacity_seconds, 1),
                "inflation_mean": subject.inflation_mean, "cost_ratio": report.cost_ratio(subject)}
        rows.append(row)
        print(f"{row['trace']}: drawn {'met' if row['drawn']['met'] else row['drawn']['shortfalls']}, "
              f"fitted {'met' if row['fitted']['met'] else row['fitted']['shortfalls']}", flush=True)
    summary = {}
    for variant in ("drawn", "fitted"):
        parts: dict[str, int] = {}
        for row in rows:
            for part in row[variant]["shortfalls"]:
                parts[part] = parts.get(part, 0) + 1
        summary[variant] = {"met": sum(row[variant]["met"] for row in rows), "of": len(rows), "missed": parts}
    return {"seed": seed, "count": count, "summary": summary, "workloads": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record", action="store_true", help=f"write {RECORD.name}")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error(f"--count: must be >= 1, got {args.count}")
    started = time.monotonic()
    result = run(args.count, args.seed)
    result["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result["summary"], indent=1))
    if args.record:
        result["recorded"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        RECORD.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
