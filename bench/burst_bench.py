"""Burst -> first job on a new worker (issue 18): the .deb under systemd, and `flexiq autoscale` beside flexiq 2.1.0.

    .venv/bin/python bench/burst_bench.py [--part deb|process|both] [--runs 5] [--json FILE]

Run as root (the deb part boots a systemd container).  The process part needs flexiq
2.1.0 in bench/.work/venv (`make bench` installs it).  Method and the recorded run:
bench/burst.md; every number: bench/results-burst.json (each part replaces its own key).

1. deb: the .deb built from this checkout without its tests, installed with apt into a
   clean Debian bookworm booted under systemd (tests/system/debian_rootfs.py), one pool
   of flexiqd.demo:queue (concurrency 1, min 1, max 8, default policy and tick).  Per
   run, with the pool at its one worker: 30 jobs of a 3 s sleep are committed from a
   python3 inside; the time is from the commit to the `started_at` of the first attempt
   by a worker that did not exist before (the store's `executions` rows, worker =
   host:instance:pid).  Then the pool drains back to one worker.  Idle footprint with one
   pool and its one worker: VmRSS of the daemon and of the worker, their CPU (utime +
   stime) over 30 s, and how often the store's WAL was written meanwhile; again with
   `tick: 1m` (the wake-up without the tick), and with `tick: 1m` and `heartbeat: 60s`
   (nothing writes the store at idle: the wake-up's own cost).
2. process: no systemd; min 1 / max 8 workers of 4 slots; 400 jobs of 0.2 s each burst.
   flexiqd's `flexiq autoscale --policy flexiqd` against flexiq 2.1.0's `flexiq autoscale`
   at its default poll (5 s) and at its fastest (1 s), the three alternated run by run,
   each run on a fresh store, the burst at the same phase of flexiq's 5 s poll for all
   three (the runs' phases spread evenly over it).  Both
   apps write `start <job> <attempt> <pid> <epoch>` when a job starts
   (tests/apps/chaos_app.py, bench/apps/recovery_flexiq.py): the time is from the commit
   to the first start mark of a pid that was not a worker before the burst.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from system import flexiqd_install as fi  # noqa: E402
from system.debian_rootfs import PACKAGES_INSIDE, DebianMachine, build_deb, cached_rootfs  # noqa: E402

BIN = REPO / ".venv" / "bin"
FLEXIQ_PY = REPO / "bench" / ".work" / "venv" / "bin" / "python"
WORK = REPO / "bench" / ".work" / "burst"
RESULTS = REPO / "bench" / "results-burst.json"

# -- 1. the .deb in a systemd container --------------------------------------------------------

STORE = "sqlite:////var/lib/flexiq/queue.db"
DEB_CONFIG = f"""store: {STORE}
pools:
  default:
    app: flexiqd.demo:queue
    concurrency: 1
    min_workers: 1
    max_workers: 8
"""
DEB_BURST, DEB_JOB_S = 30, 3.0

# Inside the machine (its python3, the installed flexiqd): commit the burst, wait until every
# job has an attempt recorded, print who started what when.
PROBE = r"""
import json, sys, time
from flexiqd.queue.url import open_backend
from flexiqd.queue.types import NewJob
url, before, count, seconds = sys.argv[1], set(sys.argv[2].split(",")), int(sys.argv[3]), float(sys.argv[4])
backend = open_backend(url)
jobs = [NewJob(task="flexiqd.demo.sleep", payload={"args": [seconds], "kwargs": {}}) for _ in range(count)]
called = time.time()
ids = set(backend.enqueue(jobs, now=called))
committed = time.time()
while time.time() < committed + 300:
    rows = [r for r in backend.executions() if r["job_id"] in ids]
    if len({r["job_id"] for r in rows}) == count:
        break
    time.sleep(0.2)
new = sorted((r["started_at"], r["worker"]) for r in rows if r["worker"].rsplit(":", 1)[1] not in before)
print(json.dumps({"called": called, "committed": committed, "first_new": new[0] if new else None,
                  "first_any": min(r["started_at"] for r in rows), "drained": max(r["finished_at"] for r in rows),
                  "workers": len({r["worker"] for r in rows}), "attempts": len(rows)}))
"""

# Inside the machine: RSS now, and CPU of each pid over SECONDS of idle; and how often the
# store's WAL was written meanwhile, heard as the daemon's wake-up hears it (its FolderWatch).
IDLE = r"""
import json, os, sys, time
from flexiqd.queue.sqlite.file_watch import FolderWatch
def rss(pid):
    fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
    return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "RssAnon", "RssFile")}
def cpu(pid):  # (utime + stime in clock ticks, {thread id: its run time in ns})
    ticks = sum(map(int, open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[11:13]))
    return ticks, {int(t): int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0])
                   for t in os.listdir(f"/proc/{pid}/task")}
seconds, pids = float(sys.argv[1]), dict(arg.split("=") for arg in sys.argv[2:])
wakes = []
watch = FolderWatch("/var/lib/flexiq", ("queue.db-wal",), lambda: wakes.append(time.monotonic()))
watch.start()
before, t0 = {n: cpu(p) for n, p in pids.items()}, time.monotonic()
time.sleep(seconds)
after, spent, hz = {n: cpu(p) for n, p in pids.items()}, time.monotonic() - t0, os.sysconf("SC_CLK_TCK")
watch.stop()
threads = {n: [(after[n][1][t] - before[n][1].get(t, 0)) / 1e6 for t in sorted(after[n][1])] for n in pids}
print(json.dumps({"seconds": spent, "wal_wakeups": sum(t0 <= at for at in wakes),
                  **{n: {**{k + "_mib": v for k, v in rss(p).items()},
                         "cpu_percent": 100 * (after[n][0] - before[n][0]) / hz / spent,
                         "cpu_percent_schedstat": 100 * sum(threads[n]) / 1e3 / spent,
                         "threads_ms": threads[n]} for n, p in pids.items()}}))
"""


def live_workers(machine: DebianMachine) -> list[str]:
    return fi.workers(machine, "active,activating,deactivating,reloading")


def configure(machine: DebianMachine, config: str) -> None:
    """Stop flexiqd and its workers, write the config, start it, wait for the one worker."""
    machine.run("systemctl stop flexiqd.service 'flexiq-worker@*'; "
                "systemctl reset-failed flexiqd.service 'flexiq-worker@*' 2>/dev/null; true", timeout=120)
    machine.write_file("/etc/flexiqd/flexiqd.yaml", config)
    machine.systemctl("start", fi.DAEMON)
    machine.wait_for(lambda: fi.workers(machine) == live_workers(machine) and len(fi.workers(machine)) == 1,
                     60, interval=0.2, what="the minimum worker")


def idle_footprint(machine: DebianMachine) -> dict:
    """At idle, the pool back at its one worker."""
    machine.wait_for(lambda: len(live_workers(machine)) == 1, 300, interval=0.5, what="the pool back at 1 worker")
    time.sleep(10)
    (worker,) = fi.workers(machine)
    pids = {"daemon": machine.unit_property(fi.DAEMON, "MainPID"), "worker": machine.unit_property(worker, "MainPID")}
    out = machine.run(["python3", "-c", IDLE, "30", *(f"{n}={p}" for n, p in pids.items())], timeout=90).stdout
    return json.loads(out)


def start_chain(machine: DebianMachine, unit: str, committed: float) -> dict:
    """From the journal, seconds after the commit: the daemon's first scale-up of the pool,
    and systemd starting ``unit`` and seeing it ready (READY=1)."""
    out = machine.run(["journalctl", "--no-pager", "-o", "short-unix", "-u", fi.DAEMON, "-u", "flexiq-worker@*",
                       f"--since=@{int(committed) - 1}"]).stdout
    chain: dict = {"decision_s": None, "first_scale_up": None, "unit_started_s": None, "unit_ready_s": None}
    for line in out.splitlines():
        at, _, text = line.partition(" ")
        if not at.replace(".", "").isdigit() or float(at) < committed:
            continue
        scale = re.search(r"\bdefault (\d+) -> (\d+):", text)
        if chain["decision_s"] is None and scale and int(scale[2]) > int(scale[1]):
            chain.update(decision_s=float(at) - committed, first_scale_up=f"{scale[1]} -> {scale[2]}")
        for key, verb in (("unit_started_s", "Starting"), ("unit_ready_s", "Started")):
            if chain[key] is None and f"systemd[1]: {verb} {unit} " in text:
                chain[key] = float(at) - committed
    return chain


def deb_burst(machine: DebianMachine) -> dict:
    machine.wait_for(lambda: len(live_workers(machine)) == 1, 300, interval=0.5, what="the pool back at 1 worker")
    time.sleep(2)
    before = [machine.unit_property(unit, "MainPID") for unit in fi.workers(machine)]
    out = json.loads(machine.run(["python3", "-c", PROBE, STORE, ",".join(before), str(DEB_BURST), str(DEB_JOB_S)],
                                 timeout=400).stdout)
    run = {"reaction_s": None, "workers_used": out["workers"], "attempts": out["attempts"],
           "drain_s": out["drained"] - out["committed"], "enqueue_call_s": out["committed"] - out["called"],
           "first_job_any_worker_s": out["first_any"] - out["committed"]}
    if out["first_new"]:
        started, worker = out["first_new"]
        unit = f"flexiq-worker@{worker.split(':')[1]}.service"
        run.update(reaction_s=started - out["committed"], first_new_worker=worker,
                   **start_chain(machine, unit, out["committed"]))
    return run


def deb_part(runs: int) -> dict:
    start = context()
    out = Path(tempfile.mkdtemp(prefix="flexiq-burst-", dir="/var/tmp"))
    try:
        log("Building the .deb (no tests) ...")
        deb = build_deb(out, check=False)
        with DebianMachine(cached_rootfs(), binds=[(out, PACKAGES_INSIDE)]) as machine:
            log(f"Installing {deb.name} into a clean bookworm ({machine.name}) ...")
            machine.apt("update")
            machine.apt("install", f"{PACKAGES_INSIDE}/{deb.name}", timeout=600)
            configure(machine, DEB_CONFIG)
            idle = idle_footprint(machine)
            log(f"  idle: daemon {idle['daemon']['VmRSS_mib']:.1f} MiB, {idle['daemon']['cpu_percent']:.3f} % CPU; "
                f"worker {idle['worker']['VmRSS_mib']:.1f} MiB")
            results = []
            for n in range(runs):
                results.append(deb_burst(machine))
                run = results[-1]
                log(f"  run {n + 1}: burst -> first job on a new worker {fmt(run['reaction_s'])} s (decision "
                    f"{run.get('first_scale_up')} at "
                    f"{fmt(run.get('decision_s'))}, unit started {fmt(run.get('unit_started_s'))}, "
                    f"ready {fmt(run.get('unit_ready_s'))})")
            idle_after = idle_footprint(machine)
            configure(machine, DEB_CONFIG + "tick: 1m\n")
            idle_long_tick = idle_footprint(machine)
            # The daemon's heartbeat writes the store every 2 s, and its own watch and every
            # worker's hear each write; with a 60 s heartbeat nothing writes it at idle.
            configure(machine, DEB_CONFIG + "tick: 1m\nheartbeat: 60s\n")
            idle_quiet = idle_footprint(machine)
            for name, figures in (("tick 1m", idle_long_tick), ("tick 1m, heartbeat 60s", idle_quiet)):
                log(f"  idle, {name}: daemon {figures['daemon']['cpu_percent']:.3f} % CPU; "
                    f"the WAL written {figures['wal_wakeups']} times in 30 s")
            versions = machine.run("dpkg-query -W -f='${Package}=${Version} ' flexiqd systemd python3").stdout
    finally:
        shutil.rmtree(out, ignore_errors=True)
    reactions = [r["reaction_s"] for r in results if r["reaction_s"] is not None]
    return {**start, **ended(), "versions": dict(v.split("=", 1) for v in versions.split()),
            "config": DEB_CONFIG, "burst": {"jobs": DEB_BURST, "job_seconds": DEB_JOB_S}, "runs": results,
            "reaction_median_s": statistics.median(reactions) if reactions else None,
            "idle_one_pool": idle, "idle_after_runs": idle_after, "idle_tick_1m": idle_long_tick,
            "idle_tick_1m_heartbeat_60s": idle_quiet}


# -- 2. process fleets on this machine ---------------------------------------------------------

BURST, JOB_S, SLOTS = 400, 0.2, 4
TOOLS = ("flexiqd", "flexiq", "flexiq-poll-1s")
# flexiq 2.1.0's autoscaler starts workers as `<sys.executable> -m flexiq worker ...`, but the
# package has no __main__ (notes/flexiq-autoscaler.md): the autoscaler runs with sys.executable
# pointing at this shim, which runs the same CLI's main() with the same arguments.
SHIM = """#!/bin/sh
[ "$1" = -m ] && [ "$2" = flexiq ] && shift 2 && exec {py} -c "{main}" "$@"
exec {py} "$@"
"""
FLEXIQ_MAIN = "import sys; sys.argv[0] = 'flexiq'; from flexiq.cli import main; main()"
TAG = "FLEXIQ_BURST_BENCH"  # in every process a run starts: what is left is found by it and killed


def tool_setup(tool: str, run_dir: Path) -> tuple[list[str], list[str], dict]:
    """(autoscaler argv, enqueue argv, environment) of one tool for one run."""
    env = {**os.environ, TAG: str(run_dir)}
    if tool == "flexiqd":
        env.update(PYTHONPATH=str(REPO / "tests" / "apps"), FLEXIQ_URL=f"sqlite:///{run_dir}/queue.db",
                   FLEXIQ_TEST_MARKS=str(run_dir / "marks"))
        scaler = [str(BIN / "flexiq"), "autoscale", "--app", "chaos_app:queue", "--min-workers", "1",
                  "--max-workers", "8", "--concurrency", str(SLOTS), "--policy", "flexiqd"]
        enqueue = [str(BIN / "python"), "-c", "import time, chaos_app as app; t = time.time(); "
                   f"app.work.map([({JOB_S},)] * {BURST}); print(t, time.time())"]
        return scaler, enqueue, env
    env.update(PYTHONPATH=str(REPO / "bench" / "apps"), BENCH_DB=str(run_dir / "flexiq.db"),
               BENCH_OUT=str(run_dir / "marks"))
    shim = WORK / "flexiq-python"
    main = f"import sys; sys.executable = {str(shim)!r}; " + FLEXIQ_MAIN.removeprefix("import sys; ")
    scaler = [str(FLEXIQ_PY), "-c", main, "autoscale", "--app", "recovery_flexiq:queue", "--min-workers", "1",
              "--max-workers", "8", "--threads-per-worker", str(SLOTS)]
    if tool == "flexiq-poll-1s":
        scaler += ["--poll-interval", "1"]
    enqueue = [str(FLEXIQ_PY), "-c", "import time, recovery_flexiq as app; t = time.time(); "
               f"app.work.map([(i, {JOB_S}) for i in range({BURST})]); print(t, time.time()); app.queue.close()"]
    return scaler, enqueue, env


def start_marks(folder: Path) -> list[tuple[float, int]]:
    """(epoch, pid) of every job start recorded so far."""
    marks = []
    for path in folder.glob("*.log"):
        for line in path.read_text().splitlines():
            what, _job, _attempt, pid, at = line.split()
            if what == "start":
                marks.append((float(at), int(pid)))
    return sorted(marks)


def process_run(tool: str, run_dir: Path, phase: float) -> dict:
    (run_dir / "marks").mkdir(parents=True)
    scaler_argv, enqueue_argv, env = tool_setup(tool, run_dir)
    with open(run_dir / "autoscaler.log", "wb") as output:
        scaler = subprocess.Popen(scaler_argv, env=env, cwd=run_dir, stdin=subprocess.DEVNULL, stdout=output,
                                  stderr=subprocess.STDOUT)
    try:
        controller = psutil.Process(scaler.pid)
        deadline = time.monotonic() + 30
        while not controller.children() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(phase)  # the minimum worker is up; the burst lands at this run's phase of the poll
        workers = controller.children()
        if len(workers) != 1:
            raise RuntimeError(f"{tool}: {len(workers)} workers before the burst, not 1 (see {run_dir})")
        before = {w.pid for w in workers}
        rss = {"controller_mib": controller.memory_info().rss / 2**20,
               "idle_worker_mib": workers[0].memory_info().rss / 2**20}
        called, committed = map(float, subprocess.run(enqueue_argv, env=env, cwd=run_dir, check=True,
                                                      capture_output=True, text=True, timeout=60).stdout.split())
        new: list[tuple[float, int]] = []
        while not new and time.time() < committed + 30:
            time.sleep(0.01)
            new = [(at, pid) for at, pid in start_marks(run_dir / "marks") if pid not in before]
        time.sleep(0.3)  # a start a moment earlier in another worker's file
        new = [(at, pid) for at, pid in start_marks(run_dir / "marks") if pid not in before]
        workers_now = len(controller.children())
    finally:
        stop(scaler, str(run_dir))
    run = {"tool": tool, "phase_s": phase, "reaction_s": new[0][0] - committed if new else None,
           "enqueue_call_s": committed - called, "workers_at_end": workers_now,
           "new_workers_started_jobs": len({pid for _, pid in new}), **rss}
    if tool == "flexiqd":
        run["reaction_store_s"] = store_reaction(run_dir, before, committed)
        if new:
            run.update(flexiqd_chain(run_dir / "autoscaler.log", new[0][1], committed))
    return run


def flexiqd_chain(log_file: Path, pid: int, committed: float) -> dict:
    """From flexiqd's autoscaler log (ms timestamps), seconds after the commit: its first scale-up,
    and worker ``pid`` ready (app loaded, store open)."""
    chain: dict = {"decision_s": None, "first_scale_up": None, "worker_ready_s": None}
    for line in log_file.read_text().splitlines():
        try:
            at = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp() - committed
        except ValueError:
            continue
        scale = re.search(r"\bautoscale (\d+) -> (\d+):", line)
        if at > -0.001 and chain["decision_s"] is None and scale and int(scale[2]) > int(scale[1]):
            chain.update(decision_s=at, first_scale_up=f"{scale[1]} -> {scale[2]}")
        if at > -0.001 and chain["worker_ready_s"] is None and f":{pid} ready:" in line:
            chain["worker_ready_s"] = at
    return chain


def store_reaction(run_dir: Path, before: set[int], committed: float) -> float | None:
    """flexiqd's own record: the first attempt by a new worker in the store's executions."""
    from flexiqd.queue.url import open_backend

    backend = open_backend(f"sqlite:///{run_dir}/queue.db")
    try:
        starts = [r["started_at"] for r in backend.executions() if int(r["worker"].rsplit(":", 1)[1]) not in before]
    finally:
        backend.close()
    return min(starts) - committed if starts else None


def stop(scaler: subprocess.Popen, tag: str) -> None:
    """SIGTERM the autoscaler (it drains its workers); then SIGKILL, by pid, whatever of the run is left."""
    scaler.send_signal(signal.SIGTERM)
    try:
        scaler.wait(timeout=20)
    except subprocess.TimeoutExpired:
        scaler.kill()
        scaler.wait()
    # Workers outliving the autoscaler are re-parented to this process (a subreaper).
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.environ().get(TAG) == tag:
                proc.kill()
                proc.wait(timeout=10)
        except psutil.Error:
            pass


def process_part(runs: int) -> dict:
    if not FLEXIQ_PY.exists():
        raise SystemExit(f"{FLEXIQ_PY} is missing: `make bench` installs flexiq 2.1.0 there")
    start = context()
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    shim = WORK / "flexiq-python"
    shim.write_text(SHIM.format(py=FLEXIQ_PY, main=FLEXIQ_MAIN))
    shim.chmod(0o755)
    # The burst 3 s after the minimum worker started, plus a phase spread evenly over flexiq's
    # 5 s poll (shuffled): where a poll-driven autoscaler's next tick falls is sampled fairly.
    phases = [3 + 5 * (n + 0.5) / runs for n in range(runs)]
    random.Random(18).shuffle(phases)
    results = []
    for n in range(runs):
        order = TOOLS[n % len(TOOLS):] + TOOLS[:n % len(TOOLS)]
        for tool in order:
            results.append(process_run(tool, WORK / f"run{n + 1}-{tool}", phases[n]))
            run = results[-1]
            chain = (f" (store {fmt(run.get('reaction_store_s'))} s; decision {run.get('first_scale_up')} at "
                     f"{fmt(run.get('decision_s'))}, worker ready {fmt(run.get('worker_ready_s'))})")
            log(f"  run {n + 1} {tool:>15}: {fmt(run['reaction_s'])} s" + (chain if tool == "flexiqd" else ""))
    medians = {tool: statistics.median(r["reaction_s"] for r in results if r["tool"] == tool and r["reaction_s"])
               for tool in TOOLS}
    burst = {"jobs": BURST, "job_seconds": JOB_S, "slots_per_worker": SLOTS, "min_workers": 1, "max_workers": 8}
    return {**start, **ended(), "burst": burst, "runs": results, "reaction_median_s": medians,
            "ratio_flexiqd_to_flexiq": medians["flexiqd"] / medians["flexiq"],
            "ratio_flexiqd_to_flexiq_poll_1s": medians["flexiqd"] / medians["flexiq-poll-1s"],
            "rss_median_mib": {tool: {k: statistics.median(r[k] for r in results if r["tool"] == tool)
                                      for k in ("controller_mib", "idle_worker_mib")} for tool in TOOLS}}


# -- both --------------------------------------------------------------------------------------

def sandboxes() -> int:
    """systemd-nspawn processes running (another helper's sandbox, or ours while it runs)."""
    return int(subprocess.run(["pgrep", "-c", "systemd-nspawn"], capture_output=True, text=True).stdout or 0)


def ended() -> dict:
    return {"load_at_end": os.getloadavg(), "nspawn_processes_at_end": sandboxes(),
            "ended": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def context() -> dict:
    commit = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--short", "--", "flexiqd", "units", "debian"],
                           capture_output=True, text=True).stdout.split("\n")
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "load_at_start": os.getloadavg(), "nspawn_processes_at_start": sandboxes(),
            "machine": f"{os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}",
            "flexiqd_commit": commit, "flexiqd_uncommitted": [line for line in dirty if line]}


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def log(text: str) -> None:
    print(text, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("deb", "process", "both"), default="both")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    results = json.loads(args.json.read_text()) if args.json.exists() else {}
    if args.part in ("deb", "both"):
        log("1. The .deb under systemd")
        results["deb"] = deb_part(args.runs)
        log(f"  median {fmt(results['deb']['reaction_median_s'])} s")
    if args.part in ("process", "both"):
        log("2. Process fleets: flexiqd's flexiq autoscale against flexiq 2.1.0's")
        results["process"] = process_part(args.runs)
        part = results["process"]
        log("  medians: " + ", ".join(f"{t} {fmt(v)} s" for t, v in part["reaction_median_s"].items())
            + f"; flexiqd/flexiq {part['ratio_flexiqd_to_flexiq']:.2f}, "
            f"flexiqd/flexiq at 1 s {part['ratio_flexiqd_to_flexiq_poll_1s']:.2f}")
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
