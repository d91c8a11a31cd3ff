#!/usr/bin/env python3
"""What a dependency's concurrency limit costs a drain: real worker processes on one SQLite store.

Three ``flexiq worker`` processes of two slots each (as the process fleet starts them, each
with ``--instance default-N`` reading its pool from a config file) drain a backlog of jobs
that use a dependency limited to ``concurrency: 3``: six slots, three of them allowed
inside at once, so the others are refused (deferred, no attempt used) and claim again.
Each job records its own start and end (``tests/apps/limited_app.py``: ``time.sleep``,
blocking in C, as a call to the partner would).

Measured per run: the drain, from the first job's start to the last job's end (the
workers' own start-up is not in it), against the ideal of ``jobs x length / 3``; the
refusals, from the store's record of deferrals (``dependency_stats``); the most jobs
inside the dependency at one instant (must be 3).

Then what the limit's store calls cost on a large store (``--costs-jobs``, default
1,000,000 jobs on SQLite with ``synchronous=normal``, a tenth of them deferred for the
dependency): an admission (``Backend.admit``, one transaction: a job into a limit with
room), ``stats`` of the queue and ``dependency_stats`` (which counts the waiting jobs up to
100,000), each timed alone, the median kept.  Results go to ``bench/results-limits.json``;
bench/limits.md records a run.

    .venv/bin/python bench/limits_bench.py [--runs 3] [--costs-jobs 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
APPS = REPO / "tests" / "apps"
sys.path.insert(0, str(REPO))

from flexiqd import Queue  # noqa: E402
from flexiqd.queue import ClaimRequest, NewJob, Outcome, open_backend  # noqa: E402
from flexiqd.queue.limits import DependencyLimit  # noqa: E402
from flexiqd.queue.types import Deferral, JobState  # noqa: E402

WORKERS, SLOTS, LIMIT = 3, 2, 3
CASES = ((60, 0.1), (300, 0.05))  # (jobs, seconds each)
BATCH = 10_000
CONFIG = f"""dependencies:
  partner_api:
    capacity: 10
    limit: {{concurrency: {LIMIT}}}
pools:
  default:
    app: limited_app:queue
    concurrency: {SLOTS}
"""


def one_run(jobs: int, length: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="flexiq-limits-") as folder:
        root = Path(folder)
        store = f"sqlite:///{root / 'queue.db'}"
        config = root / "flexiqd.yaml"
        config.write_text(CONFIG)
        marks = root / "marks"
        marks.mkdir()
        queue = Queue(store)
        queue.task("partner_sync", uses=["partner_api"])(lambda seconds: None)
        ids = queue.tasks["partner_sync"].map([(length,)] * jobs)
        env = dict(os.environ, FLEXIQ_TEST_MARKS=str(marks), PYTHONPATH=os.pathsep.join([str(APPS), str(REPO)]))
        env.pop("NOTIFY_SOCKET", None)
        procs = [subprocess.Popen([sys.executable, "-m", "flexiqd.cli.flexiq", "--url", store, "worker",
                                   "--instance", f"default-{n}", "--config", str(config)],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(REPO))
                 for n in range(1, WORKERS + 1)]
        try:
            deadline = time.monotonic() + 300
            while not all(queue.get(i).state is JobState.DONE for i in ids):
                if time.monotonic() > deadline:
                    raise SystemExit("the backlog did not drain within 300 s")
                time.sleep(0.2)
            stats = queue.backend.dependency_stats("partner_api", now=time.time(), window=3600)
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(timeout=60)
            queue.close()
        events = sorted(_marks(marks))
    starts = [at for at, what in events if what == "start"]
    ends = [at for at, what in events if what == "end"]
    if len(starts) != jobs or len(ends) != jobs:
        raise SystemExit(f"{len(starts)} starts and {len(ends)} ends for {jobs} jobs")
    return {"jobs": jobs, "length": length, "drain_s": round(max(ends) - min(starts), 3),
            "ideal_s": round(jobs * length / LIMIT, 3), "refusals": round(stats.deferred_rate * stats.window),
            "most_inside": _most_at_once(events)}


def costs(jobs: int) -> dict:
    """The median time of an admission, a ``stats`` and a ``dependency_stats`` call on a store of
    ``jobs`` jobs, a tenth of them deferred for the limited dependency."""
    limit = DependencyLimit("partner_api", concurrency=LIMIT)
    with tempfile.TemporaryDirectory(prefix="flexiq-limit-costs-") as folder:
        backend = open_backend(f"sqlite:///{folder}/queue.db?synchronous=normal")
        try:
            now = time.time()
            for start in range(0, jobs, BATCH):
                backend.enqueue([NewJob(task="partner_sync", payload=[0.1]) for _ in range(min(BATCH, jobs - start))],
                                now=now)
            deferred = jobs // 10
            for start in range(0, deferred, BATCH):
                held = backend.claim(ClaimRequest("deferrer", ("default",), min(BATCH, deferred - start), 300.0),
                                     now=time.time())
                backend.settle("deferrer", [Outcome.defer(job.id, Deferral("partner_api", 3600.0)) for job in held],
                               now=time.time())
            admissions = []
            for _ in range(300):
                [job] = backend.claim(ClaimRequest("bench", ("default",), 1, 300.0), now=time.time())
                started = time.perf_counter()
                refused = backend.admit("bench", job.id, [limit], now=time.time())
                admissions.append(time.perf_counter() - started)
                assert refused is None, refused
                backend.settle("bench", [Outcome.ack(job.id)], now=time.time())
            figures = {"admission_ms": _median_ms(admissions),
                       "stats_ms": _median_ms(_timed(lambda: backend.stats("default", now=time.time()), 50)),
                       "dependency_stats_ms": _median_ms(_timed(
                           lambda: backend.dependency_stats("partner_api", now=time.time()), 20))}
            figures["waiting_counted"] = backend.dependency_stats("partner_api", now=time.time()).waiting
        finally:
            backend.close()
    return {"jobs": jobs, "deferred": deferred, **figures}


def _timed(call, times: int) -> list[float]:
    seconds = []
    for _ in range(times):
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    return seconds


def _median_ms(seconds: list[float]) -> float:
    return round(statistics.median(seconds) * 1000, 3)


def _marks(folder: Path) -> list[tuple[float, str]]:
    events = []
    for log in folder.glob("*.log"):
        for line in log.read_text().splitlines():
            what, _job, at, _pid = line.split()
            events.append((float(at), what))
    return events


def _most_at_once(events: list[tuple[float, str]]) -> int:
    running = most = 0
    for _at, what in sorted(events, key=lambda e: (e[0], e[1] != "end")):
        running += 1 if what == "start" else -1
        most = max(most, running)
    return most


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--costs-jobs", type=int, default=1_000_000)
    args = parser.parse_args()
    load_at_start = round(os.getloadavg()[0], 2)
    results = []
    for jobs, length in CASES:
        runs = [one_run(jobs, length) for _ in range(args.runs)]
        for run in runs:
            print(json.dumps(run))
        results.append({"jobs": jobs, "length": length, "runs": runs,
                        "drain_median_s": statistics.median(r["drain_s"] for r in runs),
                        "refusals_median": statistics.median(r["refusals"] for r in runs)})
    store_costs = costs(args.costs_jobs)
    print(json.dumps(store_costs))
    record = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}",
              "load_1min_at_start_and_end": [load_at_start, round(os.getloadavg()[0], 2)],
              "workers": WORKERS, "slots": SLOTS, "limit": LIMIT, "cases": results, "costs": store_costs}
    (BENCH / "results-limits.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "cases"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
