"""flexiqd under a real systemd (the nspawn sandbox): reaction time, idle footprint, 0 -> 50 units.

    .venv/bin/python bench/daemon_bench.py [--runs 10] [--json bench/results-daemon.json]

1. Reaction: from the enqueue of a burst (pool at 1 worker of concurrency 1, the
   default policy and tick) to the first job claimed by a worker that did not
   exist before the burst.  Median of ``--runs``.
2. Footprint at idle with 50 workers: the daemon's RSS and CPU over 30 s, and
   one idle worker's RSS.
3. Scale 0 -> 50: from `flexiqctl scale default 50` to 50 units active (each
   active = READY=1 sent by a worker that loaded its app and opened the store).
Not a test: numbers are recorded in bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from system import flexiqd_install as fi  # noqa: E402
from system.sandbox import Sandbox  # noqa: E402

BIN = REPO / ".venv" / "bin"

REACTION_CONFIG = f"""
store: {fi.STORE}
pools:
  default:
    app: flexiqd.demo:queue
    concurrency: 1
    min_workers: 1
    max_workers: 10
"""

FLEET_CONFIG = f"""
store: {fi.STORE}
pools:
  default:
    app: flexiqd.demo:queue
    concurrency: 1
    min_workers: {{minimum}}
    max_workers: 50
    scale_to_zero: true
    behavior: {{{{up_limit: {{{{workers: 50, percent: 100, period: 1s}}}}}}}}
"""

# Runs inside the container: enqueue a burst, then watch for the first claim by a new worker.
PROBE = r"""
import json, sys, time
from flexiqd.queue.url import open_backend
from flexiqd.queue.types import NewJob, JobState
backend = open_backend(sys.argv[1])
before = set(sys.argv[2].split(","))
t0 = time.time()
backend.enqueue([NewJob(task="flexiqd.demo.sleep", payload={"args": [5], "kwargs": {}})] * 30, now=t0)
deadline = t0 + 60
while time.time() < deadline:
    for job in backend.list_jobs(state=JobState.RUNNING, limit=100):
        instance = (job.lease_owner or "::").split(":")[1]
        if instance not in before:
            print(json.dumps({"reaction": job.started_at - t0, "worker": instance}))
            sys.exit(0)
    time.sleep(0.01)
print(json.dumps({"reaction": None}))
"""


def active_units(sbx: Sandbox) -> list[str]:
    return fi.workers(sbx)


def reaction(sbx: Sandbox, runs: int) -> list[float]:
    sbx.write_file("/root/probe.py", PROBE)
    values = []
    for run in range(runs):
        fi.install(sbx, REACTION_CONFIG)
        sbx.wait_for(lambda: len(active_units(sbx)) == 1, 30, what="the minimum worker")
        time.sleep(2)  # let the pool settle at 1 before the burst
        before = ",".join(u.split("@")[1].removesuffix(".service") for u in active_units(sbx))
        out = sbx.run([str(BIN / "python"), "/root/probe.py", fi.STORE, before], timeout=90).stdout
        value = json.loads(out)["reaction"]
        print(f"  reaction run {run + 1}: {value:.3f} s", flush=True)
        values.append(value)
    return values


def proc_value(sbx: Sandbox, pid: str, field: str) -> int:
    for line in sbx.run(["cat", f"/proc/{pid}/status"]).stdout.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def cpu_ticks(sbx: Sandbox, pid: str) -> int:
    fields = sbx.run(["cat", f"/proc/{pid}/stat"]).stdout.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def fleet(sbx: Sandbox) -> dict:
    fi.install(sbx, FLEET_CONFIG.format(minimum=0))
    sbx.wait_for(lambda: sbx.unit_property(fi.DAEMON, "ActiveState") == "active", 30, what="flexiqd")
    time.sleep(2)
    t0 = time.monotonic()
    sbx.run([str(BIN / "flexiqctl"), "scale", "default", "50"])
    sbx.wait_for(lambda: len(active_units(sbx)) == 50, 120, interval=0.05, what="50 active worker units")
    scale_time = time.monotonic() - t0
    print(f"  0 -> 50 units active: {scale_time:.2f} s", flush=True)
    time.sleep(10)  # settle
    pid = sbx.unit_property(fi.DAEMON, "MainPID")
    hz = int(sbx.run(["getconf", "CLK_TCK"]).stdout)
    start_ticks, start = cpu_ticks(sbx, pid), time.monotonic()
    time.sleep(30)
    cpu = (cpu_ticks(sbx, pid) - start_ticks) / hz / (time.monotonic() - start)
    worker_pid = sbx.unit_property("flexiq-worker@default-1.service", "MainPID")
    result = {"scale_0_to_50_s": scale_time, "daemon_rss_mib": proc_value(sbx, pid, "VmRSS") / 1024,
              "daemon_cpu_percent_idle_50_workers": cpu * 100,
              "worker_rss_mib_idle": proc_value(sbx, worker_pid, "VmRSS") / 1024}
    print(f"  daemon RSS {result['daemon_rss_mib']:.1f} MiB, CPU {result['daemon_cpu_percent_idle_50_workers']:.2f} % "
          f"at idle with 50 workers; idle worker RSS {result['worker_rss_mib_idle']:.1f} MiB", flush=True)
    sbx.run("systemctl stop flexiqd 'flexiq-worker@*'; true", timeout=180)
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", default=str(REPO / "bench" / "results-daemon.json"))
    args = parser.parse_args()
    with Sandbox() as sbx:
        print("Reaction time, burst -> first claim by a new worker:", flush=True)
        values = reaction(sbx, args.runs)
        print(f"  median {statistics.median(values):.3f} s (min {min(values):.3f}, max {max(values):.3f})")
        print("Fleet of 50:", flush=True)
        result = {"reaction_s": values, "reaction_median_s": statistics.median(values), **fleet(sbx)}
    pathlib.Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
