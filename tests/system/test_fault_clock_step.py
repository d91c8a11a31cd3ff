"""Fault: the wall clock steps by minutes, forward and back, on one host (issue 24, fault 5).

The step is injected with Debian's libfaketime into the real daemon and its real worker
units (and, on the SQLite host, the producer too: a step reaches every process of a host):
``LD_PRELOAD`` through systemd drop-ins, the offset read from a file the test rewrites
(``FAKETIME_TIMESTAMP_FILE``, ``FAKETIME_NO_CACHE``), and ``DONT_FAKE_MONOTONIC=1`` -- an
NTP step moves the wall clock only, never CLOCK_MONOTONIC or CLOCK_BOOTTIME.  Steps:
+5 min, then -10 min (5 min behind), then +5 min (back to the true time), each held a while,
under a steady load of jobs that record each execution on CLOCK_BOOTTIME
(tests/apps/clock_app.py), a third of them delayed by 1-15 s: longer than a step's hold, so
delayed jobs wait across every step.

What must hold, and what is measured (printed; ``pytest -s``):
- no job lost, none run twice, no two executions at once;
- no lease expires early: no attempt ends "lost" (a lease taken for expired), and the
  running jobs' leases are always ahead of the store's time (their headroom sampled);
- no delayed job starts before its delay has passed (the earliest start against its
  due time, on CLOCK_BOOTTIME);
- on PostgreSQL, two machines, one of them stepped: neither declares the other dead
  (what each daemon's ``flexiqctl status`` says, and no job handed back by a rescue), and
  the server's view of both beats stays within two heartbeats;
- the daemons never restart; no worker restarts.
"""

from __future__ import annotations

import collections
import json
import re
import threading
import time
from pathlib import Path

import pytest

from .clock_producer import DELAYED, MAX_DELAY
from .executions import judge, parse
from .flexiqd_install import BIN, DAEMON, MARKS, REPO, STORE, install, workers
from .sandbox import Sandbox
from .test_fleet_hosts_systemd import machines

FAKETIME_FILE = "/run/flexiq-faketime"
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
SHIM = REPO / "tests" / "system" / "faketime"     # sitecustomize.py: time.sleep without EINVAL
APPS = REPO / "tests" / "apps"
FAKETIME_ENV = (f"LD_PRELOAD={LIBFAKETIME} FAKETIME_TIMESTAMP_FILE={FAKETIME_FILE} FAKETIME_NO_CACHE=1 "
                f"DONT_FAKE_MONOTONIC=1")
WORKER_DROPIN = "/etc/systemd/system/flexiq-worker@.service.d/30-faketime.conf"
# (offset from the true time in seconds, how long it holds): forward 5 min, back 10, forward 5.
# A hold is twice the time a wrong clock takes to show (a lease or a beat taken for expired:
# 4 s at most; a run-at made due: the next claim), and shorter than the longest delay.
STEPS = ((300, 8.0), (-300, 8.0), (0, 6.0))
LEAD = 6.0           # load before the first step: delayed jobs waiting across it
CONCURRENCY = 4
HEARTBEAT = 2.0


def pool_config(store: str, marks: str, *, max_workers: int, extra: str = "") -> str:
    return f"""
store: '{store}'
tick: 500ms
{extra}pools:
  default:
    app: clock_app:queue
    concurrency: {CONCURRENCY}
    min_workers: 1
    max_workers: {max_workers}
    drain_timeout: 20s
    environment:
      PYTHONPATH: {APPS}:{SHIM}
      FLEXIQ_TEST_MARKS: {marks}
    targets: {{age: 2s, lead_time: 1s}}
    behavior:
      down_window: 2s
      up_limit: {{workers: {max_workers}, percent: 100, period: 1s}}
      down_limit: {{workers: {max_workers}, percent: 100, period: 1s}}
"""


def daemon_dropin() -> str:
    return f"[Service]\nEnvironment={FAKETIME_ENV} PYTHONPATH={SHIM}\n"


def stepping_setup() -> str:
    """Shell run before the daemon starts: the offset file at the true time, the workers' drop-in."""
    return (f"echo +0 > {FAKETIME_FILE} && chmod 0644 {FAKETIME_FILE} && "
            f"mkdir -p {Path(WORKER_DROPIN).parent} && "
            f"printf '[Service]\\nEnvironment={FAKETIME_ENV}\\n' > {WORKER_DROPIN} && systemctl daemon-reload")


def step_to(sbx: Sandbox, offset: int) -> float:
    """Step the host's faked wall clock to ``offset`` seconds from the true time; when, on
    CLOCK_BOOTTIME (one clock for this machine and every sandbox: they share its kernel)."""
    sbx.run(f"echo {offset:+d} > {FAKETIME_FILE}")
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def next_completions(runs, steps: list[dict]) -> list[float | None]:
    """Per step, seconds from it to the first execution that ended after it."""
    ends = sorted(run.ended for run in runs if run.ended is not None)
    return [next((round(end - step["at"], 2) for end in ends if end > step["at"]), None) for step in steps]


def faked_offset(sbx: Sandbox) -> float:
    """How far the faked wall clock is from the true one, as a faked process reads it."""
    out = sbx.run(["env", *FAKETIME_ENV.split(), "date", "+%s.%N"]).stdout.strip()
    return float(out) - time.time()


def remove_stepping(sbx: Sandbox) -> None:
    sbx.run(f"systemctl stop {DAEMON} 'flexiq-worker@*' 2>/dev/null; rm -f {WORKER_DROPIN} {FAKETIME_FILE}; "
            "systemctl daemon-reload; true", timeout=120)


def read_due(text: str) -> dict[int, tuple[float, float]]:
    """job -> (due, its first start), from the ``due`` lines of the app's marks."""
    found: dict[int, tuple[float, float]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0] == "due":
            job, due, started = int(parts[1]), float(parts[2]), float(parts[4])
            if job not in found or started < found[job][1]:
                found[job] = (due, started)
    return found


def judge_delays(delayed: dict[int, float], due_lines: dict[int, tuple[float, float]]) -> dict:
    """The delayed jobs' starts against their due times (all on CLOCK_BOOTTIME)."""
    early = sorted(job for job, (due, started) in due_lines.items() if started < due)
    margins = [started - due for due, started in due_lines.values()]
    return {"delayed_jobs": len(delayed), "delayed_started": len(due_lines),
            "started_early": early,
            "earliest_start_after_due_s": round(min(margins), 3) if margins else None,
            "latest_start_after_due_s": round(max(margins), 3) if margins else None}


def worker_restarts(sbx: Sandbox, since: float) -> int:
    text = sbx.run(["journalctl", "--no-pager", "-u", "flexiq-worker@*", "--since", f"@{since:.0f}"]).stdout
    return text.count("Scheduled restart job")


# -- one host, SQLite ---------------------------------------------------------------------------

LEASE_PROBE = """
import sys
from flexiqd.queue.url import open_backend
store = open_backend(sys.argv[1])
now = store.clock()
running = [j for j in store.list_jobs(state="running", limit=10000)]
lost = [e for e in store.executions() if e["outcome"] == "lost"]
print(min((j.lease_expires - now for j in running), default=-1.0), len(running), len(lost))
"""


class LeaseProbe(threading.Thread):
    """Samples, every half second, how far the running jobs' leases are ahead of the store's time
    (read by a process whose wall clock is stepped too); keeps the smallest headroom seen."""

    def __init__(self, sbx: Sandbox) -> None:
        super().__init__(name="lease-probe", daemon=True)
        self.sbx = sbx
        self.headroom: float | None = None
        self.samples = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.5):
            out = self.sbx.run(["env", *FAKETIME_ENV.split(), f"PYTHONPATH={SHIM}", str(BIN / "python"), "-c",
                                LEASE_PROBE, STORE], check=False, timeout=30).stdout.split()
            if len(out) == 3 and int(out[1]) > 0:
                headroom = float(out[0])
                self.headroom = headroom if self.headroom is None else min(self.headroom, headroom)
                self.samples += 1

    def stop(self) -> None:
        self._halt.set()
        self.join()


@pytest.fixture
def stepped_host(sandbox: Sandbox):
    yield sandbox
    remove_stepping(sandbox)


def _sqlite_states(sbx: Sandbox) -> dict[str, int]:
    script = ("import sqlite3, json; c = sqlite3.connect('/var/lib/flexiq/queue.db'); "
              "print(json.dumps(dict(c.execute('SELECT state, count(*) FROM jobs GROUP BY state').fetchall())))")
    return json.loads(sbx.run([str(BIN / "python"), "-c", script]).stdout)


def _sqlite_outcomes(sbx: Sandbox) -> dict[str, int]:
    script = ("import sqlite3, json; c = sqlite3.connect('/var/lib/flexiq/queue.db'); "
              "print(json.dumps(dict(c.execute('SELECT outcome, count(*) FROM executions GROUP BY 1').fetchall())))")
    return json.loads(sbx.run([str(BIN / "python"), "-c", script]).stdout)


def test_a_clock_step_on_a_sqlite_host_loses_nothing_runs_nothing_twice_fires_nothing_early(stepped_host):
    sbx = stepped_host
    began = time.time()
    install(sbx, pool_config(STORE, MARKS, max_workers=3), daemon_dropin=daemon_dropin(),
            before_start=stepping_setup())
    sbx.wait_for(lambda: workers(sbx), 30, what="the minimum worker")
    daemon_pid = sbx.unit_property(DAEMON, "MainPID")
    assert abs(faked_offset(sbx)) < 2.0
    duration = LEAD + sum(hold for _, hold in STEPS)
    produced: dict = {}
    producer = threading.Thread(target=lambda: produced.update(json.loads(sbx.run(
        ["env", *FAKETIME_ENV.split(), f"PYTHONPATH={SHIM}", str(BIN / "python"),
         str(REPO / "tests" / "system" / "clock_producer.py"), STORE, str(duration)],
        timeout=duration + 60).stdout)), daemon=True)
    probe = LeaseProbe(sbx)
    producer.start()
    probe.start()
    steps = []
    try:
        time.sleep(LEAD)
        for offset, hold in STEPS:
            at = step_to(sbx, offset)
            seen = faked_offset(sbx)
            time.sleep(hold)
            steps.append({"offset": offset, "seen_offset": round(seen, 1), "at": at})
        producer.join(duration + 90)
    finally:
        probe.stop()
    assert produced, "the producer printed nothing"
    ids, delayed = set(produced["ids"]), {int(k): v for k, v in produced["delayed"].items()}
    assert produced["errors"] == [], produced["errors"][:5]

    def all_done() -> dict | None:
        states = _sqlite_states(sbx)
        return states if states == {"done": len(ids)} else None

    try:
        states = sbx.wait_for(all_done, 120, interval=1, what=f"all {len(ids)} jobs done")
    except Exception:
        print("states:", _sqlite_states(sbx))
        raise
    marks_text = sbx.run(f"cat {MARKS}/*.log").stdout
    runs = parse(marks_text)
    verdict = judge(runs, {})
    delays = judge_delays(delayed, read_due(marks_text))
    outcomes = _sqlite_outcomes(sbx)
    report = {
        "store": "sqlite", "jobs": len(ids), "states": states, "executions": len(runs),
        "execution_outcomes": outcomes,
        "jobs_run_twice": len(verdict.duplicated_otherwise), "overlapping": len(verdict.overlapping),
        "lease_headroom_min_s": None if probe.headroom is None else round(probe.headroom, 2),
        "lease_samples": probe.samples, **delays,
        "steps": [{k: v for k, v in s.items() if k != "at"} for s in steps],
        "seconds_to_a_completion_after_each_step": next_completions(runs, steps),
        "daemon_restarts": int(sbx.unit_property(DAEMON, "NRestarts") or 0),
        "worker_restarts": worker_restarts(sbx, began),
    }
    print("clock step (sqlite):", json.dumps(report, indent=1))
    # The step reached the processes (else this test proves nothing).
    assert [round(s["seen_offset"] / 60) for s in steps] == [round(o / 60) for o, _ in STEPS]
    # Nothing lost, nothing twice, nothing at once.
    assert states == {"done": len(ids)}
    assert {run.job for run in runs if run.ended is not None} >= ids
    assert verdict.duplicated_otherwise == [] and verdict.overlapping == [], "a job ran twice"
    assert len(runs) == len(ids)
    # No lease expired early: none taken for expired, and the leases stayed ahead of the store's time.
    assert set(outcomes) == {"ack"}, outcomes
    assert probe.samples > 10 and probe.headroom is not None and probe.headroom > 0
    # No delayed job before its time, none lost.
    assert delays["started_early"] == [], delays
    assert delays["delayed_started"] == len(delayed) > 50
    # The daemon and the workers rode it out.
    assert sbx.unit_property(DAEMON, "MainPID") == daemon_pid and report["daemon_restarts"] == 0
    assert report["worker_restarts"] == 0


# -- two hosts, one PostgreSQL: one of them stepped ---------------------------------------------

_HOSTS_LINE = re.compile(r"hosts: (\d+) alive of (\d+)")


class FleetWatch(threading.Thread):
    """Samples what each machine's daemon says of the fleet (``flexiqctl status``: hosts alive of
    all), and the server's own view of each host's last beat (its age on the server's clock)."""

    def __init__(self, machines: dict[str, Sandbox], server) -> None:
        super().__init__(name="fleet-watch", daemon=True)
        self.machines, self.server = machines, server
        self.said: dict[str, collections.Counter] = {}
        self.oldest_beat: dict[str, float] = collections.defaultdict(float)
        self.unexpected: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.5):
            for name, sbx in self.machines.items():
                shown = sbx.run([str(BIN / "flexiqctl"), "status"], check=False, timeout=30)
                found = _HOSTS_LINE.search(shown.stdout)
                if shown.returncode != 0:  # the call itself failed (a bus timeout under load): said nothing
                    said = f"flexiqctl failed: {(shown.stderr.strip().splitlines() or ['?'])[-1]}"
                else:
                    said = found.group(0) if found else "no hosts line"
                    if not found:
                        self.unexpected.append(shown.stdout[-400:])
                self.said.setdefault(name, collections.Counter())[said] += 1
            for name, age in self.server.admin(
                    "SELECT name, extract(epoch FROM clock_timestamp()) - last_beat FROM flexiq_hosts",
                    database="flexiq_test"):
                self.oldest_beat[name] = max(self.oldest_beat[name], float(age))

    def stop(self) -> None:
        self._halt.set()
        self.join()


@pytest.fixture
def two_machines():
    yield from machines(2)


def _start(sbx: Sandbox, config: str, marks: Path, *, stepped: bool) -> str:
    sbx.wait_for(lambda: sbx.run(["systemctl", "is-active", "dbus"], check=False).stdout.strip() == "active",
                 30, what="the sandbox's D-Bus")
    sbx.run(["hostname", f"clock-{sbx.name.rsplit('-', 1)[-1]}"])
    sbx.write_file("/etc/systemd/system/flexiq-worker@.service.d/20-marks.conf",
                   f"[Service]\nReadWritePaths={marks}\n")
    if stepped:
        install(sbx, config, daemon_dropin=daemon_dropin(), before_start=stepping_setup())
    else:
        install(sbx, config)
    return sbx.run(["hostname"]).stdout.strip()


def test_a_host_whose_clock_steps_neither_declares_a_live_host_dead_nor_is_declared_dead(two_machines):
    server, marks, (steady, stepped) = two_machines
    server.admin("CREATE DATABASE flexiq_test")
    url = server.store_url()
    config = pool_config(url, str(marks), max_workers=2, extra=f"heartbeat: {HEARTBEAT:g}s\n")
    names = [_start(steady, config, marks, stepped=False), _start(stepped, config, marks, stepped=True)]
    from flexiqd import Queue

    queue = Queue(url)
    watch = FleetWatch(dict(zip(names, (steady, stepped))), server)
    ids: list[int] = []
    delayed: dict[int, float] = {}
    try:
        deadline = time.monotonic() + 40
        while {h.name for h in queue.backend.hosts(now=queue.clock()) if h.alive} != set(names):
            assert time.monotonic() < deadline, "both machines' heartbeats"
            time.sleep(0.2)
        watch.start()

        def load(seconds: float) -> None:
            end = time.monotonic() + seconds
            n = 0
            while time.monotonic() < end:
                ids.extend(queue.enqueue("work", [0.2], max_attempts=1000) for _ in range(4))
                for _ in range(DELAYED):  # as the producer's batch
                    delay = 1.0 + (n * 7.3) % (MAX_DELAY - 1.0)
                    due = time.clock_gettime(time.CLOCK_BOOTTIME) + delay
                    job_id = queue.enqueue("work", [0.2, due], delay=delay, max_attempts=1000)
                    ids.append(job_id)
                    delayed[job_id] = due
                    n += 1
                time.sleep(0.5)

        load(LEAD)
        steps = []
        for offset, hold in STEPS:
            at = step_to(stepped, offset)
            steps.append({"offset": offset, "seen_offset": round(faked_offset(stepped), 1), "at": at})
            load(hold)
        deadline = time.monotonic() + 120
        while not all(queue.get(job_id).state.value == "done" for job_id in ids):
            assert time.monotonic() < deadline, "every job done"
            time.sleep(1)
    finally:
        watch.stop() if watch.is_alive() else None
        remove_stepping(stepped)
        remove_stepping(steady)

    marks_text = "".join(path.read_text() for path in marks.glob("*.log"))
    runs = parse(marks_text)
    verdict = judge(runs, {})
    delays = judge_delays(delayed, read_due(marks_text))
    rescued = server.admin("SELECT count(*) FROM flexiq_executions WHERE error LIKE '%stopped beating%'",
                           database="flexiq_test")[0][0]
    outcomes = dict(server.admin("SELECT outcome, count(*) FROM flexiq_executions GROUP BY 1", database="flexiq_test"))
    ran_on = collections.Counter(path.name.split("-")[0] + "-" + path.name.split("-")[1] for path in marks.glob("*.log"))
    report = {
        "store": "postgresql, 2 machines, one stepped", "jobs": len(ids), "executions": len(runs),
        "execution_outcomes": outcomes, "jobs_run_twice": len(verdict.duplicated_otherwise),
        "overlapping": len(verdict.overlapping), "rescued_by_another_host": rescued, **delays,
        "daemons_said": {name: dict(c) for name, c in watch.said.items()},
        "oldest_beat_on_the_server_clock_s": {name: round(age, 2) for name, age in watch.oldest_beat.items()},
        "worker_log_files_per_machine": dict(ran_on), "stepped_machine": names[1],
        "steps": [{k: v for k, v in s.items() if k != "at"} for s in steps],
        "seconds_to_a_completion_after_each_step": next_completions(runs, steps),
    }
    print("clock step (postgresql):", json.dumps(report, indent=1))
    print("status without a hosts line:", watch.unexpected[:2])
    assert [round(s["seen_offset"] / 60) for s in steps] == [round(o / 60) for o, _ in STEPS]
    # Neither machine declared the other dead, nor was declared dead: every sample of each
    # daemon's status says both alive, the server saw both beat, and nothing was rescued.
    for name, said in watch.said.items():
        # A sample that failed, or whose status had no hosts line (the heartbeat thread's view not
        # read yet, under load), says nothing either way; every one that counts hosts says both.
        answered = {line for line in said if not line.startswith("flexiqctl failed") and line != "no hosts line"}
        assert answered == {"hosts: 2 alive of 2"}, (name, dict(said))
        assert said["hosts: 2 alive of 2"] >= 0.9 * sum(said.values()), (name, dict(said))
    assert set(watch.oldest_beat) == set(names)
    assert all(age <= 2 * HEARTBEAT for age in watch.oldest_beat.values()), watch.oldest_beat
    assert rescued == 0
    # Nothing lost, nothing twice, no delayed job early; both machines ran jobs.
    assert {run.job for run in runs if run.ended is not None} >= set(ids)
    assert verdict.duplicated_otherwise == [] and verdict.overlapping == [], "a job ran twice"
    assert set(outcomes) == {"ack"}, outcomes
    assert delays["started_early"] == [] and delays["delayed_started"] == len(delayed) > 50, delays
    assert all(any(path.name.startswith(name + "-") for path in marks.glob("*.log")) for name in names)
    queue.close()
