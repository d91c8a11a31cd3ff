"""``flexiq bench``: the simulator's command lines (``python -m flexiqd.sim`` runs the first).

    flexiq bench policies [--trace FILE ...] [--json | --markdown] [--plots DIR] [--down-window SECONDS ...]
    flexiq bench policies --random N [--seed S] [--family F ...] [--jobs J] [--json | --markdown] [--plots DIR]
    flexiq bench replay --trace FILE [--trace FILE ...] [--speed K] [--json | --markdown]

``policies``: every policy on every trace, as a table, JSON, or plots
(``flexiqd.sim.bench``).  Without ``--trace``, the standard traces shipped in
``flexiqd/sim/traces/``.  ``--random N`` draws N workloads from the families of
``sim.families`` instead (``--family`` limits them) and sums every policy up over them
(``sim.random_report``); ``--plots`` then draws flexiqd's worst cases.
``--down-window`` adds a row of flexiqd's policy with that down window, to show what
the default 300 s window costs and what it saves.

``replay``: a trace's jobs, time-compressed, through the real daemon on a real systemd
(``flexiqd.sim.replay``, docs/replay.md).

Exit codes: 0 done, 2 bad arguments or an unusable trace (one line on stderr, no
traceback); ``replay`` also 69 when no systemd container can be booted here and 1 when
the container or the daemon failed during a run.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import multiprocessing
import os
import signal
import sys
from pathlib import Path
from typing import Any, Sequence

from ..sim.bench import TRACES_DIR, bench_trace, standard_traces
from ..sim.families import FAMILIES, sample
from ..sim.random_report import format_random, random_json, worst
from ..sim.replay import (DEFAULT_SPEED, ReplayResult, Row, compress_trace, daemon_config, measure, replay_policy,
                          schedule, simulate, unreplayable)
from ..sim.replay import format_markdown as replay_markdown
from ..sim.replay import format_table as replay_table
from ..sim.replay import to_json as replay_json
from ..sim.report import TraceReport, format_markdown, format_table, plot_trace, to_json
from ..sim.trace import Trace, TraceError, load_trace
from .argtypes import number

EXIT_OK = 0
EXIT_FAILED = 1  # replay: the container, the daemon or the driver failed during a run
EXIT_USAGE = 2  # bad arguments, unreadable, invalid or unreplayable trace, plots that cannot be written
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: replay: no systemd container can be booted on this machine
PROG = "flexiq bench"
REPLAY_PROG = "flexiq bench replay"
# The replay's systemd-nspawn harness: in a source checkout's bench/, never installed.
HARNESS = Path(__file__).resolve().parents[2] / "bench" / "replay_machine.py"


class UsageError(Exception):
    """A command-line or input problem, reported as one line."""


def _print(args: argparse.Namespace, results: Sequence[Any], as_json: Any, as_markdown: Any, as_table: Any) -> None:
    """The results on stdout as ``--json`` or ``--markdown`` asked, else as a table."""
    if args.json:
        print(json.dumps(as_json(results), indent=2))
    elif args.markdown:
        sys.stdout.write(as_markdown(results))
    else:
        sys.stdout.write(as_table(results))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would print usage and exit itself
        raise UsageError(message)


# --- flexiq bench policies ----------------------------------------------------------------------


def _parser() -> _Parser:
    parser = _Parser(prog=PROG, description="Compare scaling policies in the simulator.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    policies = commands.add_parser("policies", help="run every policy on every trace")
    policies.add_argument("--trace", action="append", metavar="FILE", help="a trace file (repeatable)")
    output = policies.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print JSON instead of a table")
    output.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    policies.add_argument("--plots", metavar="DIR", help="write one PNG per trace into DIR")
    policies.add_argument("--down-window", action="append", type=number(finite=False, unit="seconds"), default=[], metavar="SECONDS",
                          help="also run flexiqd with this down window (repeatable)")
    policies.add_argument("--probe", action="append", type=_factor, default=[], metavar="FACTOR",
                          help="also run flexiqd with a probe of the workload's dependency (the request path's "
                               "latency), heeded at this factor over its baseline (repeatable)")
    policies.add_argument("--random", type=_count, metavar="N", help="N workloads drawn at random instead of traces")
    policies.add_argument("--seed", type=int, default=0, help="the random sample's seed (default 0)")
    policies.add_argument("--family", action="append", choices=sorted(FAMILIES), metavar="F",
                          help=f"draw from this family only (repeatable; {', '.join(FAMILIES)})")
    policies.add_argument("--jobs", type=_count, default=os.cpu_count() or 1, metavar="J",
                          help="workloads run at once (default: one per CPU)")
    return parser


def _factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value > 1:
        raise argparse.ArgumentTypeError(f"must be a number above 1, got {text}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _run_random(args: argparse.Namespace) -> int:
    families = tuple(args.family or FAMILIES)
    traces = sample(args.random, args.seed, families)
    run = functools.partial(bench_trace, down_windows=tuple(args.down_window), probe_factors=tuple(args.probe))
    if args.jobs > 1 and len(traces) > 1:
        with multiprocessing.Pool(args.jobs) as pool:
            reports = pool.map(run, traces, chunksize=1)
    else:
        reports = [run(trace) for trace in traces]
    if args.plots:
        _plot(worst(reports), Path(args.plots))
    if args.json:
        print(json.dumps(random_json(reports, args.seed, families), indent=2))
    else:
        sys.stdout.write(format_random(reports, args.seed, families, markdown=args.markdown))
    return EXIT_OK


def main(argv: Sequence[str]) -> int:
    """Run the command in ``argv`` (without the program name); returns the exit code."""
    try:
        args = _parser().parse_args(list(argv))
        if args.random is not None:
            if args.trace:
                raise UsageError("--random and --trace do not go together")
            return _run_random(args)
        paths = [Path(p) for p in args.trace] if args.trace else standard_traces()
        if not paths:
            raise UsageError(f"no traces found in {TRACES_DIR}")
        traces = [load_trace(path) for path in paths]
        reports = [bench_trace(trace, args.down_window, args.probe) for trace in traces]
        if args.plots:
            _plot(reports, Path(args.plots))
    except (UsageError, TraceError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    _print(args, reports, to_json, format_markdown, format_table)
    return EXIT_OK


def _plot(reports: list[TraceReport], directory: Path) -> None:
    try:
        for report in reports:
            plot_trace(report, directory / f"{report.trace.name}.png")
    except ImportError:
        raise UsageError("--plots needs matplotlib, which is not installed") from None
    except OSError as error:
        raise UsageError(f"cannot write plots to {directory}: {error.strerror or error}") from None


# --- flexiq bench replay ------------------------------------------------------------------------


def build_replay_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=REPLAY_PROG, description="Replay a trace, time-compressed, through the real daemon "
                                            "and real worker units in a throw-away systemd container, "
                                            "beside the simulator's run of the same jobs.")
    parser.add_argument("--trace", action="append", required=True, metavar="FILE",
                        help="a trace file (repeatable; e.g. flexiqd/sim/traces/steady.json)")
    parser.add_argument("--speed", type=number(positive=True), default=DEFAULT_SPEED, metavar="K",
                        help=f"divide every time in the trace by K (default {DEFAULT_SPEED:g})")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true",
                        help="print JSON (with both sides' decisions) instead of a table")
    output.add_argument("--markdown", action="store_true", help="print the comparison as a Markdown table")
    return parser


def replay_main(argv: Sequence[str]) -> int:
    """Run ``bench replay`` with ``argv`` (after the subcommand's name); returns the exit code."""
    try:
        args = build_replay_parser().parse_args(list(argv))
        traces = []
        for path in args.trace:
            trace = load_trace(Path(path))
            why = unreplayable(trace)
            if why:
                raise UsageError(f"{path}: cannot be replayed: {why}")
            traces.append(trace)
    except (UsageError, TraceError) as error:
        print(f"{REPLAY_PROG}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    machine = replay_harness()
    reason = (f"it needs a source checkout of flexiqd ({HARNESS} is missing: the packages do not ship "
              f"the replay's harness)" if machine is None else machine.unavailable_reason())
    if reason:
        print(f"{REPLAY_PROG}: cannot boot a systemd container here: {reason}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    results = []
    # SIGTERM tears the container down as Ctrl-C does (the sandbox stops on the way out);
    # the previous handler is restored afterwards.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        for trace in traces:
            results.append(replay_one(trace, args.speed, machine))
    except machine.ReplayError as error:
        print(f"{REPLAY_PROG}: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        signal.signal(signal.SIGTERM, previous)
    _print(args, results, replay_json, replay_markdown, replay_table)
    return EXIT_OK


def replay_harness() -> Any:
    """The systemd-nspawn harness, ``bench/replay_machine.py`` of the source checkout this
    flexiqd runs from; None from an installed package, which does not ship it."""
    if not HARNESS.is_file():
        return None
    name = "flexiqd_bench_replay_machine"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HARNESS)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def replay_one(trace: Trace, speed: float, machine: Any) -> ReplayResult:
    """Simulate and replay one trace; both rows in the trace's own seconds."""
    compressed = compress_trace(trace, speed)
    policy = replay_policy(compressed, speed)
    simulated, simulated_decisions = simulate(compressed, policy)
    jobs = schedule(compressed)
    print(f"{REPLAY_PROG}: {trace.name}: {len(jobs)} jobs over {compressed.duration:g} s ...", file=sys.stderr, flush=True)
    recording = machine.replay(compressed, daemon_config(compressed, policy), jobs)
    measured = measure(recording, compressed.target_age)
    return ReplayResult(trace=trace.name, speed=speed, jobs=len(jobs),
                        simulated=Row.from_result(simulated).scaled(speed), measured=measured.scaled(speed),
                        simulated_decisions=simulated_decisions, measured_decisions=recording.decisions)
