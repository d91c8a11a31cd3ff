"""The picture of one demo run: workers, runnable jobs and the oldest job's age over time, decisions marked,
and the start chain of each worker the burst brought (unit started, ready, first job).

Pure apart from writing the file: it takes the samples the demo recorded and
knows nothing of systemd or the queue.  matplotlib draws with its Agg backend,
so no display is needed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

WIDTH, HEIGHT, DPI = 1000, 900, 100  # pixels of the PNG


@dataclasses.dataclass(frozen=True)
class Sample:
    """What the demo saw at ``at`` seconds after the burst was enqueued."""

    at: float
    workers: int            # active worker units
    runnable: int           # jobs waiting to be claimed
    running: int            # jobs being run
    oldest_age: float       # seconds the oldest runnable job has waited
    completion_rate: float  # jobs finished per second


@dataclasses.dataclass(frozen=True)
class ScaleDecision:
    """One of flexiqd's scale decisions, read from the journal's fields."""

    at: float
    previous: int
    desired: int
    reason: str
    rationale: str = ""


@dataclasses.dataclass(frozen=True)
class WorkerStart:
    """The start chain of one worker the burst brought, in seconds after the burst (None: not seen)."""

    worker: str                # its instance, "default-3"
    started_at: float | None   # systemd started the unit
    ready_at: float | None     # systemd took the worker's READY=1 (busy starting others, it may read it late)
    first_job_at: float        # it claimed its first job


def draw(samples: Sequence[Sample], decisions: Sequence[ScaleDecision], path: Path, *, target_age: float,
         title: str, starts: Sequence[WorkerStart] = (), chain: str = "") -> Path:
    """Write the PNG (``WIDTH`` x ``HEIGHT`` pixels) to ``path`` and return it.

    ``starts``: the new workers' start chains, drawn one row each in the bottom
    panel; ``chain``: the line that sums them up (chain.chain_summary), written there.
    """
    import matplotlib  # imported here: the demo's text view needs none of it

    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.ticker import MaxNLocator

    times = [s.at for s in samples]
    figure, (workers, backlog, age, starting) = pyplot.subplots(
        4, 1, figsize=(WIDTH / DPI, HEIGHT / DPI), sharex=True, gridspec_kw={"height_ratios": (1.2, 1, 1, 1.1)})
    panels = (workers, backlog, age, starting)
    for axes in panels:
        axes.axvline(0, color="black", linewidth=1.0)  # the burst: every time is counted from its commit
    workers.step(times, [s.workers for s in samples], where="post", color="tab:blue", linewidth=1.8,
                 label="worker units")
    for decision in decisions:
        colour = "tab:green" if decision.desired > decision.previous else "tab:red"
        for axes in panels:
            axes.axvline(decision.at, color=colour, linewidth=0.7, alpha=0.5)
        workers.annotate(f"{decision.previous}\u2192{decision.desired}", (decision.at, decision.desired),
                         textcoords="offset points", xytext=(2, 4), fontsize=7, color=colour)
    workers.set_ylabel("workers")
    workers.yaxis.set_major_locator(MaxNLocator(integer=True))
    workers.set_ylim(bottom=0, top=max([s.workers for s in samples] + [d.desired for d in decisions] + [1]) * 1.25)
    workers.plot([], [], color="black", linewidth=1.0, label="burst committed")
    workers.plot([], [], color="tab:green", linewidth=0.7, label="scale-up decision")
    workers.plot([], [], color="tab:red", linewidth=0.7, label="scale-in decision")
    # One row across the top: the scale-in decisions at the right end stay readable.
    workers.legend(loc="upper center", ncol=4, fontsize="small")

    backlog.plot(times, [s.runnable for s in samples], color="tab:orange", label="runnable")
    backlog.plot(times, [s.running for s in samples], color="tab:purple", label="running")
    backlog.set_ylabel("jobs")
    backlog.yaxis.set_major_locator(MaxNLocator(integer=True))
    backlog.set_ylim(bottom=0)
    backlog.legend(loc="upper right", fontsize="small")

    age.plot(times, [s.oldest_age for s in samples], color="tab:brown", label="oldest runnable job")
    age.axhline(target_age, color="black", linewidth=0.8, linestyle="--", label=f"target {target_age:g}s")
    age.set_ylabel("age (s)")
    age.set_ylim(bottom=0)
    age.legend(loc="upper right", fontsize="small")

    _draw_starts(starting, starts, chain)
    starting.set_xlabel("seconds since the burst was enqueued")

    workers.set_title(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI)
    pyplot.close(figure)
    return path


def _draw_starts(axes, starts: Sequence[WorkerStart], chain: str) -> None:
    """One row per new worker, first to claim at the bottom: a line from its unit's start
    to its first job, a ring where it became ready, a triangle at the first job."""
    from matplotlib.ticker import MaxNLocator

    rows = range(1, len(starts) + 1)
    for row, start in zip(rows, starts):
        begin = start.started_at if start.started_at is not None else start.first_job_at
        axes.plot([begin, start.first_job_at], [row, row], color="tab:gray", linewidth=1.0)
    axes.plot([s.started_at for s in starts if s.started_at is not None],
              [r for r, s in zip(rows, starts) if s.started_at is not None], "|", color="tab:gray",
              markersize=7, label="unit started")
    axes.plot([s.ready_at for s in starts if s.ready_at is not None],
              [r for r, s in zip(rows, starts) if s.ready_at is not None], "o", color="tab:blue",
              markerfacecolor="none", markersize=5, label="ready (READY=1)")
    axes.plot([s.first_job_at for s in starts], list(rows), "^", color="tab:green", markersize=6,
              label="first job claimed")
    if starts:
        # The number a waiting user feels: from the burst's commit to a new worker's first job.
        first = starts[0].first_job_at
        axes.annotate("", xy=(first, -0.6), xytext=(0, -0.6), arrowprops={"arrowstyle": "<->", "color": "black"})
        axes.annotate(f"burst \u2192 first job {first:.2f}s", xy=(first, -0.6), xytext=(6, 0),
                      textcoords="offset points", va="center", fontsize=8)
    axes.set_ylabel("new workers")
    axes.set_ylim(-1.6, len(starts) * 1.3 + 2)  # room for the arrow below, the summary line above
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.text(0.01, 0.96, chain or "no worker was started by the burst", transform=axes.transAxes,
              fontsize=8, va="top")
    axes.legend(loc="lower right", fontsize="small")
