"""Reading the executions a test app recorded, and judging them: lost, duplicated, overlapping.

Pure functions over the ``start``/``end`` lines written by tests/apps/chaos_app.py
(``<what> <job> <attempt> <pid> <epoch>``), so the judgement is tested on its own.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Iterable


@dataclasses.dataclass(frozen=True)
class Execution:
    job: int
    pid: int
    started: float
    ended: float | None      # None: the process died before the task's end


@dataclasses.dataclass(frozen=True)
class Verdict:
    jobs: int                              # distinct jobs that ran
    executions: int
    duplicated_by_crash: dict[int, int]    # killed pid -> jobs it had started that ran again
    duplicated_otherwise: list[int]        # jobs run twice where no killed worker explains it
    overlapping: list[int]                 # jobs two live executions ran at the same time

    @property
    def crash_duplicates(self) -> int:
        return sum(self.duplicated_by_crash.values())


def parse(text: str) -> list[Execution]:
    """Executions from the marks' lines; an end is matched to the start of the same job and pid."""
    open_starts: dict[tuple[int, int], list[float]] = collections.defaultdict(list)
    done: list[Execution] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 5:
            continue
        what, job, _attempt, pid, at = parts
        key = (int(job), int(pid))
        if what == "start":
            open_starts[key].append(float(at))
        elif what == "end" and open_starts[key]:
            done.append(Execution(key[0], key[1], open_starts[key].pop(0), float(at)))
    cut = [Execution(job, pid, at, None) for (job, pid), starts in open_starts.items() for at in starts]
    return sorted(done + cut, key=lambda e: (e.job, e.started))


def judge(executions: Iterable[Execution], killed: dict[int, float]) -> Verdict:
    """``killed``: pid -> when it was SIGKILLed.  A re-run is a crash's only if every earlier
    execution of that job was by a killed process that never reached the task's end."""
    by_job: dict[int, list[Execution]] = collections.defaultdict(list)
    count = 0
    for execution in executions:
        by_job[execution.job].append(execution)
        count += 1
    by_crash: dict[int, int] = collections.Counter()
    otherwise, overlapping = [], []
    for job, runs in by_job.items():
        if len(runs) > 1:
            earlier = runs[:-1]
            if all(run.pid in killed for run in earlier):
                for run in earlier:
                    by_crash[run.pid] += 1
            else:
                otherwise.append(job)
        for first, second in zip(runs, runs[1:]):
            first_end = first.ended if first.ended is not None else killed.get(first.pid)
            if first_end is None or second.started < first_end:
                overlapping.append(job)
                break
    return Verdict(jobs=len(by_job), executions=count, duplicated_by_crash=dict(by_crash),
                   duplicated_otherwise=sorted(otherwise), overlapping=sorted(overlapping))
