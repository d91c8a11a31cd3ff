#!/usr/bin/env python3
"""Rescue of a dead machine's jobs: kill -9 every process of a whole flexiqd host, time until
its running jobs are back in the queue and claimed again on another host.

    .venv/bin/python bench/hosts_bench.py [--runs 10] [--heartbeat 2]

Needs root (``unshare --uts`` gives each simulated machine its own host name), this
checkout's ``.venv`` and the PostgreSQL 15 server binaries (tests/pg_server.py starts
one).  About 2 minutes.

Two "machines" on one PostgreSQL store, each a flexiqd with the process fleet (its workers
its children) in a UTS namespace of its own, so its host name -- what its heartbeat and
its workers' lease owners carry -- differs from the other's: the rescuer runs throughout;
each run starts a fresh victim, waits until its 4 slots (2 workers x 2) run 1-second jobs
from a backlog, waits a random fraction of a job, then stops every process of the victim
at once (SIGSTOP to all, the time noted, then SIGKILL to all: nothing of it runs after the
noted time) and polls the store every 20 ms.  For each job the victim was running:

- *back*: from the kill to the rescuer's record that it handed the job back
  (the ``release`` execution "host ... stopped beating", its ``finished_at``);
- *claimed*: from the kill to the job running (or done) under another host's worker.

Every sample goes to ``bench/results-hosts.json``; the summary to ``bench/hosts.md``
between ``<!-- hosts:start -->`` and ``<!-- hosts:end -->``.  Not a test.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from flexiqd import Queue  # noqa: E402
from pg_server import PostgresServer  # noqa: E402

CONFIG = """
store: '{url}'
tick: 500ms
heartbeat: {heartbeat}s
fleet: process
pools:
  default:
    app: fleet_app:queue
    concurrency: 2
    min_workers: 2
    max_workers: 2
    drain_timeout: 5s
    environment:
      PYTHONPATH: {apps}
      FLEXIQ_TEST_MARKS: {marks}
"""


def start_host(name: str, config: Path, marks: Path, log: Path) -> subprocess.Popen:
    """A flexiqd (and the workers it starts) in a UTS namespace whose host name is ``name``."""
    env = dict(os.environ, FLEXIQ_TEST_MARKS=str(marks),
               PYTHONPATH=os.pathsep.join([str(REPO / "tests" / "apps"), str(REPO)]))
    env.pop("NOTIFY_SOCKET", None)
    return subprocess.Popen(
        ["unshare", "--uts", "sh", "-c", f'hostname "$0" && exec "$1" -m flexiqd.cli.daemon --no-api '
                                         f'--config "$2"', name, sys.executable, str(config)],
        env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT, cwd="/")


def kill_whole_host(proc: subprocess.Popen) -> float:
    """Stop every process of the host at once, note the time, then SIGKILL them all."""
    root = psutil.Process(proc.pid)
    family = [root, *root.children(recursive=True)]
    for member in family:
        try:
            member.send_signal(signal.SIGSTOP)
        except psutil.NoSuchProcess:
            pass
    killed_at = time.time()
    for member in family:
        try:
            member.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    return killed_at


def running_on(queue: Queue, host: str) -> list[int]:
    return [job.id for job in queue.backend.list_jobs(limit=100_000)
            if job.state.value == "running" and (job.lease_owner or "").startswith(host + ":")]


def one_run(queue: Queue, index: int, config: Path, marks: Path, work: Path, rng: random.Random) -> dict:
    victim = f"bench-victim-{index}"
    proc = start_host(victim, config, marks, work / f"{victim}.log")
    try:
        deadline = time.monotonic() + 60
        while len(running_on(queue, victim)) < 4:
            if time.monotonic() > deadline:
                raise SystemExit(f"{victim} did not run 4 jobs within 60 s (see {work / (victim + '.log')})")
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.0))
        cut = running_on(queue, victim)
    except BaseException:
        kill_whole_host(proc)
        raise
    killed_at = kill_whole_host(proc)
    back: dict[int, float] = {}
    claimed: dict[int, float] = {}
    deadline = time.monotonic() + 60
    while len(claimed) < len(cut):
        if time.monotonic() > deadline:
            raise SystemExit(f"run {index}: jobs {sorted(set(cut) - set(claimed))} not claimed again in 60 s")
        for job_id in cut:
            if job_id in claimed:
                continue
            job = queue.get(job_id)
            if job.state.value == "done" or (job.state.value == "running"
                                              and not (job.lease_owner or "").startswith(victim + ":")):
                claimed[job_id] = time.time() - killed_at
        time.sleep(0.02)
    for job_id in cut:
        for row in queue.backend.executions(job_id=job_id):
            if row["outcome"] == "release" and "stopped beating" in (row["error"] or ""):
                back[job_id] = row["finished_at"] - killed_at
    return {"victim": victim, "jobs": len(cut), "back": [back.get(j) for j in cut],
            "claimed": [claimed[j] for j in cut]}


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    return (f"{statistics.median(ordered):.2f} s median, {ordered[0]:.2f}–{ordered[-1]:.2f} s "
            f"(n = {len(ordered)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--heartbeat", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("hosts_bench.py needs root (unshare --uts)")
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="flexiq-hosts-bench-"))
    marks = work / "marks"
    marks.mkdir()
    marks.chmod(0o777)
    server = PostgresServer().start()
    rescuer = None
    try:
        server.admin("CREATE DATABASE flexiq_hosts_bench")
        url = (f"postgresql://postgres@/flexiq_hosts_bench?host={server.directory}&port={server.port}")
        config = work / "flexiqd.yaml"
        config.write_text(CONFIG.format(url=url, heartbeat=args.heartbeat, apps=REPO / "tests" / "apps",
                                         marks=marks))
        queue = Queue(url)
        queue.enqueue_many([_job() for _ in range(40 * args.runs + 200)])
        rescuer = start_host("bench-rescuer", config, marks, work / "bench-rescuer.log")
        runs = []
        for index in range(1, args.runs + 1):
            run = one_run(queue, index, config, marks, work, rng)
            print(f"run {index}: {run['jobs']} jobs; back after {', '.join(f'{s:.2f}' for s in run['back'] if s)} s; "
                  f"claimed again after {', '.join(f'{s:.2f}' for s in run['claimed'])} s", flush=True)
            runs.append(run)
        queue.close()
    finally:
        if rescuer is not None:
            kill_whole_host(rescuer)
        server.stop()
    back = [s for run in runs for s in run["back"] if s is not None]
    claimed = [s for run in runs for s in run["claimed"]]
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}",
        "heartbeat": args.heartbeat, "runs": runs,
        "back": summary(back), "claimed": summary(claimed),
    }
    (REPO / "bench" / "results-hosts.json").write_text(json.dumps(result, indent=1) + "\n")
    write_summary(result)
    shutil.rmtree(work, ignore_errors=True)  # kept only when a run failed: its logs say why
    print(f"back in the queue: {result['back']}; claimed again elsewhere: {result['claimed']}")


def _job():
    from flexiqd.queue.types import NewJob

    return NewJob(task="work", payload={"args": [1.0], "kwargs": {}})


def write_summary(result: dict) -> None:
    path = REPO / "bench" / "hosts.md"
    text = path.read_text() if path.exists() else "<!-- hosts:start -->\n<!-- hosts:end -->\n"
    head, rest = text.split("<!-- hosts:start -->", 1)
    _, tail = rest.split("<!-- hosts:end -->", 1)
    body = (f"\n{result['date']}, {result['machine']}; heartbeat {result['heartbeat']:g} s, "
            f"{len(result['runs'])} kills of a whole host running 4 one-second jobs.\n\n"
            f"| from the kill to | |\n|---|---|\n"
            f"| the jobs back in the queue (the rescuer's record) | {result['back']} |\n"
            f"| each job running again on the other host | {result['claimed']} |\n\n")
    path.write_text(f"{head}<!-- hosts:start -->{body}<!-- hosts:end -->{tail}")


if __name__ == "__main__":
    main()
