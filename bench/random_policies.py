"""Every policy against the goal on workloads drawn at random, the oracle's (and KEDA's) runs from the
``bench/random_goal.py`` cache.

    .venv/bin/python bench/random_policies.py COUNT SEED CACHE OUT.json

Prints, per policy, how many workloads meet each part of the goal and the whole goal, and
flexiqd's worst cases; OUT.json keeps every verdict."""
import json
import pathlib
import sys
from multiprocessing import Pool
BENCH = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent)); sys.path.insert(0, str(BENCH))
from random_goal import references
from flexiqd.sim.engine import run
from flexiqd.sim.families import sample
from flexiqd.sim.policies import FixedPeak, HpaCpu, Flexiq, Flexiqd, KedaDepth
from flexiqd.sim.random_report import PARTS
from flexiqd.sim.report import TraceReport, check_goal
from flexiqd.sim.trace import realise
import pathlib
CACHE = pathlib.Path(sys.argv[3])

def judge(trace):
    w = realise(trace)
    refs = references(trace, w, CACHE)
    mine = tuple(run(trace, w, p) for p in (FixedPeak(w.runnable_at, w.base_duration), HpaCpu(), Flexiq(), Flexiqd()))
    if not any(r.policy == 'keda-depth' for r in refs):
        mine += (run(trace, w, KedaDepth()),)
    report = TraceReport(trace=trace, results=mine + tuple(refs))
    out = {}
    for r in report.results:
        if r.policy == "oracle":
            continue
        g = check_goal(report, r.policy)
        out[r.policy] = {p: getattr(g, p) for p in PARTS} | {"met": g.met, "slo_excess": r.slo_seconds - report.result("oracle").slo_seconds, "cost_ratio": report.cost_ratio(r)}
    return trace.name, out

if __name__ == "__main__":
    traces = sample(int(sys.argv[1]), int(sys.argv[2]))
    CACHE.mkdir(parents=True, exist_ok=True)
    with Pool(2) as pool:
        rows = pool.map(judge, traces, chunksize=4)
    json.dump(rows, open(sys.argv[4], "w"))
    policies = ['fixed-peak', 'hpa-cpu', 'keda-depth', 'flexiq', 'flexiqd']
    print("| policy | " + " | ".join(PARTS) + " | whole goal |")
    for p in policies:
        print(f"| {p} | " + " | ".join(str(sum(r[p][k] for _, r in rows)) for k in PARTS) + f" | {sum(r[p]['met'] for _, r in rows)} |")
    by_family = {}
    for n, r in rows:
        by_family.setdefault(n.rsplit("-", 1)[0], []).append(r)
    print("\n| family | " + " | ".join(policies) + " |")
    for family, mine in by_family.items():
        print(f"| {family} | " + " | ".join(f"{sum(r[p]['met'] for r in mine)}/{len(mine)}" for p in policies) + " |")
    worst = sorted(((r['flexiqd']['slo_excess'], n) for n, r in rows), reverse=True)[:5]
    print("flexiqd worst seconds over target beyond the oracle:", [(n, round(x)) for x, n in worst])
    costly = sorted(((r['flexiqd']['cost_ratio'], n) for n, r in rows), reverse=True)[:3]
    print("flexiqd costliest:", [(n, round(x, 2)) for x, n in costly])
