"""A deploy under load: ``flexiqctl restart POOL --wait`` replaces a pool's workers, under the real
systemd, without losing, repeating or cutting a job, and never below the pool's need.

The pool ``deploy`` runs tests/apps/versioned_app.py, which reads its version from a file when a
worker imports it and records which process ran each execution.  The pool is pinned at NEED
workers; a producer inside the sandbox enqueues a steady stream of jobs (0.3 s to 4 s, blocking
in C) throughout.  Version 2 is "installed" (the file changed), then ``flexiqctl restart deploy
--wait`` runs; while it runs, flexiqd itself is restarted once (``systemctl restart flexiqd``)
after the first new worker is ready, and the restart must go on.

A sampler reads systemd's view of every worker unit every ~50 ms: its state, pending job, main
pid, ``ExecMainStartTimestampMonotonic`` and the worker's own ``STATUS=`` (``claiming``,
``paused``, ``draining``).  Capacity is the units active, with no job pending, whose worker
says it claims (a paused worker says so in its STATUS= at once).  Asserted: capacity never below NEED from the request to
the end; flexiqctl exits 0 saying done; no worker started before the request is left; every
job enqueued ran exactly once and to its end (tests/system/executions.py); every execution
that started after the restart was done ran version 2, every one before the request version 1,
and old workers were still finishing jobs during the restart.

A second test installs a version that cannot be imported: the restart fails (the pool's
replacements crash-loop), flexiqctl exits 1 saying so, and the old workers keep running.
"""

from __future__ import annotations

import json

import pytest

from .executions import judge, parse
from .flexiqd_install import BIN, DAEMON, MARKS, REPO, STORE, install
from .sandbox import Sandbox

POOL = "deploy"
NEED = 3
VERSION_FILE = "/var/lib/flexiq/app-version"
DRIVER_PATH = "/root/restart_driver.py"

CONFIG = f"""
store: {STORE}
tick: 500ms
pools:
  {POOL}:
    app: versioned_app:queue
    concurrency: 2
    min_workers: 1
    max_workers: 8
    drain_timeout: 30s
    environment:
      PYTHONPATH: {REPO / "tests" / "apps"}
      FLEXIQ_TEST_MARKS: {MARKS}
      VERSIONED_APP_FILE: {VERSION_FILE}
"""

# Runs inside the sandbox as root (the checkout's venv): the producer, the sampler and the deploy;
# prints one JSON document.
DRIVER = r'''
import json, os, subprocess, sys, threading, time
from flexiqd import Queue
from flexiqd.fleet.systemd import SERVICE, Systemd, open_bus

args = json.loads(sys.argv[1])
PREFIX, SUFFIX = "flexiq-worker@", ".service"
queue = Queue(args["url"])
systemd = Systemd(open_bus())
stop_producing, stop_sampling = threading.Event(), threading.Event()
enqueued, samples = [], []
DURATIONS = [0.3, 0.8, 1.5, 0.5, 4.0, 0.3]

def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)

def produce():
    n = 0
    while not stop_producing.is_set():
        enqueued.append(queue.enqueue("work", [DURATIONS[n % len(DURATIONS)]]))
        n += 1
        time.sleep(1.0 / args["rate"])

def sample():
    units = {}
    for row in systemd.ListUnitsByPatterns([], [PREFIX + "*" + SUFFIX]):
        name, state, job, path = text(row[0]), text(row[3]), text(row[8]), row[6]
        if state == "inactive" and not job:
            continue
        try:
            pid = int(systemd.unit_property(path, SERVICE, "MainPID", b"u"))
            launched = int(systemd.unit_property(path, SERVICE, "ExecMainStartTimestampMonotonic", b"t")) / 1e6
            status = text(systemd.unit_property(path, SERVICE, "StatusText", b"s"))
        except Exception:
            continue  # gone between the calls
        units[name[len(PREFIX):-len(SUFFIX)]] = {"state": state, "job": job, "pid": pid, "launched": launched,
                                                 "status": status}
    return {"t": time.time(), "mono": time.monotonic(), "units": units}

def sampling():
    while not stop_sampling.is_set():
        samples.append(sample())
        time.sleep(0.05)

def claiming(unit):
    return unit["state"] == "active" and not unit["job"] and unit["status"].startswith("claiming")

def capacity(s):
    return sum(1 for u in s["units"].values() if claiming(u))

def wait(predicate, limit, what):
    deadline = time.time() + limit
    while time.time() < deadline:
        if samples and predicate(samples[-1]):
            return
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}: {samples[-1] if samples else None}")

producer = threading.Thread(target=produce)
sampler = threading.Thread(target=sampling)
sampler.start()
wait(lambda s: capacity(s) >= args["need"], 60, "the pool at its need")
producer.start()
time.sleep(args["warm_up"])

with open(args["version_file"], "w") as handle:
    handle.write(args["version"] + "\n")
requested, requested_mono = time.time(), time.monotonic()
deploy = subprocess.Popen([args["flexiqctl"], "restart", args["pool"], "--wait", "--timeout", args["timeout"]],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
daemon_restarted = None
if args["restart_daemon"]:
    def one_new_ready(s):
        units = s["units"].values()
        return (any(u["launched"] > requested_mono and claiming(u) for u in units)
                and any(0 < u["launched"] < requested_mono for u in units))
    wait(one_new_ready, 120, "a new worker ready beside old ones")
    subprocess.run(["systemctl", "restart", args["daemon"]], check=True)
    daemon_restarted = time.time()
out, err = deploy.communicate(timeout=600)
done = time.time()
time.sleep(args["after"])
stop_producing.set()
producer.join()
deadline = time.time() + 180
while time.time() < deadline:
    stats = queue.stats()
    if stats.runnable == 0 and stats.running == 0 and stats.delayed == 0:
        break
    time.sleep(0.2)
stop_sampling.set()
sampler.join()
print(json.dumps({"samples": samples, "enqueued": enqueued, "requested": requested, "requested_mono": requested_mono,
                  "done": done, "daemon_restarted": daemon_restarted, "rc": deploy.returncode, "out": out,
                  "err": err}))
'''


def capacity(sample: dict) -> int:
    return sum(1 for u in sample["units"].values()
               if u["state"] == "active" and not u["job"] and u["status"].startswith("claiming"))


def summary(run: dict, sbx: Sandbox) -> str:
    during = [s for s in run["samples"] if run["requested"] <= s["t"] <= run["done"]]
    executions = parse(sbx.run(f"cat {MARKS}/*.log").stdout)
    return (f"restart took {run['done'] - run['requested']:.1f}s, daemon restarted at "
            f"{(run['daemon_restarted'] or run['requested']) - run['requested']:.1f}s; {len(during)} samples during it, "
            f"capacity min {min(map(capacity, during))} max {max(map(capacity, during))}, units max "
            f"{max(len(s['units']) for s in during)}; {len(run['enqueued'])} jobs, {len(executions)} executions\n"
            f"{run['out']}")


def versions(sbx: Sandbox) -> dict[int, str]:
    """pid -> the version its worker imported (the app's ``<pid>.version`` files)."""
    out = sbx.run(f"cd {MARKS} && grep -H '' *.version 2>/dev/null || true").stdout
    found = {}
    for line in out.splitlines():
        name, _, version = line.partition(":")
        found[int(name.removesuffix(".version"))] = version.strip()
    return found


@pytest.fixture
def deploy_pool(sandbox: Sandbox) -> Sandbox:
    install(sandbox, CONFIG, before_start=f"echo 1 > {VERSION_FILE}; chmod 0644 {VERSION_FILE}")
    sandbox.write_file(DRIVER_PATH, DRIVER)
    sandbox.run([str(BIN / "flexiqctl"), "scale", POOL, str(NEED)])
    yield sandbox
    sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*'; true", timeout=180)


def drive(sbx: Sandbox, version: str, *, restart_daemon: bool, timeout: str = "300s") -> dict:
    arguments = json.dumps({"url": STORE, "pool": POOL, "need": NEED, "rate": 3.0, "warm_up": 4.0, "after": 4.0,
                            "version_file": VERSION_FILE, "version": version, "timeout": timeout,
                            "flexiqctl": str(BIN / "flexiqctl"), "restart_daemon": restart_daemon,
                            "daemon": DAEMON})
    out = sbx.run(["nice", "-n", "-10", str(BIN / "python"), DRIVER_PATH, arguments], timeout=900)
    return json.loads(out.stdout)


def test_a_restart_under_load_replaces_every_worker_never_below_the_need_and_runs_every_job_once(deploy_pool):
    sbx = deploy_pool
    run = drive(sbx, "2", restart_daemon=True)
    print(summary(run, sbx))
    assert run["rc"] == 0, (run["out"], run["err"])
    assert "restart done" in run["out"], run["out"]
    assert run["daemon_restarted"] is not None and run["requested"] < run["daemon_restarted"] < run["done"]

    # Capacity: never below the need from the request to the end, sampled all along.
    during = [s for s in run["samples"] if s["t"] >= run["requested"]]
    assert len(during) > 50
    low = [(round(s["t"] - run["requested"], 2), capacity(s), s["units"]) for s in during if capacity(s) < NEED]
    assert not low, f"capacity below {NEED}: {low[:3]}"
    # No worker started before the request is left once it is done.
    after = [s for s in run["samples"] if s["t"] >= run["done"]]
    assert after and all(u["launched"] > run["requested_mono"] for s in after for u in s["units"].values()
                         if u["state"] != "inactive"), after[0]

    # Every job once, to its end: none lost, none repeated, none cut.
    executions = parse(sbx.run(f"cat {MARKS}/*.log").stdout)
    verdict = judge(executions, killed={})
    assert verdict.duplicated_otherwise == [] and verdict.overlapping == [] and verdict.crash_duplicates == 0
    assert sorted(e.job for e in executions) == sorted(run["enqueued"]), "a job was lost or ran twice"
    assert all(e.ended is not None for e in executions), "an execution was cut"

    # Versions: 1 before the request, 2 after it was done; old workers finished jobs meanwhile.
    version_of = versions(sbx)
    assert all(version_of[e.pid] == "1" for e in executions if e.started < run["requested"])
    started_after = [e for e in executions if e.started > run["done"]]
    assert started_after and all(version_of[e.pid] == "2" for e in started_after)
    assert any(version_of[e.pid] == "1" and e.ended > run["requested"] for e in executions)
    assert any(version_of[e.pid] == "2" for e in executions if run["requested"] < e.started < run["done"])

    journal = sbx.run(["journalctl", "--no-pager", "-u", DAEMON]).stdout
    assert "going on with the restart requested before flexiqd restarted" in journal
    # A busy old worker was drained as a scale-in drains it: paused, stopped once its jobs were done.
    assert "paused to retire" in journal and "retired: its jobs are done" in journal
    status = json.loads(sbx.run([str(BIN / "flexiqctl"), "status", "--json"]).stdout)
    assert status["pools"][POOL]["restart"]["state"] == "done"


def test_a_version_that_cannot_start_fails_the_restart_and_the_old_workers_keep_running(deploy_pool):
    sbx = deploy_pool
    run = drive(sbx, "broken", restart_daemon=False)
    before = {u["pid"] for u in [s for s in run["samples"] if s["t"] < run["requested"]][-1]["units"].values()
              if u["state"] == "active"}
    assert len(before) >= NEED
    assert run["rc"] == 1, (run["out"], run["err"])
    assert "restart failed" in run["err"] and "keep failing" in run["err"], run["err"]
    # The old workers serve throughout and after: capacity held, nothing lost or repeated.
    during = [s for s in run["samples"] if s["t"] >= run["requested"]]
    assert min(capacity(s) for s in during) >= NEED
    last = run["samples"][-1]["units"]
    running = {u["pid"] for u in last.values() if u["state"] == "active"}
    assert len(running & before) >= NEED, (before, last)
    executions = parse(sbx.run(f"cat {MARKS}/*.log").stdout)
    assert sorted(e.job for e in executions) == sorted(run["enqueued"])
    status = json.loads(sbx.run([str(BIN / "flexiqctl"), "status", "--json"]).stdout)
    assert status["pools"][POOL]["restart"]["state"] == "failed"
