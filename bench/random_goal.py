"""flexiqd's policy alone against the goal on workloads drawn at random, the oracle's runs cached.

    .venv/bin/python bench/random_goal.py --count 300 --seed 1205 --cache /tmp/goal-cache
    .venv/bin/python bench/random_goal.py --count 300 --seed 1205 --cache /tmp/goal-cache --json rows.jsonl

``flexiq bench policies --random N`` runs every policy on every workload; most of its time is
the oracle's look-ahead, which does not depend on flexiqd's code.  This runs the oracle (and
KEDA's depth rule, which the goal's undeclared-dependency part is judged against) once per
workload and keeps their results in ``--cache``; a change of flexiqd's policy is then judged
on the same workloads in a minute or two.  The verdicts are ``report.check_goal``'s, as in the
bench.  The cache is only valid for one version of the simulator: clear it when
flexiqd/sim changes.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import pickle
import sys
from multiprocessing import Pool

BENCH = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from flexiqd.sim.engine import run  # noqa: E402
from flexiqd.sim.families import sample  # noqa: E402
from flexiqd.sim.oracle import Oracle  # noqa: E402
from flexiqd.sim.policies import Flexiqd, KedaDepth  # noqa: E402
from flexiqd.sim.random_report import PARTS  # noqa: E402
from flexiqd.sim.report import TraceReport, check_goal  # noqa: E402
from flexiqd.sim.trace import realise  # noqa: E402


def references(trace, workload, cache: pathlib.Path):
    """The oracle's run (and KEDA's where the dependency is undeclared), from the cache when there."""
    path = cache / f"{trace.name}.pkl"
    if path.exists():
        with path.open("rb") as handle:
            return pickle.load(handle)
    policies = [Oracle()]
    if trace.dependency is not None and not trace.dependency.declared:
        policies.insert(0, KedaDepth())
    results = tuple(run(trace, workload, policy) for policy in policies)
    partial = path.with_suffix(f".{os.getpid()}")
    with partial.open("wb") as handle:
        pickle.dump(results, handle)
    partial.replace(path)  # whole or not at all: two runs may share a cache
    return results


def judge(args: tuple) -> dict:
    trace, cache = args
    workload = realise(trace)
    mine = run(trace, workload, Flexiqd())
    report = TraceReport(trace=trace, results=(mine,) + tuple(references(trace, workload, cache)))
    goal = check_goal(report)
    oracle = report.result("oracle")
    return {"name": trace.name, "met": goal.met, "parts": {part: getattr(goal, part) for part in PARTS},
            "slo": mine.slo_seconds, "oracle_slo": oracle.slo_seconds, "cost": report.cost_ratio(mine),
            "over_capacity": mine.over_capacity_seconds, "completion_p95": mine.completion_p95,
            "oracle_completion_p95": oracle.completion_p95}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=54)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--family", action="append", help="draw from this family only (repeatable)")
    parser.add_argument("--cache", type=pathlib.Path, required=True, help="a folder for the oracle's runs")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=pathlib.Path, help="write one JSON line per workload here")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    traces = sample(args.count, args.seed, tuple(args.family) if args.family else None)
    with Pool(args.jobs) as pool:
        rows = pool.map(judge, [(trace, args.cache) for trace in traces], chunksize=1)
    if args.json:
        args.json.write_text("".join(json.dumps(row) + "\n" for row in rows))
    families: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for row in rows:
        tally = families[row["name"].rsplit("-", 1)[0]]
        tally[0] += row["met"]
        tally[1] += 1
    print(f"whole goal {sum(row['met'] for row in rows)}/{len(rows)}; "
          + ", ".join(f"{part} {sum(row['parts'][part] for row in rows)}" for part in PARTS))
    for family, (met, count) in families.items():
        print(f"  {family} {met}/{count}")


if __name__ == "__main__":
    main()
