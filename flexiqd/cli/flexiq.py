"""``flexiq``: the queue tool (enqueue, stats, jobs, dead letters) and the worker's entry point."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any, Sequence

from ..durations import format_duration
from ..errors import FlexiqdError, StoreUnavailable
from . import store_ops
from .argtypes import duration, whole_number
from ..logs import setup_logging
from ..queue.declarations import DECLARED_OPTIONS, by_name, undeclared
from ..queue.types import Job, JobState, Stats
from ..config.model import DEFAULT_CONFIG_PATH
from ..queue.url import DEFAULT_URL, URL_ENV, default_url, open_backend
from .store_choice import CONFIG_ENV, opening_hint, store_for_command
from ..settings_schema import AUTOSCALE_FIELDS, autoscale_default, listen_default, setting, show_default

EXIT_OK = 0
EXIT_ERROR = 1  # a user or store error, explained in one line
EXIT_USAGE = 2  # bad command-line arguments (argparse's own code)
EXIT_DAMAGED = 3  # flexiq check: the store is damaged (what and where on stdout)


_duration = duration()
_positive_int = whole_number(1)


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not JSON ({exc}); quote text as a JSON string, as in '\"{text}\"'") from None


def _about(key: str, note: str = "", *, prefix: str = "", default: str | None = None) -> str:
    """An option's help: the sentence of its setting (``flexiqd.settings_schema``), ``note``, and
    what it is when not given -- the setting's default unless ``default`` says otherwise."""
    text = setting(key).doc.rstrip(".")
    unset = show_default(key)
    if text.endswith(")") and "(none: " in text:  # "... (none: as many as free slots)"
        text, _, unset = text[:-1].rpartition(" (none: ")
    text = prefix + text[:1].lower() + text[1:]
    shown = unset if default is None else default.format(unset)
    if note:
        text = f"{text}; {note}"
    text = f"{text[:-1]}; default: {shown})" if text.endswith(")") else f"{text} (default: {shown})"
    return text.replace("%", "%%")


def _for_worker(key: str, note: str = "") -> str:
    """A ``flexiq worker`` option's help: without it, the pool's value or the setting's default."""
    return _about(key, note, default="the pool's in the config file, else {}")


def _autoscaling(option: str, note: str = "", prefix: str = "") -> dict[str, Any]:
    """A ``flexiq autoscale`` option's default and help, from the setting it is."""
    return {"default": autoscale_default(option), "help": _about(AUTOSCALE_FIELDS[option], note, prefix=prefix)}


def _queues(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise argparse.ArgumentTypeError("give at least one queue name")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flexiq", description=__doc__)
    parser.add_argument("--url", default=None,
                        help=f"the job store (default: ${URL_ENV}; else, for enqueue, stats, jobs and "
                             f"dead-letter, the store: of the daemon's config file (${CONFIG_ENV}, else "
                             f"{DEFAULT_CONFIG_PATH}) where it is readable; else {DEFAULT_URL})")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    enqueue = commands.add_parser("enqueue", help="add jobs (options not given: the task's declaration)")
    enqueue.add_argument("task", help="the task's registered name, e.g. flexiqd.demo.sleep")
    enqueue.add_argument("args", nargs="*", type=_json_value, help="positional arguments, each JSON")
    enqueue.add_argument("--kwargs", type=_json_value, default=None, help="keyword arguments as a JSON object")
    declared = "{} (default: the task's declaration, else {})"
    enqueue.add_argument("--queue", default=None, help=declared.format("the job's queue", "default"))
    enqueue.add_argument("--priority", type=int, default=None, help=declared.format("higher runs first", "0"))
    enqueue.add_argument("--delay", type=_duration, default=0.0, help="e.g. 30s, 5m")
    enqueue.add_argument("--max-attempts", type=_positive_int, default=None,
                         help=declared.format("attempts before it is dead-lettered", "3"))
    enqueue.add_argument("--timeout", type=_duration, default=None,
                         help=declared.format("the longest one attempt may run, e.g. 5m", "none"))
    enqueue.add_argument("--key", default=None, help="idempotency key")
    enqueue.add_argument("--tenant", default=None)
    enqueue.add_argument("--count", type=_positive_int, default=1, help="enqueue this many copies")

    stats = commands.add_parser("stats", help="queue signals: depth, age, rates, durations")
    stats.add_argument("--queue", action="append", help="only this queue (repeatable)")
    stats.add_argument("--window", type=_duration, default=60.0)
    stats.add_argument("--json", action="store_true")

    dependencies = commands.add_parser(
        "dependencies", help="each limited dependency's use against its limit (dependencies.<name>.limit)")
    dependencies.add_argument("--config", default=None,
                              help="the daemon's config file, for the limits (default: $FLEXIQD_CONFIG, "
                                   "else /etc/flexiqd/flexiqd.yaml); its store unless --url or $FLEXIQ_URL")
    dependencies.add_argument("--window", type=_duration, default=60.0)
    dependencies.add_argument("--json", action="store_true")

    tasks = commands.add_parser("tasks", help="the tasks' declarations in the store: what an enqueue by name "
                                              "takes (queue, priority, attempts, timeout)")
    tasks.add_argument("names", nargs="*", metavar="TASK", help="only these tasks")
    tasks.add_argument("--json", action="store_true")

    jobs = commands.add_parser("jobs", help="list or show jobs")
    jobs_commands = jobs.add_subparsers(dest="jobs_command", metavar="ACTION", required=True)
    jobs_list = jobs_commands.add_parser("list")
    jobs_list.add_argument("--queue")
    jobs_list.add_argument("--state", choices=[s.value for s in JobState])
    jobs_list.add_argument("--limit", type=_positive_int, default=50)
    jobs_list.add_argument("--json", action="store_true")
    jobs_show = jobs_commands.add_parser("show", help="a job's state, result or error, and attempts")
    jobs_show.add_argument("id", type=int)
    jobs_show.add_argument("--json", action="store_true")
    jobs_cancel = jobs_commands.add_parser("cancel")
    jobs_cancel.add_argument("id", type=int)

    dead = commands.add_parser("dead-letter", help="jobs that failed for good")
    dead_commands = dead.add_subparsers(dest="dead_command", metavar="ACTION", required=True)
    dead_list = dead_commands.add_parser("list")
    dead_list.add_argument("--queue")
    dead_list.add_argument("--limit", type=_positive_int, default=50)
    dead_list.add_argument("--json", action="store_true")
    dead_retry = dead_commands.add_parser("retry")
    dead_retry.add_argument("ids", nargs="*", type=int, help="job ids (default: all)")
    dead_retry.add_argument("--queue")
    dead_purge = dead_commands.add_parser("purge")
    dead_purge.add_argument("--queue")
    dead_purge.add_argument("--older-than", type=_duration, default=0.0)

    grants = commands.add_parser(
        "producer-grants", help="print the SQL that lets a PostgreSQL role enqueue into the store, and nothing "
                                "more (docs/security.md); run it as the store's owner")
    grants.add_argument("role", help="the producer's role, e.g. web")
    grants.add_argument("--schema", default="public", help="the store's schema (default: public)")

    worker = commands.add_parser("worker", help="run a worker in the foreground")
    worker.add_argument("--app", help="module:attribute of the application's Queue "
                                      "(default: the pool's, from the config file)")
    worker.add_argument("--queues", type=_queues, default=None,
                        help=_for_worker("pools.<pool>.queues", "comma-separated"))
    worker.add_argument("--concurrency", type=_positive_int, default=None,
                        help=_for_worker("pools.<pool>.concurrency"))
    worker.add_argument("--lease", type=_duration, default=None, help=_for_worker("pools.<pool>.lease"))
    worker.add_argument("--drain-timeout", type=_duration, default=None,
                        help=_for_worker("pools.<pool>.drain_timeout"))
    worker.add_argument("--batch-size", type=_positive_int, default=None,
                        help=_for_worker("pools.<pool>.batch_size"))
    worker.add_argument("--instance", default=None,
                        help="<pool>-<n>, systemd's %%i: without --app, the pool's settings come "
                             "from the config file")
    worker.add_argument("--config", default=None,
                        help="the daemon's config file, for --instance (default: $FLEXIQD_CONFIG, "
                             "else /etc/flexiqd/flexiqd.yaml)")

    autoscale = commands.add_parser(
        "autoscale", help="run one autoscaled pool of workers in the foreground (flexiq's interface)")
    autoscale.add_argument("--app", required=True, help="module:attribute of the application's Queue")
    autoscale.add_argument("--min-workers", type=int, **_autoscaling("min_workers"))
    autoscale.add_argument("--max-workers", type=int, **_autoscaling("max_workers"))
    autoscale.add_argument("--target-queue-depth", type=int, **_autoscaling("target_queue_depth_per_worker"))
    autoscale.add_argument("--target-utilisation", type=float, **_autoscaling("target_utilisation"))
    autoscale.add_argument("--scale-up-window", type=_duration, **_autoscaling("scale_up_window"))
    autoscale.add_argument("--scale-down-window", type=_duration, **_autoscaling("scale_down_window"))
    autoscale.add_argument("--tolerance", type=float, **_autoscaling("tolerance"))
    autoscale.add_argument("--poll-interval", type=_duration, **_autoscaling("poll_interval"))
    autoscale.add_argument("--drain-timeout", type=_duration, **_autoscaling("drain_timeout"))
    autoscale.add_argument("--concurrency", "--threads-per-worker", dest="concurrency", type=_positive_int,
                           **_autoscaling("concurrency", "flexiq's --threads-per-worker"))
    autoscale.add_argument("--queues", type=_queues, **_autoscaling("queues", "comma-separated"))
    autoscale.add_argument("--batch-size", type=_positive_int, **_autoscaling("batch_size"))
    autoscale.add_argument("--policy", choices=setting("autoscale.policy").choices, **_autoscaling("policy"))
    autoscale.add_argument("--target-age", type=_duration, **_autoscaling("target_age", prefix="flexiqd policy: "))
    autoscale.add_argument("--target-drain-time", type=_duration,
                           **_autoscaling("target_drain_time", prefix="flexiqd policy: "))
    autoscale.add_argument("--scale-to-zero", action="store_true",
                           help=_about("pools.<pool>.scale_to_zero", default="off"))
    autoscale.add_argument("--cpu-bound", action="store_true",
                           help=_about("pools.<pool>.cpu_bound", default="off"))
    autoscale.add_argument("--fleet", choices=setting("autoscale.fleet").choices, **_autoscaling("fleet"))
    autoscale.add_argument("--pool", **_autoscaling("pool"))

    scaler = commands.add_parser(
        "scaler", help="serve the KEDA endpoint and the queue metrics (/api/scaler, /metrics, /health) from the "
                   "store, without the daemon")
    host, port = listen_default()
    scaler.add_argument("--host", default=host,
                        help=f"address to listen on (default {host}; a non-loopback one needs --token-file)")
    scaler.add_argument("--port", type=whole_number(1, 65535), default=port, help=f"default {port}")
    scaler.add_argument("--target-queue-depth", type=_positive_int, default=setting("http.scaler_target").default,
                        help=f"targetValue: jobs (runnable and running) per replica "
                             f"(default {show_default('http.scaler_target')})")
    scaler.add_argument("--queue", action="append", default=None,
                        help="serve only this queue (repeatable; default: every queue in the store)")
    scaler.add_argument("--token-file", default=None,
                        help="a file holding the bearer token clients must send (Authorization: Bearer)")

    check = commands.add_parser(
        "check", help="check the store for damage (SQLite: integrity_check, its write-ahead log, the job "
                      "counts; PostgreSQL: the schema version and every table read); exit 0 whole, "
                      "3 damaged, 1 not checked")
    check.add_argument("--quick", action="store_true",
                       help="SQLite: quick_check instead of integrity_check (the daemon's check at start: "
                            "every page read, indexes not matched against their tables)")
    check.add_argument("--json", action="store_true")
    store_ops.add_commands(commands)

    bench = commands.add_parser("bench", help="benchmarks")
    bench.add_argument("what", choices=["policies", "replay"],
                       help="what to run: policies (every policy on every trace, in the simulator) or replay "
                            "(a trace, time-compressed, through the real daemon and worker units in a "
                            "throw-away systemd container, beside the simulator; needs root)")
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    try:
        return _dispatch(args)
    except FlexiqdError as exc:
        print(f"flexiq: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "worker":
        return _worker(args)
    if args.command == "autoscale":
        return _autoscale(args)
    if args.command == "scaler":
        return _scaler(args)
    if args.command == "bench":
        from . import bench  # the simulator's commands: imported only for them

        if args.what == "replay":
            return bench.replay_main(args.rest)
        return bench.main([args.what, *args.rest])
    if args.command == "dependencies":
        return _dependencies(args)
    if args.command in store_ops.COMMANDS:
        return store_ops.run(args)
    if args.command == "producer-grants":
        return _producer_grants(args)
    store = store_for_command(args.url)
    if store.note:
        print(f"flexiq: {store.note}", file=sys.stderr)
    if args.command == "check":
        return _check(store.url, args)
    try:
        backend = open_backend(store.url)
    except StoreUnavailable as exc:
        hint = opening_hint(store)
        if hint is None:
            raise
        raise StoreUnavailable(f"{exc} {hint}") from None
    try:
        if args.command == "enqueue":
            return _enqueue(backend, args)
        if args.command == "stats":
            return _stats(backend, args)
        if args.command == "jobs":
            return _jobs(backend, args)
        if args.command == "tasks":
            return _tasks(backend, args)
        return _dead_letter(backend, args)
    finally:
        backend.close()


def _producer_grants(args: argparse.Namespace) -> int:
    from ..queue.postgres.grants import producer_grants

    try:
        statements = producer_grants(args.role, args.schema)
    except ValueError as exc:
        raise FlexiqdError(str(exc)) from None
    print(f"-- {args.role} may enqueue into the flexiqd store in schema {args.schema}, and nothing more.")
    print("-- Run as the store's owner, once the daemon has created its tables.")
    print("\n".join(statements))
    return EXIT_OK


def _worker(args: argparse.Namespace) -> int:
    # Signals first: reading the config and importing the app can take a while, and a
    # pause or stop sent meanwhile must be recorded, not kill a worker that is starting.
    from ..worker.signals import WorkerSignals

    signals = WorkerSignals.install()
    from ..worker.settings_reader import worker_setup
    from ..worker.main import run_worker

    setup = worker_setup(app=args.app, url=args.url, instance=args.instance, config=args.config,
                         overrides={"queues": args.queues, "concurrency": args.concurrency,
                                    "lease_seconds": args.lease, "drain_timeout": args.drain_timeout,
                                    "batch_size": args.batch_size})
    return run_worker(setup, signals)


def _autoscale(args: argparse.Namespace) -> int:
    from ..autoscale import AutoscaleConfig, serve_autoscaler
    from ..queue.api import Queue

    config = AutoscaleConfig(
        app=args.app, min_workers=args.min_workers, max_workers=args.max_workers,
        target_queue_depth_per_worker=args.target_queue_depth, target_utilisation=args.target_utilisation,
        scale_up_window=args.scale_up_window, scale_down_window=args.scale_down_window,
        tolerance=args.tolerance, poll_interval=args.poll_interval, drain_timeout=args.drain_timeout,
        concurrency=args.concurrency, queues=args.queues, batch_size=args.batch_size, policy=args.policy,
        target_age=args.target_age, target_drain_time=args.target_drain_time,
        scale_to_zero=args.scale_to_zero, cpu_bound=args.cpu_bound, fleet=args.fleet, pool=args.pool)
    queue = Queue(args.url or default_url())
    try:
        serve_autoscaler(queue, config)
    finally:
        queue.close()
    return EXIT_OK


def _scaler(args: argparse.Namespace) -> int:
    import asyncio

    from ..http.standalone import ScalerOptions, serve_scaler

    asyncio.run(serve_scaler(ScalerOptions(
        url=args.url or default_url(), host=args.host, port=args.port, target=args.target_queue_depth,
        queues=tuple(args.queue) if args.queue else None, token_file=args.token_file)))
    return EXIT_OK


def _check(url: str, args: argparse.Namespace) -> int:
    """Check the store without opening it as a queue: nothing is created, migrated or repaired."""
    from ..queue.sqlite.check import RESTORE_ADVICE, Depth
    from ..queue.store_check import check_url_store

    report = check_url_store(url, Depth.QUICK if args.quick else Depth.FULL)
    if args.json:
        print(json.dumps({"store": report.path, "healthy": report.healthy, "checked": list(report.checked),
                          "findings": [{"kind": f.kind, "message": f.message} for f in report.findings]},
                         indent=2))
    elif report.healthy:
        print(report.summary())
    else:
        print(f"the queue database {report.path} is damaged:")
        for finding in report.findings:
            print(f"  {finding.kind}: {finding.message}")
        print(RESTORE_ADVICE + ".")
    return EXIT_OK if report.healthy else EXIT_DAMAGED


def _enqueue(backend, args: argparse.Namespace) -> int:
    if args.kwargs is not None and not isinstance(args.kwargs, dict):
        raise FlexiqdError("--kwargs must be a JSON object, as in --kwargs '{\"seconds\": 2}'")
    given = {name: value for name, value in (("queue", args.queue), ("priority", args.priority),
                                             ("max_attempts", args.max_attempts), ("timeout", args.timeout))
             if value is not None}
    job = by_name(args.task, {"args": args.args, "kwargs": args.kwargs or {}},
                  {**given, "delay": args.delay, "idempotency_key": args.key, "tenant": args.tenant})
    if job.from_declaration and not backend.task_declarations([args.task]):
        defaults = {"queue": "default", "priority": "0", "max_attempts": "3", "timeout": "none"}
        print(f"flexiq: no worker has declared task {args.task} in {backend.url}: "
              + ", ".join(f"{name} {defaults[name]}" for name in DECLARED_OPTIONS if name in job.from_declaration)
              + " (the defaults)", file=sys.stderr)
    ids = backend.enqueue([job] * args.count, now=backend.clock())
    if len(ids) == 1:
        print(ids[0])
    else:
        print(f"enqueued {len(ids)} jobs, ids {ids[0]}..{ids[-1]}")
    return EXIT_OK


def _tasks(backend, args: argparse.Namespace) -> int:
    known = backend.task_declarations(args.names or None)
    if args.json:
        print(json.dumps({name: dataclasses.asdict(d) for name, d in known.items()}, indent=2))
        return EXIT_OK
    missing = undeclared(args.names, known)
    for name in missing:
        print(f"flexiq: no worker has declared task {name} in {backend.url}: an enqueue by name gets "
              f"the defaults", file=sys.stderr)
    if known:
        print(render_declarations(list(known.values()), now=time.time()))
    return EXIT_ERROR if missing else EXIT_OK


def render_declarations(declared: list, *, now: float) -> str:
    header = ("TASK", "QUEUE", "PRIORITY", "ATTEMPTS", "TIMEOUT", "DECLARED BY", "SINCE")
    lines = [header] + [(d.task, d.queue, str(d.priority), str(d.max_attempts),
                         "none" if d.timeout is None else format_duration(d.timeout), d.declared_by or "",
                         f"{format_duration(max(0.0, now - d.declared_at))} ago" if d.declared_at else "")
                        for d in declared]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines)


def _stats(backend, args: argparse.Namespace) -> int:
    now = backend.clock()
    names = args.queue or backend.queues() or ["default"]
    stats = [backend.stats(name, now=now, window=args.window) for name in names]
    if args.json:
        print(json.dumps({s.queue: s.as_dict() for s in stats}, indent=2))
        return EXIT_OK
    print(render_stats_table(stats))
    return EXIT_OK


def render_stats_table(stats: list[Stats]) -> str:
    """One row per queue, then one per tenant; CAPPED: due jobs a tenant cap holds back
    (a tenant with any is at its cap)."""
    header = ("QUEUE", "RUNNABLE", "DELAYED", "WAITING", "CAPPED", "RUNNING", "DEAD", "OLDEST", "DRAIN", "IN/s",
              "OUT/s", "FAIL/s", "P50", "P95", "P99")
    rows = [header]
    for s in stats:
        rows.append(_stats_row(s.queue, s))
        for tenant, t in sorted(s.tenants.items()):
            rows.append(_stats_row(f"  {tenant}", t))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _stats_row(name: str, s: Stats) -> tuple[str, ...]:
    return (name, str(s.runnable), str(s.delayed), str(s.waiting_for_dependency), str(s.held_by_tenant_cap),
            str(s.running), str(s.dead),
            format_duration(s.oldest_runnable_age), format_duration(s.time_to_drain),
            f"{s.arrival_rate:.1f}", f"{s.completion_rate:.1f}", f"{s.failure_rate:.2f}",
            format_duration(s.duration_p50), format_duration(s.duration_p95),
            format_duration(s.duration_p99))


def _dependencies(args: argparse.Namespace) -> int:
    import os

    from ..config.load import load_config
    from ..worker.settings_reader import config_path

    config = load_config(config_path(args.config))
    url = args.url or os.environ.get(URL_ENV) or config.store
    backend = open_backend(url)
    now = backend.clock()
    try:
        rows = [(limit, backend.dependency_stats(name, now=now, window=args.window))
                for name, limit in sorted(config.dependency_limits.items())]
    finally:
        backend.close()
    if args.json:
        print(json.dumps({limit.name: {"limit": limit.as_dict(), **used.as_dict()} for limit, used in rows},
                         indent=2))
        return EXIT_OK
    if not rows:
        print(f"no dependency has a limit in {config.path} (dependencies.<name>.limit)")
        return EXIT_OK
    print(render_dependencies_table(rows))
    return EXIT_OK


def render_dependencies_table(rows: list) -> str:
    """One line per limited dependency: its use now against its limit, and its recent hold times."""
    header = ("DEPENDENCY", "IN USE", "RATE LIMIT", "WAITING", "ADMITTED/s", "DEFERRED/s", "HOLD P50",
              "HOLD P95")
    lines = [header]
    for limit, used in rows:
        in_use = f"{used.in_use}/{limit.concurrency}" if limit.concurrency is not None else str(used.in_use)
        rate = f"{limit.rate:g}/s burst {limit.effective_burst}" if limit.rate is not None else "-"
        lines.append((limit.name, in_use, rate, str(used.waiting), f"{used.admitted_rate:.1f}",
                      f"{used.deferred_rate:.1f}", format_duration(used.hold_p50), format_duration(used.hold_p95)))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines)


def _job_dict(job: Job) -> dict:
    data = dict(job.__dict__)
    data["state"] = job.state.value
    return data


def _print_jobs(jobs: list[Job], as_json: bool) -> None:
    if as_json:
        print(json.dumps([_job_dict(j) for j in jobs], indent=2))
        return
    print(f"{'ID':>8}  {'STATE':9}  {'QUEUE':12}  {'TASK':30}  ATTEMPTS  ERROR")
    for j in jobs:
        error = (j.error or "").strip().splitlines()[-1:] or [""]
        print(f"{j.id:>8}  {j.state.value:9}  {j.queue:12.12}  {j.task:30.30}  "
              f"{j.attempts}/{j.max_attempts:<6}  {error[0][:60]}")


def _jobs(backend, args: argparse.Namespace) -> int:
    if args.jobs_command == "list":
        _print_jobs(backend.list_jobs(queue=args.queue, state=args.state, limit=args.limit), args.json)
    elif args.jobs_command == "show":
        job = backend.get(args.id)
        if args.json:
            print(json.dumps(_job_dict(job), indent=2))
        else:
            for key, value in _job_dict(job).items():
                print(f"{key:16} {value}")
            for row in backend.executions(job_id=job.id):
                print(f"  attempt {row['attempt']} by {row['worker']}: {row['outcome']}")
    else:
        if not backend.cancel(args.id, now=backend.clock()):
            raise FlexiqdError(f"job {args.id} has already finished; nothing to cancel")
        print(f"cancelled job {args.id}")
    return EXIT_OK


def _dead_letter(backend, args: argparse.Namespace) -> int:
    if args.dead_command == "list":
        _print_jobs(backend.list_jobs(queue=args.queue, state=JobState.DEAD, limit=args.limit), args.json)
    elif args.dead_command == "retry":
        n = backend.retry_dead(queue=args.queue, job_ids=args.ids or None, now=backend.clock())
        print(f"{n} dead jobs queued again")
    else:
        n = backend.purge(states=[JobState.DEAD], finished_before=backend.clock() - args.older_than,
                          queue=args.queue)
        print(f"{n} dead jobs purged")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
