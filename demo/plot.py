"""The picture of one demo run: workers, runnable jobs and the oldest job's age over time, decisions marked.

Pure apart from writing the file: it takes the samples the demo recorded and
knows nothing of systemd or the queue.  matplotlib draws with its Agg backend,
so no display is needed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

WIDTH, HEIGHT, DPI = 1000, 700, 100  # pixels of the PNG


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


def draw(samples: Sequence[Sample], decisions: Sequence[ScaleDecision], path: Path, *, target_age: float,
         title: str) -> Path:
    """Write the PNG (``WIDTH`` x ``HEIGHT`` pixels) to ``path`` and return it."""
    import matplotlib  # imported here: the demo's text view needs none of it

    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.ticker import MaxNLocator

    times = [s.at for s in samples]
    figure, (workers, backlog, age) = pyplot.subplots(3, 1, figsize=(WIDTH / DPI, HEIGHT / DPI), sharex=True,
                                                      gridspec_kw={"height_ratios": (1.2, 1, 1)})
    workers.step(times, [s.workers for s in samples], where="post", color="tab:blue", linewidth=1.8,
                 label="worker units")
    for decision in decisions:
        colour = "tab:green" if decision.desired > decision.previous else "tab:red"
        for axes in (workers, backlog, age):
            axes.axvline(decision.at, color=colour, linewidth=0.7, alpha=0.5)
        workers.annotate(f"{decision.previous}\u2192{decision.desired}", (decision.at, decision.desired),
                         textcoords="offset points", xytext=(2, 4), fontsize=7, color=colour)
    workers.set_ylabel("workers")
    workers.yaxis.set_major_locator(MaxNLocator(integer=True))
    workers.set_ylim(bottom=0, top=max([s.workers for s in samples] + [d.desired for d in decisions] + [1]) * 1.25)
    workers.plot([], [], color="tab:green", linewidth=0.7, label="scale-up decision")
    workers.plot([], [], color="tab:red", linewidth=0.7, label="scale-in decision")
    workers.legend(loc="upper right", fontsize="small")

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
    age.set_xlabel("seconds since the burst was enqueued")
    age.legend(loc="upper right", fontsize="small")

    workers.set_title(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI)
    pyplot.close(figure)
    return path
