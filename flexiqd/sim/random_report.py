"""``bench policies --random``: every policy on workloads drawn at random, summed up.

Per policy: how many workloads meet each part of the goal (``report.check_goal``:
the age target, the dependency, the cost, no busy worker killed, the jobs' completion
time, the request path) and all of it, the distribution of its cost ratios to the
oracle; per family, how many of its workloads each policy meets the whole goal on; and
flexiqd's worst cases.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Sequence

from .report import ORACLE, SUBJECT, TraceReport, check_goal

PARTS = ("age", "dependency", "cost", "killed", "completion", "requests")


@dataclass(frozen=True)
class PolicyTally:
    """One policy over every workload: goals met, per part and in all, and its cost ratios."""

    policy: str
    workloads: int
    met: dict[str, int]
    all_met: int
    ratios: tuple[float, ...]

    def ratio_at(self, share: float) -> float | None:
        """The cost ratio at this quantile (nearest rank), None without ratios."""
        if not self.ratios:
            return None
        ordered = sorted(self.ratios)
        return ordered[min(len(ordered) - 1, max(0, round(share * (len(ordered) - 1))))]


def tally(reports: Sequence[TraceReport]) -> list[PolicyTally]:
    """Every policy but the oracle, in the order of the first report's results."""
    if not reports:
        return []
    names = [r.policy for r in reports[0].results if r.policy != ORACLE]
    tallies = []
    for name in names:
        met = {part: 0 for part in PARTS}
        all_met, ratios = 0, []
        for report in reports:
            goal = check_goal(report, name)
            result = report.result(name)
            ratio = report.cost_ratio(result) if result else None
            if ratio is not None:
                ratios.append(ratio)
            if goal is None:
                continue
            for part in PARTS:
                met[part] += getattr(goal, part)
            all_met += goal.met
        tallies.append(PolicyTally(name, len(reports), met, all_met, tuple(ratios)))
    return tallies


def family_of(report: TraceReport) -> str:
    """The family a drawn workload came from (its name is ``<family>-<seed>``)."""
    return report.trace.name.rsplit("-", 1)[0]


def family_tallies(reports: Sequence[TraceReport]) -> dict[str, tuple[int, dict[str, int]]]:
    """Per family, in order of first appearance: (workloads, whole goal met per policy)."""
    found: dict[str, tuple[int, dict[str, int]]] = {}
    for report in reports:
        count, met = found.get(family_of(report), (0, {}))
        for result in report.results:
            if result.policy == ORACLE:
                continue
            goal = check_goal(report, result.policy)
            met[result.policy] = met.get(result.policy, 0) + bool(goal is not None and goal.met)
        found[family_of(report)] = (count + 1, met)
    return found


def worst(reports: Sequence[TraceReport], count: int = 10) -> list[TraceReport]:
    """flexiqd's worst workloads: those that miss the goal first (most seconds over target
    beyond the oracle's), then the costliest."""
    def badness(report: TraceReport) -> tuple:
        goal = check_goal(report)
        subject, oracle = report.result(SUBJECT), report.result(ORACLE)
        lost = (subject.slo_seconds - oracle.slo_seconds) if subject and oracle else 0.0
        ratio = report.cost_ratio(subject) if subject else 0.0
        return (goal is not None and not goal.met, lost, ratio or 0.0)
    return sorted(reports, key=badness, reverse=True)[:count]


def _describe(report: TraceReport) -> str:
    subject, oracle = report.result(SUBJECT), report.result(ORACLE)
    goal = check_goal(report)
    verdict = "met" if goal is None or goal.met else "NOT met (" + ", ".join(goal.shortfalls()) + ")"
    trace = report.trace
    ratio = report.cost_ratio(subject) if subject else None
    over = f", {subject.over_capacity_seconds:.0f} s over capacity" if trace.dependency else ""
    return (f"{trace.name} (target {trace.target_age:g}s, tick {trace.tick_interval:g}s, start "
            f"{trace.workers.cold_start:g}s): {subject.slo_seconds:.0f} s over target (oracle "
            f"{oracle.slo_seconds:.0f}), {ratio:.2f} x, {subject.killed} killed{over}: {verdict}")


def format_random(reports: Sequence[TraceReport], seed: int, families: Sequence[str], markdown: bool = False) -> str:
    """The summary table and flexiqd's worst cases."""
    tallies = tally(reports)
    head = (f"{len(reports)} workloads drawn at random (seed {seed}; families: {', '.join(families)})")
    columns = ["policy", "age target", "dependency", "cost <= 1.25x", "none killed", "completion", "requests",
               "whole goal", "cost p10", "median", "p90", "max"]
    rows = []
    for t in tallies:
        quantiles = [t.ratio_at(q) for q in (0.1, 0.5, 0.9, 1.0)]
        rows.append([t.policy] + [f"{t.met[p]}/{t.workloads}" for p in PARTS] + [f"{t.all_met}/{t.workloads}"]
                    + [f"{q:.2f}" if q is not None else "-" for q in quantiles])
    by_family = family_tallies(reports)
    family_columns = ["family"] + [t.policy for t in tallies]
    family_rows = [[family] + [f"{met[t.policy]}/{count}" for t in tallies]
                   for family, (count, met) in by_family.items()]
    lines = []
    if markdown:
        lines += [head + ":", "", "| " + " | ".join(columns) + " |",
                  "|---|" + "---:|" * (len(columns) - 1)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        lines += ["", "The whole goal, per family:", "", "| " + " | ".join(family_columns) + " |",
                  "|---|" + "---:|" * (len(family_columns) - 1)]
        lines += ["| " + " | ".join(row) + " |" for row in family_rows]
        lines += ["", "flexiqd's worst cases:", ""]
        lines += [f"- {_describe(report)}" for report in worst(reports)]
    else:
        lines.append(f"== {head} ==")
        widths = [max(len(str(row[i])) for row in [columns] + rows) for i in range(len(columns))]
        for row in [columns] + rows:
            lines.append("  ".join(str(cell).rjust(w) if i else str(cell).ljust(w)
                                   for i, (cell, w) in enumerate(zip(row, widths))))
        lines += ["", "The whole goal, per family:"]
        widths = [max(len(str(row[i])) for row in [family_columns] + family_rows) for i in range(len(family_columns))]
        for row in [family_columns] + family_rows:
            lines.append("  ".join(str(cell).rjust(w) if i else str(cell).ljust(w)
                                   for i, (cell, w) in enumerate(zip(row, widths))))
        lines += ["", "flexiqd's worst cases:"]
        lines += [f"  {_describe(report)}" for report in worst(reports)]
    return "\n".join(lines) + "\n"


def random_json(reports: Sequence[TraceReport], seed: int, families: Sequence[str]) -> dict[str, Any]:
    return {
        "seed": seed, "families": list(families), "workloads": len(reports),
        "per_family": {family: {"workloads": count, "whole_goal": met}
                     for family, (count, met) in family_tallies(reports).items()},
        "policies": [{"policy": t.policy, "met": t.met, "whole_goal": t.all_met,
                      "cost_ratio": {"p10": t.ratio_at(0.1), "median": t.ratio_at(0.5), "p90": t.ratio_at(0.9),
                                     "max": t.ratio_at(1.0), "mean": statistics.fmean(t.ratios) if t.ratios else None}}
                     for t in tally(reports)],
        "flexiqd": [{"trace": r.trace.name, "goal": (lambda g: None if g is None else {
            "met": g.met, **{p: getattr(g, p) for p in PARTS}})(check_goal(r)),
            "slo_seconds": r.result(SUBJECT).slo_seconds, "oracle_slo_seconds": r.result(ORACLE).slo_seconds,
            "cost_ratio": r.cost_ratio(r.result(SUBJECT)), "killed": r.result(SUBJECT).killed,
            "over_capacity_seconds": r.result(SUBJECT).over_capacity_seconds} for r in reports],
    }
