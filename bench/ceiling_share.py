"""Throughput past a real ceiling when a job spends only a share of its time inside the dependency.

    .venv/bin/python bench/ceiling_share.py                          # threads, 8; outside 0, 50, 150 ms: ~6 min
    .venv/bin/python bench/ceiling_share.py --outside 50 --json F

A job does ``--outside`` ms of its own work (``time.sleep``, blocking in C) and then one
50 ms operation on a dependency of fixed capacity (the 8-thread service of
``ceiling_bench.py``, or its other kinds): its share of time inside is 50 / (50 + outside).
A fixed fleet is swept over worker counts, as ``ceiling_bench.py``'s knee sweep does, and
each count's throughput is set beside:

- the utilisation law's bound: completions x time inside <= capacity, so at most
  capacity / 50 ms jobs a second, whatever the share;
- the simulator's ``queue`` model of that dependency (capacity in slots, the share, no
  penalty), as ``flexiqd.sim.engine`` would make a job's duration at that count.

Results go to ``bench/results-ceiling-share.json`` and are rendered in
``bench/ceilings.md``'s last section by hand.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import pathlib
import sys
import tempfile

BENCH = pathlib.Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(BENCH), str(REPO / "tests"), str(REPO)]

from ceilings import Settings, ceiling, knee_sweep  # noqa: E402
from flexiqd.sim.ceiling_fit import queue_throughput  # noqa: E402

WORK = BENCH / ".work"


def modelled(capacity: float, share: float, inside_s: float, workers: int, concurrency: int) -> float:
    """Jobs a second the simulator's queue model gives ``workers`` busy workers (no penalty)."""
    return queue_throughput(workers * concurrency, base=inside_s / share, hold=inside_s, capacity=capacity,
                            penalty=0.0, request_load=0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="threads", choices=("threads", "connections"))
    parser.add_argument("--capacity", type=int, default=8)
    parser.add_argument("--outside", type=float, action="append", help="ms outside; repeatable (default 0, 50, 150)")
    parser.add_argument("--counts", default="2,4,6,8,10,12,16,20,24,32")
    parser.add_argument("--json", type=pathlib.Path, default=BENCH / "results-ceiling-share.json")
    args = parser.parse_args(argv)
    outsides = args.outside or [0.0, 50.0, 150.0]
    counts = [int(n) for n in args.counts.split(",")]
    settings = Settings()
    inside_ms = 50.0
    from pg_server import PostgresServer

    WORK.mkdir(parents=True, exist_ok=True)
    results = {"recorded": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "kind": args.kind, "capacity": args.capacity, "inside_ms": inside_ms,
               "concurrency": settings.concurrency, "sweeps": []}
    with PostgresServer() as server, ceiling(args.kind, args.capacity, server=server, job_ms=inside_ms) as dep:
        inside_s = dep.details["job_unloaded_ms"] / 1000.0
        for outside in outsides:
            share = inside_s / (inside_s + outside / 1000.0)
            swept = knee_sweep(dataclasses.replace(dep, outside_ms=outside), server,
                               pathlib.Path(tempfile.mkdtemp(prefix="share-", dir=WORK)), counts,
                               settings=settings, log=lambda message: print(message, flush=True))
            bound = args.capacity / inside_s
            rows = [{"workers": p["workers"], "jobs_per_s": p["jobs_per_s"],
                     "bound": round(bound, 1),
                     "model": round(modelled(args.capacity, share, inside_s, p["workers"], settings.concurrency), 1)}
                    for p in swept["points"]]
            results["sweeps"].append({"outside_ms": outside, "share": round(share, 3), "rows": rows})
            print(f"outside {outside:g} ms (share {share:.2f}): " + ", ".join(
                f"{r['workers']}: {r['jobs_per_s']:.0f} (model {r['model']:.0f})" for r in rows)
                + f"; bound {bound:.0f}", flush=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"results in {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
