#!/usr/bin/env python3
"""A real dependency ceiling under flexiqd's workers, nobody telling flexiqd where it is.

    .venv/bin/python bench/ceiling_bench.py                      # all three kinds, 3 runs: ~35 min
    .venv/bin/python bench/ceiling_bench.py --kind connections   # one kind (its default capacity)
    .venv/bin/python bench/ceiling_bench.py --kind threads --capacity 6 --runs 5
    .venv/bin/python bench/ceiling_bench.py --quick              # connections, small crowd, 1 run: < 2 min

Root (it runs pgbouncer and PostgreSQL as ``postgres``, and caps a server's CPU with a
cgroup).  Method and the recorded run: bench/ceilings.md; every number in
bench/results-ceilings.json (a kind's entry is replaced when it is run again; --quick
writes bench/.work/ceilings-quick.json instead).

Per kind (``cpu``: a PostgreSQL server capped at ``--capacity`` CPUs; ``connections``:
pgbouncer with ``--capacity`` server connections; ``threads``: an HTTP service with
``--capacity`` threads; bench/ceilings/deps.py): the request-path prober runs all along
at ``--probe-rate``/s; first a knee sweep (fixed fleets of 1, 2, 3, 4, 6, 8, ... up to
``--max-workers``, throughput on a steady backlog; the knee is the fewest workers within
5 % of the best), then ``--runs`` runs of a flash crowd onto each policy (flexiqd,
flexiq, keda, fixed-<knee>, fixed-<max>), the order rotating from run to run.

``--policies`` may also name ``daemon``, ``daemon-probe``, ``daemon-probe-only`` (flexiqd
itself on the process fleet) and ``daemon-systemd``, ``daemon-systemd-probe`` (flexiqd.service
and its worker units under a real systemd: the sandbox of tests/system/sandbox.py, booted
once per kind; the store and the dependency also listen on unix sockets in a folder of the
checkout, which the sandbox sees).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import pathlib
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

BENCH = pathlib.Path(__file__).resolve().parent
REPO = BENCH.parent
INVOKED_FROM = pathlib.Path.cwd()  # before --code-at moves into the exported tree
sys.path[:0] = [str(BENCH), str(REPO / "tests")]


def _export_code(argv: list[str]) -> dict | None:
    """``--code-at COMMIT``: run that commit's flexiqd package, not the working tree's.

    ``git archive COMMIT flexiqd`` goes to bench/.work/code-<commit>/; the harness imports
    it first, and the workers and autoscalers get it through $FLEXIQ_CEILING_CODE (their
    PYTHONPATH and working directory).  Done before anything imports flexiqd.
    """
    if "--code-at" not in argv:
        return None
    ref = argv[argv.index("--code-at") + 1]
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                            capture_output=True, text=True, check=True).stdout.strip()
    target = BENCH / ".work" / f"code-{commit[:12]}"
    if not (target / "flexiqd" / "__init__.py").exists():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "flexiqd"], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    os.environ["FLEXIQ_CEILING_CODE"] = str(target)
    sys.path.insert(0, str(target))
    os.chdir(target)  # `python -m` puts the working directory first on a worker's path
    return {"commit": commit[:12], "path": str(target)}


CODE_AT = _export_code(sys.argv[1:])

from ceilings import (KINDS, Prober, Settings, ceiling, flash_crowd, knee_sweep,  # noqa: E402
                      sweep_counts, unavailable_reason)
from ceilings.deps import pgbouncer_version, share_folder  # noqa: E402

RESULTS = BENCH / "results-ceilings.json"
REPORT = BENCH / "ceilings.md"
QUICK_RESULTS = BENCH / ".work" / "ceilings-quick.json"
WORK = BENCH / ".work" / "ceilings"
DEFAULT_CAPACITY = {"cpu": 0.5, "connections": 8, "threads": 8}
MARK_START, MARK_END = "<!-- ceilings:start -->", "<!-- ceilings:end -->"
# The goals the product must meet, each against the fixed fleet at the knee in the same run.
GOAL_SETTLE, GOAL_P95, GOAL_DRAIN = 1.5, 2.0, 1.25


def log(message: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _r(value, digits=2):
    return None if value is None else round(value, digits)


# ---------------------------------------------------------------------------------------------
# One kind
# ---------------------------------------------------------------------------------------------

POLICIES = ("flexiqd", "flexiq", "keda", "fixed-knee", "fixed-max", "daemon", "daemon-probe", "daemon-probe-only",
            "daemon-systemd", "daemon-systemd-probe")


def policies_problem(policies: list[str], kinds: list[str]) -> str | None:
    """What is wrong with ``--policies`` for ``kinds`` (before any server starts), or None."""
    for name in policies:
        fixed = name.removeprefix("fixed-")
        if name not in POLICIES and not (name.startswith("fixed-") and fixed.isdigit() and int(fixed) > 0):
            return f"--policies: unknown policy {name!r} (one of {', '.join(POLICIES)}, fixed-<N>)"
    if "daemon-systemd-probe" in policies and "threads" in kinds:
        return ("--policies: daemon-systemd-probe cannot probe the threads kind (the daemon's http probe has no "
                "unix socket to reach it from the sandbox); use daemon-probe for it")
    return None


def _under_systemd(policies) -> bool:
    return any(name.startswith("daemon-systemd") for name in policies)


def run_kind(kind: str, capacity: float, args, settings: Settings, store_server, share) -> dict:
    started = time.monotonic()
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=WORK))
    entry: dict = {"kind": kind, "capacity": capacity}
    with contextlib.ExitStack() as stack:
        dependency = stack.enter_context(ceiling(kind, capacity, server=store_server if kind == "connections" else None,
                                                 job_ms=args.job_ms, probe_ms=args.probe_ms, share=share, log=log))
        sandbox = None
        if _under_systemd(args.policies):
            from system.sandbox import Sandbox

            sandbox = stack.enter_context(Sandbox())
            log(f"{kind}: a systemd sandbox is up (container PID 1 is pid {sandbox.leader})")
        entry["dependency"] = {"description": dependency.description, "details": dependency.details,
                               "slots": dependency.slots}
        with Prober(dependency, rate=args.probe_rate) as prober:
            time.sleep(2)
            entry["request_idle"] = prober.summary(0, time.time())
            counts = args.sweep or sweep_counts(settings.max_workers)
            log(f"{kind}: knee sweep over {counts}")
            sweep = knee_sweep(dependency, store_server, work / "sweep", counts, settings=settings, prober=prober,
                               window=args.sweep_window, log=log)
            entry["sweep"] = sweep
            knee = sweep["knee"]
            log(f"{kind}: knee = {knee} workers ({sweep['best_jobs_per_s']} jobs/s at best; "
                f"{dependency.slots} slots / concurrency {settings.concurrency} -> {sweep['expected_knee']} expected)")
            jobs = min(args.jobs, max(100, math.ceil(sweep["best_jobs_per_s"] * args.crowd_seconds)))
            entry["jobs"] = jobs
            if jobs < args.jobs:
                log(f"{kind}: crowd of {jobs} jobs ({args.crowd_seconds:g} s at the best rate), not {args.jobs}")
            policies = []
            for name in args.policies:
                if name == "fixed-knee":
                    name = f"fixed-{knee}"
                elif name == "fixed-max":
                    name = f"fixed-{settings.max_workers}"
                if name not in policies:
                    policies.append(name)
            entry["policies"] = policies
            entry["fixed_knee"] = f"fixed-{knee}"
            runs = []
            for r in range(args.runs):
                order = policies[r % len(policies):] + policies[:r % len(policies)]
                log(f"{kind}: run {r + 1}/{args.runs}: {', '.join(order)}")
                run = {}
                for policy in order:
                    run[policy] = flash_crowd(policy, dependency, store_server, work / f"run{r + 1}-{policy}", jobs,
                                              settings=settings, prober=prober, timeout=args.timeout, log=log,
                                              sandbox=sandbox, share=share)
                runs.append(run)
            entry["runs"] = runs
        entry["prober_errors"] = prober.errors[:10]
    entry["summary"], entry["goals"] = summarise(runs, policies, f"fixed-{knee}", knee)
    entry["seconds"] = round(time.monotonic() - started, 1)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return entry


def summarise(runs: list[dict], policies: list[str], reference: str, knee: int) -> tuple[dict, dict]:
    """Per policy: medians over the runs, and the ratios to the fixed-at-knee fleet of the same run."""
    summary, goals = {}, {}
    for policy in policies:
        rows = [run[policy] for run in runs]
        ratios = {"drain": [], "p95": []}
        for run in runs:
            ref, mine = run[reference], run[policy]
            if ref.get("drain_s") and mine.get("drain_s"):
                ratios["drain"].append(mine["drain_s"] / ref["drain_s"])
            if ref["request"].get("p95_ms") and mine["request"].get("p95_ms") is not None:
                ratios["p95"].append(mine["request"]["p95_ms"] / ref["request"]["p95_ms"])
        settle = median([row.get("settle_workers") for row in rows])
        summary[policy] = {
            "runs": len(rows),
            "settle_workers": settle, "max_workers": median([row.get("max_workers") for row in rows]),
            "mean_workers": _r(median([row.get("mean_workers") for row in rows])),
            "drain_s": _r(median([row.get("drain_s") for row in rows])),
            "jobs_per_s": _r(median([row.get("jobs_per_s") for row in rows])),
            "request_p50_ms": _r(median([row["request"].get("p50_ms") for row in rows])),
            "request_p95_ms": _r(median([row["request"].get("p95_ms") for row in rows])),
            "drain_ratio": _r(median(ratios["drain"]), 3), "p95_ratio": _r(median(ratios["p95"]), 3),
            "settle_ratio": _r(settle / knee, 3) if settle is not None else None,
            "duplicates": sum(row.get("duplicates", 0) for row in rows),
            "lost": sum(row.get("lost", 0) for row in rows),
            "timed_out": sum(1 for row in rows if row.get("timed_out")),
        }
        s = summary[policy]
        goals[policy] = {
            "settle": {"limit": GOAL_SETTLE * knee, "value": settle,
                       "met": settle is not None and settle <= GOAL_SETTLE * knee},
            "request_p95": {"limit_ratio": GOAL_P95, "ratio": s["p95_ratio"],
                            "met": s["p95_ratio"] is not None and s["p95_ratio"] <= GOAL_P95},
            "drain": {"limit_ratio": GOAL_DRAIN, "ratio": s["drain_ratio"],
                      "met": s["drain_ratio"] is not None and s["drain_ratio"] <= GOAL_DRAIN},
        }
    return summary, goals


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def _fmt(value, digits=1):
    if value is None:
        return "–"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.{digits}f}"
    return f"{int(value):,}" if isinstance(value, (int, float)) else str(value)


def _n(count, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _code(code: str, commit: str, dirty) -> str:
    if code.startswith("commit"):
        return f"flexiqd at commit `{commit}` (exported with git archive: the working tree's uncommitted changes left out)"
    return f"the working tree's flexiqd at commit `{commit}`" + (
        f" with uncommitted changes in {', '.join(dirty)}" if dirty else "")


def render(data: dict) -> str:
    lines = [f"Machine: {data['machine']}.", "", f"Store: {data['store']}.", "",
             f"Settings: {data['settings_text']}.", ""]
    for kind in KINDS:
        entry = data["kinds"].get(kind)
        if not entry:
            continue
        sweep = entry["sweep"]
        knee = sweep["knee"]
        lines += [f"### `{kind}`, capacity {entry['capacity']:g}", "",
                  ("**Baseline** (the policy as it was at that commit): " if entry.get("baseline") else "")
                  + f"recorded {entry.get('recorded', data['recorded'])} in {entry['seconds'] / 60:.1f} min; "
                  + _code(entry.get("code", data.get("code", "")), entry.get("commit", data["commit"]),
                          entry.get("dirty", data.get("dirty"))) + ".", "",
                  f"Dependency: {entry['dependency']['description']}. Unloaded: a job's operation "
                  f"{entry['dependency']['details'].get('job_unloaded_ms')} ms, a request "
                  f"{entry['dependency']['details'].get('probe_unloaded_ms')} ms (request path at rest: p50 "
                  f"{_fmt(entry['request_idle']['p50_ms'])} ms, p95 {_fmt(entry['request_idle']['p95_ms'])} ms).", "",
                  f"Knee sweep ({sweep['seconds']:.0f} s): **knee = {_n(knee, 'worker')}** (the fewest within 5 % "
                  f"of the best, {_fmt(sweep['best_jobs_per_s'])} jobs/s); {_n(entry['dependency']['slots'], 'slot')} / "
                  f"concurrency {data['settings']['concurrency']} → {sweep['expected_knee']} expected.", "",
                  "| workers | " + " | ".join(str(p["workers"]) for p in sweep["points"]) + " |",
                  "|---|" + "---:|" * len(sweep["points"]),
                  "| jobs/s | " + " | ".join(_fmt(p["jobs_per_s"]) for p in sweep["points"]) + " |",
                  "| request p95, ms | " + " | ".join(_fmt(p.get("request", {}).get("p95_ms")) for p in sweep["points"])
                  + " |", "",
                  f"Flash crowd of {entry['jobs']:,} jobs, {len(entry['runs'])} run(s); medians over the runs; "
                  f"ratios to `{entry['fixed_knee']}` in the same run (then the median):", "",
                  "| policy | settle workers | max workers | drain s | jobs/s | request p50 / p95 ms | "
                  "drain ÷ knee's | p95 ÷ knee's | duplicates | lost | goals a / b / c |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for policy in entry["policies"]:
            s, g = entry["summary"][policy], entry["goals"][policy]
            met = " / ".join("met" if g[key]["met"] else "**not met**" for key in ("settle", "request_p95", "drain"))
            lines.append(f"| {policy} | {_fmt(s['settle_workers'])} | {_fmt(s['max_workers'])} | {_fmt(s['drain_s'])} | "
                         f"{_fmt(s['jobs_per_s'])} | {_fmt(s['request_p50_ms'])} / {_fmt(s['request_p95_ms'])} | "
                         f"{_fmt(s['drain_ratio'], 2)}x | {_fmt(s['p95_ratio'], 2)}x | {s['duplicates']} | {s['lost']} | "
                         f"{met} |")
        lines += ["", f"Goals: (a) settle ≤ 1.5 × {knee} = {1.5 * knee:g} workers; (b) request p95 ≤ 2 × "
                  f"`{entry['fixed_knee']}`'s; (c) drain ≤ 1.25 × `{entry['fixed_knee']}`'s."]
        decisions = next((run["flexiqd"].get("decisions") for run in entry["runs"] if "flexiqd" in run), None)
        if decisions:
            lines += ["", "flexiqd's scale-ups in the first run (its own log lines):", ""]
            lines += [f"    {line}" for line in decisions[:8]]
        lines.append("")
    return "\n".join(lines)


def write_report(data: dict) -> None:
    text = REPORT.read_text() if REPORT.exists() else f"# Ceilings\n\n{MARK_START}\n{MARK_END}\n"
    head, _, rest = text.partition(MARK_START)
    _, _, tail = rest.partition(MARK_END)
    REPORT.write_text(f"{head}{MARK_START}\n{render(data)}\n{MARK_END}{tail}")


def machine() -> str:
    import psutil

    model = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{model}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.1f} GiB, "
            f"Linux {platform.release()}, Python {platform.python_version()}, pgbouncer {pgbouncer_version()}")


def git_state() -> tuple[str, list[str]]:
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "flexiqd"],
                           capture_output=True, text=True).stdout.split("\n")
    return commit, [line[3:] for line in dirty if line.strip()]


# ---------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    # A SIGTERM ends the run through its context managers, so that the servers, the workers and
    # the sandbox it started are stopped (the default would leave them running).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", action="append", choices=KINDS, help="repeatable (default: all three)")
    parser.add_argument("--capacity", type=float, help="CPUs (cpu), connections or threads; one --kind only "
                        f"(defaults: {DEFAULT_CAPACITY})")
    parser.add_argument("--jobs", type=int, default=3000, help="the flash crowd (default 3000)")
    parser.add_argument("--crowd-seconds", type=float, default=40.0,
                        help="at most this many seconds of work at the sweep's best rate (default 40)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--policies", default="flexiqd,flexiq,keda,fixed-knee,fixed-max",
                        help=f"comma-separated, of: {', '.join(POLICIES)}, fixed-<N>")
    parser.add_argument("--max-workers", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--keda-target", type=int, default=5, help="KEDA's targetValue, jobs per worker")
    parser.add_argument("--job-ms", type=float, default=50.0)
    parser.add_argument("--probe-ms", type=float, default=2.0)
    parser.add_argument("--probe-rate", type=float, default=10.0, help="request-path requests per second")
    parser.add_argument("--sweep", type=lambda s: [int(x) for x in s.split(",")], help="worker counts, e.g. 1,2,4,8")
    parser.add_argument("--sweep-window", type=float, default=4.0)
    parser.add_argument("--timeout", type=float, default=600.0, help="longest a crowd may take to drain")
    parser.add_argument("--quick", action="store_true", help="connections only, 800 jobs, 1 run, short sweep")
    parser.add_argument("--baseline", action="store_true", help="label the record as the baseline (today's policy)")
    parser.add_argument("--code-at", metavar="COMMIT",
                        help="run this commit's flexiqd (git archive), not the working tree's")
    parser.add_argument("--render", action="store_true",
                        help=f"only rewrite {REPORT.relative_to(REPO)}'s results from the JSON")
    parser.add_argument("--keep", action="store_true", help="keep bench/.work/ceilings/ (logs, marks)")
    parser.add_argument("--json", type=pathlib.Path, help=f"where to write (default {RESULTS.relative_to(REPO)})")
    args = parser.parse_args(argv)
    if args.json is not None and not args.json.is_absolute():
        args.json = INVOKED_FROM / args.json  # --code-at changed the working directory
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if args.render:
        write_report(json.loads((args.json or RESULTS).read_text()))
        return 0
    kinds = args.kind or (["connections"] if args.quick else list(KINDS))
    if args.capacity is not None and len(kinds) != 1:
        parser.error("--capacity needs exactly one --kind")
    problem = policies_problem(args.policies, kinds)
    if problem:
        parser.error(problem)
    if args.quick:
        args.jobs, args.runs = min(args.jobs, 800), 1
        args.sweep = args.sweep or [1, 2, 3, 4, 6, 30]
        args.sweep_window = 2.5
    settings = Settings(concurrency=args.concurrency, max_workers=args.max_workers, keda_target=args.keda_target)
    for kind in kinds:
        reason = unavailable_reason(kind)
        if reason:
            log(f"{kind}: cannot run here: {reason}")
            return 2
    if _under_systemd(args.policies):
        from system.sandbox import unavailable_reason as sandbox_unavailable

        reason = sandbox_unavailable()
        if reason:
            log(f"daemon-systemd: cannot boot a systemd sandbox here: {reason}")
            return 2
    out = args.json or (QUICK_RESULTS if args.quick else RESULTS)
    WORK.mkdir(parents=True, exist_ok=True)
    commit, dirty = git_state()
    if CODE_AT is not None:
        commit, dirty = CODE_AT["commit"], []
    import flexiqd

    log(f"flexiqd from {pathlib.Path(flexiqd.__file__).parent}" + (f" (commit {commit})" if CODE_AT else ""))
    data = json.loads(out.read_text()) if out.exists() else {}
    data.update({
        "recorded": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC", "commit": commit,
        "dirty": dirty, "baseline": args.baseline, "machine": machine(),
        "code": (f"commit {commit}'s flexiqd package (git archive), without the working tree's changes"
                 if CODE_AT else "the working tree's flexiqd package"),
        "store": ("flexiqd's queue on PostgreSQL 15 (tests/pg_server.py: fsync off), a fresh schema per run, "
                  "over its unix socket, never through pgbouncer and never CPU-capped; the cpu kind's dependency "
                  "is a second server, the connections kind's pgbouncer points at the store's server "
                  "(its pg_sleep costs that server nothing)"),
        "settings": {**vars(settings), "jobs": args.jobs, "crowd_seconds": args.crowd_seconds, "runs": args.runs,
                     "job_ms": args.job_ms, "probe_ms": args.probe_ms, "probe_rate": args.probe_rate,
                     "sweep_window": args.sweep_window, "quick": args.quick},
        "settings_text": (f"min 1 / max {settings.max_workers} workers of concurrency {settings.concurrency}, "
                          f"target age {settings.target_age:g} s, poll/tick {settings.poll_interval:g} s; KEDA "
                          f"targetValue {settings.keda_target} (runnable + running) jobs per worker, no "
                          f"stabilisation window; jobs of {args.job_ms:g} ms on the dependency, request path "
                          f"{args.probe_rate:g}/s of {args.probe_ms:g} ms operations through the same dependency"),
        "goals": {"settle_x_knee": GOAL_SETTLE, "request_p95_x_fixed_knee": GOAL_P95,
                  "drain_x_fixed_knee": GOAL_DRAIN},
    })
    data.setdefault("kinds", {})
    from pg_server import PostgresServer

    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        share = stack.enter_context(share_folder()) if _under_systemd(args.policies) else None
        store_server = stack.enter_context(PostgresServer(socket_dirs=(share,) if share else ()))
        for kind in kinds:
            capacity = args.capacity if args.capacity is not None else DEFAULT_CAPACITY[kind]
            log(f"{kind}: capacity {capacity:g}")
            entry = run_kind(kind, capacity, args, settings, store_server, share)
            entry["recorded"] = data["recorded"]
            entry["commit"] = commit
            entry["code"] = data["code"]
            entry["dirty"] = dirty
            entry["baseline"] = args.baseline
            data["kinds"][kind] = entry
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(data, indent=1) + "\n")
            print(render({**data, "kinds": {kind: entry}}), flush=True)
    data["seconds"] = round(time.monotonic() - began, 1)
    out.write_text(json.dumps(data, indent=1) + "\n")
    if not args.quick and args.json is None:
        write_report(data)
    log(f"done in {data['seconds'] / 60:.1f} min; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
