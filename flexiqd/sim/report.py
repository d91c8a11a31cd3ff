"""Presenting benchmark runs: a text table, JSON, and one plot per trace."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .metrics import RunResult
from .trace import Trace

COST_GOAL = 1.25  # flexiqd's worker-seconds may be at most this many times the oracle's
# Seconds over the age target may be at most this many times the oracle's, plus SLO_SLACK.
SLO_FACTOR, SLO_SLACK = 1.1, 5.0
# Over an undeclared ceiling: at most this share of the time KEDA's depth rule spends over it.
UNDECLARED_SHARE = 0.25
# A job's completion time (runnable -> done), p95: at most this many times the oracle's plus one tick.
COMPLETION_FACTOR = 1.25
# The request path's latency inflation (time-weighted mean): at most this many times the oracle's.
INFLATION_FACTOR = 1.5
SUBJECT = "flexiqd"
ORACLE = "oracle"
KEDA = "keda-depth"


@dataclass(frozen=True)
class TraceReport:
    """Every policy's run on one trace."""

    trace: Trace
    results: tuple[RunResult, ...]

    def result(self, policy: str) -> RunResult | None:
        for result in self.results:
            if result.policy == policy:
                return result
        return None

    def cost_ratio(self, result: RunResult) -> float | None:
        oracle = self.result(ORACLE)
        if oracle is None or oracle.worker_seconds <= 0:
            return None
        return result.worker_seconds / oracle.worker_seconds


@dataclass(frozen=True)
class GoalCheck:
    """flexiqd against the goal on one trace.

    ``age``: seconds with the oldest job over target at most ``SLO_FACTOR`` x the
    oracle's + ``SLO_SLACK``;
    ``dependency``: never over a declared dependency's capacity (unless the oracle is too:
    a pool whose fewest workers' jobs alone exceed it, and then no longer than the oracle);
    over an undeclared one at most ``UNDECLARED_SHARE`` of the time KEDA's depth rule is;
    ``cost``: at most ``COST_GOAL`` times the oracle's worker-seconds;
    ``killed``: no busy worker killed (its stop timeout ran out);
    ``completion``: the jobs' completion time p95 at most ``COMPLETION_FACTOR`` x the
    oracle's plus one tick (what the oldest runnable job's age misses: a job claimed by a
    worker that cannot make progress still waits);
    ``requests``: with a dependency, the request path's mean latency inflation at most
    ``INFLATION_FACTOR`` x the oracle's.
    """

    age: bool
    dependency: bool
    cost: bool
    killed: bool
    completion: bool = True
    requests: bool = True

    @property
    def met(self) -> bool:
        return self.age and self.dependency and self.cost and self.killed and self.completion and self.requests

    def shortfalls(self) -> list[str]:
        names = {"age": "age target", "dependency": "dependency capacity", "cost": "cost",
                 "killed": "busy workers killed", "completion": "completion time", "requests": "request path"}
        return [label for key, label in names.items() if not getattr(self, key)]


def check_goal(report: TraceReport, policy: str = SUBJECT) -> GoalCheck | None:
    """``policy`` (flexiqd's by default) against the goal; None when the run lacks it or the oracle."""
    subject, oracle = report.result(policy), report.result(ORACLE)
    ratio = report.cost_ratio(subject) if subject else None
    if subject is None or oracle is None or ratio is None:
        return None
    dep = report.trace.dependency
    keda = report.result(KEDA)
    if dep is not None and not dep.declared and keda is not None:
        dependency = subject.over_capacity_seconds <= UNDECLARED_SHARE * keda.over_capacity_seconds + 1e-6
    else:
        dependency = subject.over_capacity_seconds <= oracle.over_capacity_seconds + 1e-6
    requests = True
    if subject.inflation_mean is not None and oracle.inflation_mean is not None:
        requests = subject.inflation_mean <= INFLATION_FACTOR * oracle.inflation_mean + 1e-6
    return GoalCheck(
        age=subject.slo_seconds <= SLO_FACTOR * oracle.slo_seconds + SLO_SLACK + 1e-6,
        dependency=dependency,
        cost=ratio <= COST_GOAL,
        killed=subject.killed == 0,
        completion=subject.completion_p95 <= (COMPLETION_FACTOR * oracle.completion_p95
                                              + report.trace.tick_interval + 1e-6),
        requests=requests,
    )


_COLUMNS = (
    ("policy", "{:<13}"), ("wait p50", "{:>8}"), ("p95", "{:>7}"), ("max", "{:>7}"), ("SLO lost", "{:>8}"),
    ("dep over", "{:>8}"), ("req infl", "{:>8}"), ("worker-s", "{:>9}"), ("x oracle", "{:>8}"),
    ("scale (flaps)", "{:>13}"), ("killed", "{:>6}"),
)


def format_table(reports: Sequence[TraceReport]) -> str:
    """Per trace, one row per policy, then flexiqd's goal check."""
    lines = []
    for report in reports:
        trace = report.trace
        lines.append(f"== {trace.name}: age target {trace.target_age:g}s, seed {trace.seed}, "
                     f"{trace.duration:g}s simulated ==")
        lines.append(" ".join(fmt.format(title) for title, fmt in _COLUMNS))
        for result in report.results:
            cells = _row(report, result)
            lines.append(" ".join(fmt.format(cell) for (_, fmt), cell in zip(_COLUMNS, cells)))
        goal = check_goal(report)
        if goal is not None:
            verdict = "met" if goal.met else "NOT met (" + ", ".join(goal.shortfalls()) + ")"
            lines.append(f"goal: {verdict}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def format_markdown(reports: Sequence[TraceReport]) -> str:
    """The same table in Markdown, one table per trace."""
    lines = []
    for report in reports:
        trace = report.trace
        lines.append(f"#### {trace.name} (age target {trace.target_age:g} s)")
        lines.append("")
        lines.append("| " + " | ".join(title for title, _ in _COLUMNS) + " |")
        lines.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(_COLUMNS))) + "|")
        for result in report.results:
            lines.append("| " + " | ".join(_row(report, result)) + " |")
        goal = check_goal(report)
        if goal is not None:
            lines.append("")
            lines.append("Goal: " + ("met." if goal.met else "**not met**: " + ", ".join(goal.shortfalls()) + "."))
        lines.append("")
    return "\n".join(lines)


def _row(report: TraceReport, result: RunResult) -> list[str]:
    ratio = report.cost_ratio(result)
    return [
        result.policy,
        f"{result.wait_p50:.1f}",
        f"{result.wait_p95:.1f}",
        f"{result.wait_max:.1f}",
        f"{result.slo_seconds:.0f}",
        f"{result.over_capacity_seconds:.0f}" if report.trace.dependency else "-",
        f"{result.inflation_p95:.2f}" if result.inflation_p95 is not None else "-",
        f"{result.worker_seconds:.0f}",
        f"{ratio:.2f}" if ratio is not None else "-",
        f"{result.scale_events} ({result.flaps})",
        str(result.killed),
    ]


def to_json(reports: Sequence[TraceReport]) -> dict[str, Any]:
    """Every result (without timelines), cost ratios, and flexiqd's goal check per trace."""
    traces = []
    for report in reports:
        goal = check_goal(report)
        traces.append({
            "trace": report.trace.name,
            "seed": report.trace.seed,
            "target_age": report.trace.target_age,
            "duration": report.trace.duration,
            "results": [
                dict(result.as_dict(), cost_ratio=report.cost_ratio(result)) for result in report.results
            ],
            "goal": None if goal is None else {
                "met": goal.met, "age": goal.age, "dependency": goal.dependency, "cost": goal.cost,
                "killed": goal.killed, "completion": goal.completion, "requests": goal.requests,
            },
        })
    return {"cost_goal": COST_GOAL, "traces": traces}


def plot_trace(report: TraceReport, path: Path) -> None:
    """One PNG: oldest job age, workers and dependency load over time, every policy."""
    import matplotlib  # imported here: nothing else in the simulator needs it

    matplotlib.use("Agg")
    from matplotlib import pyplot

    trace = report.trace
    rows = 3 if trace.dependency else 2
    figure, axes = pyplot.subplots(rows, 1, figsize=(10, 2.6 * rows + 0.6), sharex=True)
    for result in report.results:
        times = [point.at for point in result.timeline]
        style = {"linewidth": 1.6 if result.policy in (SUBJECT, ORACLE) else 0.9,
                 "linestyle": ":" if result.policy == ORACLE else "-"}
        axes[0].plot(times, [p.oldest_age for p in result.timeline], label=result.policy, **style)
        axes[1].plot(times, [p.workers for p in result.timeline], label=result.policy, **style)
        if trace.dependency:
            axes[2].plot(times, [p.dependency_utilisation or 0 for p in result.timeline], label=result.policy, **style)
    axes[0].axhline(trace.target_age, color="black", linewidth=0.8, linestyle="--")
    axes[0].set_ylabel("oldest job age (s)")
    axes[0].set_yscale("symlog", linthresh=max(1.0, trace.target_age))
    axes[0].set_ylim(bottom=0)
    axes[1].set_ylabel("workers")
    if trace.dependency:
        axes[2].axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        axes[2].set_ylabel(f"{trace.dependency.name} load / capacity")
    axes[-1].set_xlabel("time (s)")
    axes[0].legend(loc="upper right", fontsize="small", ncol=3)
    axes[0].set_title(f"{trace.name}: age target {trace.target_age:g}s (dashed)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    pyplot.close(figure)
