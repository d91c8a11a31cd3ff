"""``dependencies.<d>.start_burst`` on the real daemon: 0 -> 40 workers of a PostgreSQL pool.

The pool ``burst`` uses the dependency ``db`` (``start_burst: 8``) and scales from 0 to
its ``max_workers`` of 40 at once: either its policy asks for 40 (400 delayed 10 s jobs
come due, and the "due" signal sizes the pool for all of them in one decision) or an operator
pins it (``flexiqctl scale burst 40``).  While it grows, a sampler inside the sandbox
reads, every ~20 ms, systemd's view (the worker units' ActiveState and queued job, one
``ListUnitsByPatterns`` call) and the PostgreSQL server's own view (``pg_stat_activity``:
each client backend with its ``backend_start`` and ``client_port``).  Each backend is
tied to the worker process that holds the other end of its TCP connection (the socket
inode in ``/proc/<MainPID>/fd`` against ``/proc/net/tcp``), so the server's rows say
which worker opened them.

What "at once" means here:

- **starting** (systemd's view): worker units that are ``activating``, or ``inactive``
  with a start job queued -- started, not yet ``READY=1``; the daemon counts the same
  units as its pool's ``starting`` workers.  Counted at each sample, and exactly: the
  most units whose [``InactiveExitTimestamp``, ``ActiveEnterTimestamp``) overlap.
- **connecting** (the server's view): a worker is connecting from the ``backend_start``
  of its first backend -- the server's clock: the moment the server forked the backend
  for its first connection -- until systemd's ``ActiveEnterTimestamp`` of its unit
  (``READY=1``: it has opened the store and is about to claim).  A worker opens its store
  connection before ``READY=1`` (``worker.main``), so every worker has such an interval.
  The peak is the most of these intervals that overlap, computed exactly from the two
  timestamps, not from the samples.  The sampled form is counted too: at each sample, the
  workers whose unit is starting and that already have a backend on the server.

The promise (man flexiqd.yaml(5): "at most this many workers of its users start (and
connect) at once"): no more than ``start_burst`` workers starting, no more than
``start_burst`` connecting, and all 40 become active (the limit staggers, it does not
stall).  Timings belong to bench/start_burst_bench.py, which runs the same scale-up with
and without a binding burst; none are asserted here.

A connecting worker is a starting one, so the server's count can only exceed the burst
when systemd's does.  Without staggering systemd's count fails at once (36-40 of 40
starting); the server's may not: on two cores 40 interpreters importing at once reach
their first connection one after another, and the connection takes milliseconds, so
6-10 of them overlapped in the bench (bench/README.md, start bursts).

Both ways a pool grows are checked: the policy's scale-up and an operator's pin
(``daemon/overrides.staggered_start``), each staggered by the start allowance.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import pytest

from .flexiqd_install import BIN, DAEMON, install
from .sandbox import Sandbox
from .sandbox_postgres import psql
from .test_postgres_systemd import CLI_URL, DATABASE, PASSWORD, SECRET, STORE_URL

POOL = "burst"
TARGET = 40
START_BURST = 8
PROBE_ROLE, PROBE_PASSWORD = "flexiq_probe", "probe-s3cret"
PROBE_DSN = f"host=127.0.0.1 port=5432 dbname=postgres user={PROBE_ROLE} password={PROBE_PASSWORD}"
SAMPLER_PATH = "/root/start_burst_sampler.py"
SAMPLER_READY = "/run/start-burst-sampler.ready"
# Long enough that the backlog outlasts the scale-up: the policy wants 40 until all are up.
DUE_JOBS, DUE_DELAY, DUE_JOB_SECONDS = 400, "4s", 10


def config(start_burst: int | None) -> str:
    """The pool ``burst`` of 0..40 workers using ``db``; ``start_burst`` None: not declared
    (the default of 8 then applies), else that many."""
    burst = "" if start_burst is None else f", start_burst: {start_burst}"
    return f"""
store: '{STORE_URL}'
tick: 500ms
dependencies:
  db: {{capacity: 100{burst}}}
pools:
  {POOL}:
    app: flexiqd.demo:queue
    concurrency: 1
    min_workers: 0
    max_workers: {TARGET}
    scale_to_zero: true
    drain_timeout: 3s
    uses: {{db: {{per_worker: 2}}}}
    credentials: {{flexiq-db: {SECRET}}}
    targets: {{age: 10s}}
    behavior: {{up_limit: {{workers: {TARGET}, percent: 100, period: 1s}}}}
"""


# Runs inside the sandbox (the checkout's venv), as root: samples until ``target`` units are
# active and none is starting for ``settle`` s, or ``limit`` s passed; prints one JSON document.
SAMPLER = r'''
import json, os, sys, time
import psycopg
from flexiqd.fleet.systemd import SERVICE, UNIT, Systemd, open_bus, unit_path

args = json.loads(sys.argv[1])
systemd = Systemd(open_bus())
conn = psycopg.connect(args["dsn"], autocommit=True)
QUERY = ("SELECT pid, usename, client_port, extract(epoch FROM backend_start)::float8 "
         "FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")
PREFIX, SUFFIX = "flexiq-worker@", ".service"
# ActiveState (and a queued job) -> one letter: a active, s activating, p inactive with a start
# job queued, d deactivating, f failed, i inactive.
def code(active, job):
    if job == "start" and active == "inactive":
        return "p"
    return {"active": "a", "reloading": "a", "activating": "s", "deactivating": "d", "failed": "f"}.get(active, "i")

def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)

paths, pids, owners, backends, samples = {}, {}, {}, {}, []

def main_pid(path):
    try:
        return int(systemd.unit_property(path, SERVICE, "MainPID", b"u")) or None
    except Exception:
        return None

def map_ports():
    """client port -> owner, for the worker units' and the daemon's main processes."""
    for name, path in paths.items():
        if not pids.get(name):
            pids[name] = main_pid(path)
    inodes = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            next(rows)
            for row in rows:
                fields = row.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == 5432:
                    inodes[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    for name, pid in pids.items():
        if not pid:
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                owners[inodes[link[8:-1]]] = name

paths["flexiqd"] = unit_path("flexiqd.service")
open(args["ready"], "w").close()
began = time.time()
settled_since = None
while True:
    at = time.time()
    units = {}
    for row in systemd.ListUnitsByPatterns([], [PREFIX + "*" + SUFFIX]):
        name = text(row[0])[len(PREFIX):-len(SUFFIX)]
        paths.setdefault(name, row[6])
        state = code(text(row[3]), text(row[8]))
        if state != "i":
            units[name] = state
        if state == "i" and name in pids:
            pids[name] = None  # a stopped unit's next run has another pid
    rows = conn.execute(QUERY).fetchall()
    pg_at = time.time()
    if any(port is not None and port not in owners for _, _, port, _ in rows):
        map_ports()
    for pid, user, port, start in rows:
        if pid not in backends or backends[pid]["owner"] is None:
            backends[pid] = {"user": user, "port": port, "start": start, "owner": owners.get(port)}
    samples.append({"t": at, "pg_t": pg_at, "units": units, "backends": [row[0] for row in rows]})
    active = sum(1 for s in units.values() if s == "a")
    settled = active >= args["target"] and not any(s in "sp" for s in units.values())
    settled_since = (settled_since or pg_at) if settled else None
    if settled_since is not None and pg_at - settled_since >= args["settle"]:
        break
    if pg_at - began > args["limit"]:
        break
    time.sleep(max(0.0, args["interval"] - (time.time() - at)))

timestamps = {}
for name, path in paths.items():
    if name == "flexiqd":
        continue
    try:
        exit_us = int(systemd.unit_property(path, UNIT, "InactiveExitTimestamp", b"t"))
        ready_us = int(systemd.unit_property(path, UNIT, "ActiveEnterTimestamp", b"t"))
    except Exception:
        continue
    timestamps[name] = {"exit": exit_us / 1e6 or None, "ready": ready_us / 1e6 or None}
print(json.dumps({"samples": samples, "backends": backends, "units": timestamps}))
'''


@dataclasses.dataclass
class ScaleUp:
    """What one scale-up showed (``analyse``); times are the sandbox's clock (epoch seconds)."""

    samples: int
    sample_gap_median: float          # seconds between samples
    sample_gap_max: float
    peak_starting: int                # units starting at one sample (activating or start queued)
    peak_starting_exact: int          # units between InactiveExitTimestamp and ActiveEnterTimestamp
    peak_connecting: int              # workers between their first backend and READY=1 (exact)
    peak_connecting_sampled: int      # starting units with a backend, at one sample
    peak_starting_connections: int    # backends of starting workers, at one sample
    peak_new_connections_1s: int      # worker backends opened within any one second
    peak_new_connections_250ms: int   # ... within any 250 ms
    peak_connections: int             # client backends on the server, at one sample
    workers_with_backends: int        # workers whose backends the sampler tied to them
    active_at_end: int
    first_start: float | None         # the earliest InactiveExitTimestamp of a worker
    all_ready: float | None           # the ActiveEnterTimestamp of the last worker to be ready
    ready_times: list                 # every worker's ActiveEnterTimestamp, in order
    timeline: list                    # per sample: [s since the first start, starting, active, backends]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most half-open intervals [start, end) that hold at one moment."""
    events = sorted([(start, 1) for start, end in intervals if end > start]
                    + [(end, -1) for start, end in intervals if end > start])
    peak = current = 0
    for _, step in events:  # an end sorts before a start at the same moment: [a, b) and [b, c) do not overlap
        current += step
        peak = max(peak, current)
    return peak


def peak_in_window(times: list[float], window: float) -> int:
    times, peak, first = sorted(times), 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= window:
            first += 1
        peak = max(peak, last - first + 1)
    return peak


def analyse(document: dict) -> ScaleUp:
    samples, units = document["samples"], document["units"]
    backends = {int(pid): info for pid, info in document["backends"].items()}
    mine = {pid: info for pid, info in backends.items() if info["owner"] not in (None, "flexiqd")}
    first_backend: dict[str, float] = {}
    for info in mine.values():
        owner = info["owner"]
        first_backend[owner] = min(first_backend.get(owner, info["start"]), info["start"])
    intervals = [(start, units[owner]["ready"]) for owner, start in first_backend.items()
                 if owner in units and units[owner]["ready"]]
    peak_starting = peak_sampled = peak_conns = peak_total = 0
    for sample in samples:
        starting = {name for name, state in sample["units"].items() if state in "sp"}
        owners = [mine[pid]["owner"] for pid in sample["backends"] if pid in mine]
        peak_starting = max(peak_starting, len(starting))
        peak_sampled = max(peak_sampled, len(starting & set(owners)))
        peak_conns = max(peak_conns, sum(1 for owner in owners if owner in starting))
        peak_total = max(peak_total, len(sample["backends"]))
    gaps = sorted(b["t"] - a["t"] for a, b in zip(samples, samples[1:])) or [0.0]
    exits = [u["exit"] for u in units.values() if u["exit"]]
    readies = [u["ready"] for u in units.values() if u["ready"]]
    origin = min(exits) if exits else samples[0]["t"]
    return ScaleUp(
        samples=len(samples), sample_gap_median=gaps[len(gaps) // 2], sample_gap_max=gaps[-1],
        peak_starting=peak_starting, peak_connecting=peak_overlap(intervals),
        peak_starting_exact=peak_overlap([(u["exit"], u["ready"]) for u in units.values()
                                          if u["exit"] and u["ready"]]),
        peak_connecting_sampled=peak_sampled, peak_starting_connections=peak_conns,
        peak_new_connections_1s=peak_in_window([info["start"] for info in mine.values()], 1.0),
        peak_new_connections_250ms=peak_in_window([info["start"] for info in mine.values()], 0.25),
        peak_connections=peak_total, workers_with_backends=len(first_backend),
        active_at_end=sum(1 for state in samples[-1]["units"].values() if state == "a"),
        first_start=min(exits) if exits else None, all_ready=max(readies) if readies else None,
        ready_times=sorted(readies),
        timeline=[[round(s["t"] - origin, 3), sum(1 for v in s["units"].values() if v in "sp"),
                   sum(1 for v in s["units"].values() if v == "a"), len(s["backends"])] for s in samples])


def stop_flexiqd(sbx: Sandbox) -> None:
    sbx.run(f"systemctl stop {DAEMON} 'flexiq-worker@*' 2>/dev/null; true", timeout=120)


def prepare(sbx: Sandbox, start_burst: int | None) -> None:
    """The sandbox's PostgreSQL with a fresh database (owned by a role that logs in with a
    password, as in test_postgres_systemd) and the sampler's role; flexiqd installed afresh
    with the pool ``burst``; returns once the daemon has seen the pool empty."""
    started = sbx.run("systemctl start postgresql@15-main", check=False)
    if started.returncode != 0:
        pytest.fail(f"the sandbox's PostgreSQL did not start: {started.stderr}", pytrace=False)
    sbx.wait_for(lambda: sbx.run("pg_isready -q -h 127.0.0.1 -p 5432", check=False).returncode == 0,
                 60, what="PostgreSQL in the sandbox to accept connections")
    stop_flexiqd(sbx)
    psql(sbx, f"DROP DATABASE IF EXISTS {DATABASE}")
    for role in ("flexiq", PROBE_ROLE):
        psql(sbx, f"DROP ROLE IF EXISTS {role}")
    psql(sbx, f"CREATE ROLE flexiq LOGIN PASSWORD '{PASSWORD}'")
    psql(sbx, f"CREATE DATABASE {DATABASE} OWNER flexiq")
    psql(sbx, f"CREATE ROLE {PROBE_ROLE} LOGIN PASSWORD '{PROBE_PASSWORD}' IN ROLE pg_monitor")
    sbx.write_file(SECRET, PASSWORD + "\n", mode=0o600)
    install(sbx, config(start_burst), daemon_dropin=f"[Service]\nLoadCredential=flexiq-db:{SECRET}\n")
    sbx.write_file(SAMPLER_PATH, SAMPLER)
    sbx.wait_for(lambda: pool_workers(sbx) == {"active": 0, "starting": 0}, 30,
                 what="the daemon's first view of the empty pool")


def pool_workers(sbx: Sandbox) -> dict | None:
    """The pool's active and starting workers as the daemon last saw them (None: not yet, or
    the daemon is not on the bus yet)."""
    status = sbx.run([str(BIN / "flexiqctl"), "status", "--json"], check=False)
    if status.returncode != 0:
        return None
    pools = json.loads(status.stdout).get("pools") or {}
    pool = pools.get(POOL) if isinstance(pools, dict) else next((p for p in pools if p.get("name") == POOL), None)
    workers = (pool or {}).get("workers") or {}
    return {key: workers[key] for key in ("active", "starting") if key in workers} or None


def ctl(sbx: Sandbox, *args: str):
    return sbx.run([str(BIN / "flexiqctl"), *args])


def trigger(sbx: Sandbox, how: str) -> None:
    """Ask for 40 workers: by the policy (delayed jobs coming due) or by an operator's pin."""
    if how == "pin":
        ctl(sbx, "scale", POOL, str(TARGET))
    else:
        sbx.run([str(BIN / "flexiq"), "--url", CLI_URL, "enqueue", "flexiqd.demo.sleep", str(DUE_JOB_SECONDS),
                 "--count", str(DUE_JOBS), "--delay", DUE_DELAY])


def scale_up(sbx: Sandbox, how: str, *, limit: float = 45.0) -> tuple[ScaleUp, dict]:
    """Sample while the pool goes 0 -> 40; the analysis, and the raw document with the
    daemon's scale events (``events``) and when the scale-up was asked for (``asked``)."""
    sbx.run(f"rm -f {SAMPLER_READY}")
    out: list = []
    arguments = json.dumps({"dsn": PROBE_DSN, "target": TARGET, "settle": 0.5, "limit": limit,
                            "interval": 0.02, "ready": SAMPLER_READY})

    def sample() -> None:
        try:
            # Niced up: on two busy cores it must keep sampling while 40 interpreters start.
            out.append(sbx.run(["nice", "-n", "-10", str(BIN / "python"), SAMPLER_PATH, arguments],
                               timeout=limit + 30))
        except BaseException as exc:  # re-raised in the test's thread
            out.append(exc)

    sampler = threading.Thread(target=sample, name="start-burst-sampler")
    sampler.start()
    try:
        sbx.wait_for(lambda: out or sbx.run(f"test -e {SAMPLER_READY}", check=False).returncode == 0,
                     20, what="the sampler to connect")
        asked = time.time()
        trigger(sbx, how)
    finally:
        sampler.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    document = json.loads(out[0].stdout)
    document["asked"] = asked
    document["events"] = [json.loads(line) for line in ctl(sbx, "events", "--json").stdout.splitlines()
                          if line.strip()]
    return analyse(document), document


@pytest.fixture
def sbx(sandbox: Sandbox) -> Sandbox:
    yield sandbox
    stop_flexiqd(sandbox)


@pytest.mark.parametrize("how", ["policy", "pin"])
def test_no_more_than_start_burst_workers_start_or_connect_at_once(sbx, how):
    prepare(sbx, START_BURST)
    result, document = scale_up(sbx, how)
    ups = [e for e in document["events"] if e["pool"] == POOL and e["desired"] > e["previous"]]
    figures = {k: v for k, v in result.as_dict().items() if k not in ("timeline", "ready_times")}
    detail = (f"{how}: {json.dumps(figures)}; "
              f"scale events: {[(e['previous'], e['desired'], e['reason']) for e in ups]}")
    # The measurement saw what it needs: every worker's backends, fast enough samples.
    assert result.active_at_end == TARGET, f"not all {TARGET} workers became active: {detail}"
    assert result.workers_with_backends == TARGET, f"backends not tied to every worker: {detail}"
    assert result.samples > 50, detail
    # The promise.
    assert result.peak_starting <= START_BURST, detail
    assert result.peak_starting_exact <= START_BURST, detail
    assert result.peak_connecting <= START_BURST, detail
    assert result.peak_connecting_sampled <= START_BURST, detail
    # Staggered, not serialised: the burst was used, in steps of the cap.
    assert max(e["desired"] - e["previous"] for e in ups) <= START_BURST, detail
    assert result.peak_starting >= 2, detail
