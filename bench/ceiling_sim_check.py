"""The simulator against the real ceilings: the recorded flash crowds, simulated beside what was measured.

    .venv/bin/python bench/ceiling_sim_check.py                                  # results-ceilings-final.json
    .venv/bin/python bench/ceiling_sim_check.py --results bench/results-ceilings.json --start-cost 4
    .venv/bin/python bench/ceiling_sim_check.py --record                         # writes results-ceilings-sim.json

For each kind of ceiling in a run recorded by bench/ceiling_bench.py, the simulator's
dependency model is fitted to that run's knee sweep (flexiqd/sim/ceiling_fit.py) and
the same flash crowd is simulated for every policy the run had
(flexiqd/sim/ceiling_check.py); the table puts settle and max workers, the drain
time and the request p95's ratio to the fixed fleet at the knee side by side,
simulated against real, with the difference in %.  A few seconds; nothing real runs.
Method and the recorded result: bench/ceilings-sim.md.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

BENCH = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from flexiqd.sim.ceiling_check import COMPARED, check_kind  # noqa: E402
from flexiqd.sim.ceiling_fit import FitError  # noqa: E402

DEFAULT_RESULTS = BENCH / "results-ceilings-final.json"
RECORD = BENCH / "results-ceilings-sim.json"
# A process worker's start to its first claim after a burst: 0.52 s median (bench/burst.md).
DEFAULT_START_COST = 0.5
LABELS = {"settle_workers": "settle", "max_workers": "max", "drain_s": "drain s", "p95_ratio": "p95 / knee's"}


def check_run(path: pathlib.Path, start_cost: float) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise SystemExit(f"ceiling_sim_check: {path}: cannot read a recorded run: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("kinds"), dict) or "settings" not in data:
        raise SystemExit(f"ceiling_sim_check: {path}: not bench/ceiling_bench.py's JSON (no kinds/settings)")
    kinds = {}
    for kind, recorded in data["kinds"].items():
        try:
            kinds[kind] = check_kind(kind, recorded, data["settings"], start_cost)
        except FitError as error:
            raise SystemExit(f"ceiling_sim_check: {path.name}: {error}") from None
    return {"results": str(path.relative_to(BENCH.parent)) if path.is_relative_to(BENCH.parent) else str(path),
            "recorded": data.get("recorded"), "commit": data.get("commit"), "start_cost": start_cost,
            "kinds": kinds}


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}" if abs(value) >= 100 else f"{value:.2f}".rstrip("0").rstrip(".")
    return str(value)


def _pct(value) -> str:
    return "-" if value is None else f"{value:+.0f}%"


def markdown(check: dict) -> str:
    lines = [f"Run: `{check['results']}` (recorded {check['recorded']}, flexiqd at `{check['commit']}`); "
             f"simulated start cost {check['start_cost']:g} s.", ""]
    head = " | ".join(f"{LABELS[key]} sim / real (diff)" for key in COMPARED)
    lines += [f"| kind (knee) | policy | {head} |", "|---|---|" + "---:|" * len(COMPARED)]
    for kind, result in check["kinds"].items():
        first = True
        for row in result["policies"]:
            label = f"{kind} ({result['knee']})" if first else ""
            first = False
            cells = [f"{_cell(row['simulated'][key])} / {_cell(row['real'][key])} ({_pct(row['difference_pct'][key])})"
                     for key in COMPARED]
            drained = "" if row["simulated"]["drained"] else " (sim: not drained)"
            lines.append(f"| {label} | {row['policy']}{drained} | " + " | ".join(cells) + " |")
        if result["not_simulated"]:
            lines.append(f"| {kind} | not simulated: {', '.join(result['not_simulated'])} |" + " |" * len(COMPARED))
    return "\n".join(lines)


def fits_markdown(check: dict) -> str:
    lines = ["| kind | hold ms | outside ms | capacity | penalty | request p95 ms below the ceiling | "
             "wait ms per unit | "
             "from units | sweep jobs/s off by (median / worst) | sweep request p95 off by (median / worst) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind, result in check["kinds"].items():
        fit = result["fit"]
        rate = _errors([(p["model_jobs_per_s"], p["jobs_per_s"]) for p in fit["points"]])
        p95 = _errors([(p["model_request_p95_ms"], p["request_p95_ms"]) for p in fit["points"]])
        lines.append(f"| {kind} | {fit['hold'] * 1000:.1f} | {fit['overhead'] * 1000:.1f} | {fit['capacity']:.2f} | "
                     f"{fit['overload_penalty']:.4f} | {fit['request_latency'] * 1000:.1f} | "
                     f"{fit['request_wait'] * 1000:.2f} | {fit['request_wait_from']:.2f} | {rate} | {p95} |")
    return "\n".join(lines)


def _errors(pairs: list[tuple[float, float]]) -> str:
    """The median and the worst of |model / measured - 1| over a sweep, in %."""
    offs = sorted(abs(model / real - 1) * 100 for model, real in pairs if real)
    return f"{offs[len(offs) // 2]:.0f}% / {offs[-1]:.0f}%" if offs else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=pathlib.Path, action="append",
                        help=f"a run of bench/ceiling_bench.py (repeatable; default {DEFAULT_RESULTS.name})")
    parser.add_argument("--start-cost", type=float, default=DEFAULT_START_COST,
                        help="seconds from a start decision to the worker's first claim "
                             f"(default {DEFAULT_START_COST})")
    parser.add_argument("--json", action="store_true", help="print the JSON instead of the tables")
    parser.add_argument("--record", action="store_true", help=f"also write {RECORD.name}")
    args = parser.parse_args(argv)
    if args.start_cost < 0:
        parser.error(f"--start-cost: must be >= 0, got {args.start_cost:g}")
    started = time.monotonic()
    checks = [check_run(path.resolve(), args.start_cost) for path in (args.results or [DEFAULT_RESULTS])]
    if args.json:
        print(json.dumps(checks, indent=1))
    else:
        for check in checks:
            print(markdown(check), "\n\nFitted model:\n", fits_markdown(check), "\n", sep="\n")
    if args.record:
        RECORD.write_text(json.dumps({"recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                      "seconds": round(time.monotonic() - started, 1), "checks": checks},
                                     indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
