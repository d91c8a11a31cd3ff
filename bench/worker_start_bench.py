"""A worker's start: time to READY=1 and memory once idle, for one or more checkouts side by side.

    /usr/bin/python3 bench/worker_start_bench.py [--runs 9] [--json bench/results-worker-start.json] [CHECKOUT ...]

Each run starts ``flexiq worker`` (SQLite store, a one-task app, concurrency 4) with the
system Python, as the .deb runs it, and the checkout first on its path; it measures from
the exec to the READY=1 the worker sends on $NOTIFY_SOCKET, then, one second later, its
VmRSS and USS (private pages: what one more worker costs the machine; RSS also counts
the shared libraries' pages).  Checkouts alternate run by run (this machine is noisy):
give an older one (``git worktree add /tmp/before <commit>``) to compare.  Medians.
Not a test: numbers are recorded in bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
APP = '''
from flexiqd.queue.api import Queue
queue = Queue("sqlite:///{store}")

@queue.task()
def noop():
    pass
'''


def start_once(checkout: str, folder: pathlib.Path) -> tuple[float, float, float]:
    """(seconds to READY=1, VmRSS MiB, USS MiB) of one worker."""
    sock_path = folder / "notify.sock"
    sock_path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(sock_path))
    listener.settimeout(30)
    env = dict(os.environ, NOTIFY_SOCKET=str(sock_path), PYTHONPATH=f"{checkout}:{folder}")
    started = time.monotonic()
    worker = subprocess.Popen(
        ["/usr/bin/python3", "-m", "flexiqd.cli.flexiq", "--url", f"sqlite:///{folder / 'queue.db'}", "worker",
         "--app", "bench_app:queue", "--queues", "default", "--concurrency", "4"],
        env=env, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while b"READY=1" not in listener.recv(4096):
            pass
        ready = time.monotonic() - started
        time.sleep(1.0)
        status = pathlib.Path(f"/proc/{worker.pid}/status").read_text()
        rss = int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1]) / 1024
        uss = sum(int(line.split()[1]) for line in pathlib.Path(f"/proc/{worker.pid}/smaps_rollup").read_text()
                  .splitlines() if line.startswith(("Private_Clean", "Private_Dirty"))) / 1024
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        listener.close()
    return ready, rss, uss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--json", default=str(REPO / "bench" / "results-worker-start.json"))
    parser.add_argument("checkouts", nargs="*", default=[str(REPO)])
    args = parser.parse_args()
    folder = pathlib.Path(tempfile.mkdtemp(prefix="flexiq-worker-start-"))
    (folder / "bench_app.py").write_text(APP.format(store=folder / "queue.db"))
    runs: dict[str, list] = {checkout: [] for checkout in args.checkouts}
    for _ in range(args.runs):
        for checkout in args.checkouts:
            runs[checkout].append(start_once(checkout, folder))
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "load_at_start": os.getloadavg(), "runs": runs,
              "medians": {checkout: {"ready_s": statistics.median(r[0] for r in rs),
                                     "rss_mib": statistics.median(r[1] for r in rs),
                                     "uss_mib": statistics.median(r[2] for r in rs)} for checkout, rs in runs.items()}}
    pathlib.Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    for checkout, median in result["medians"].items():
        print(f"{checkout}: READY=1 {median['ready_s']:.3f} s, RSS {median['rss_mib']:.1f} MiB, "
              f"USS {median['uss_mib']:.1f} MiB")


if __name__ == "__main__":
    sys.exit(main())
