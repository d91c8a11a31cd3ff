"""``bench policies``: every policy on every trace, as a table, JSON, or plots.

    bench policies [--trace FILE ...] [--json | --markdown] [--plots DIR] [--down-window SECONDS ...]
    bench policies --random N [--seed S] [--family F ...] [--jobs J] [--json | --markdown] [--plots DIR]

Without ``--trace``, the standard traces shipped in ``flexiqd/sim/traces/``.
``--random N`` draws N workloads from the families of ``sim.families`` instead
(``--family`` limits them) and sums every policy up over them
(``sim.random_report``); ``--plots`` then draws flexiqd's worst cases.
``--down-window`` adds a row of flexiqd's policy with that down window, to
show what the default 300 s window costs and what it saves.
Exit codes: 0 done, 2 bad arguments or an unusable trace (one line on
stderr, no traceback).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
from pathlib import Path
from typing import Sequence

from ..cli.argtypes import number
from .engine import Policy, run
from .families import FAMILIES, sample
from .oracle import Oracle
from .policies import FixedPeak, Flexiq, Flexiqd, HpaCpu, KedaDepth
from .random_report import format_random, random_json, worst
from .report import TraceReport, format_markdown, format_table, plot_trace, to_json
from .trace import Trace, TraceError, Workload, load_trace, realise

EXIT_OK = 0
EXIT_USAGE = 2  # bad arguments, unreadable or invalid trace, plots that cannot be written
PROG = "flexiq bench"
TRACES_DIR = Path(__file__).resolve().parent / "traces"


class UsageError(Exception):
    """A command-line or input problem, reported as one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would print usage and exit itself
        raise UsageError(message)


def standard_traces() -> list[Path]:
    """The shipped traces, in name order."""
    return sorted(TRACES_DIR.glob("*.json"))


def policies_for(workload: Workload, down_windows: Sequence[float] = ()) -> list[Policy]:
    """Every policy compared, in table order (the oracle last)."""
    variants: list[Policy] = [Flexiqd(down_window=window) for window in down_windows]
    return [
        FixedPeak(workload.runnable_at, workload.base_duration),
        HpaCpu(),
        KedaDepth(),
        Flexiq(),
        Flexiqd(),
        *variants,
        Oracle(),
    ]


def bench_trace(trace: Trace, down_windows: Sequence[float] = ()) -> TraceReport:
    """Run every policy on ``trace`` (the same realised jobs for each)."""
    workload = realise(trace)
    policies = policies_for(workload, down_windows)
    return TraceReport(trace=trace, results=tuple(run(trace, workload, policy) for policy in policies))


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
    policies.add_argument("--random", type=_count, metavar="N", help="N workloads drawn at random instead of traces")
    policies.add_argument("--seed", type=int, default=0, help="the random sample's seed (default 0)")
    policies.add_argument("--family", action="append", choices=sorted(FAMILIES), metavar="F",
                          help=f"draw from this family only (repeatable; {', '.join(FAMILIES)})")
    policies.add_argument("--jobs", type=_count, default=os.cpu_count() or 1, metavar="J",
                          help="workloads run at once (default: one per CPU)")
    return parser


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
    if args.jobs > 1 and len(traces) > 1:
        with multiprocessing.Pool(args.jobs) as pool:
            reports = pool.map(bench_trace, traces, chunksize=1)
    else:
        reports = [bench_trace(trace) for trace in traces]
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
        reports = [bench_trace(trace, args.down_window) for trace in traces]
        if args.plots:
            _plot(reports, Path(args.plots))
    except (UsageError, TraceError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(to_json(reports), indent=2))
    elif args.markdown:
        sys.stdout.write(format_markdown(reports))
    else:
        sys.stdout.write(format_table(reports))
    return EXIT_OK


def _plot(reports: list[TraceReport], directory: Path) -> None:
    try:
        for report in reports:
            plot_trace(report, directory / f"{report.trace.name}.png")
    except ImportError:
        raise UsageError("--plots needs matplotlib, which is not installed") from None
    except OSError as error:
        raise UsageError(f"cannot write plots to {directory}: {error.strerror or error}") from None
