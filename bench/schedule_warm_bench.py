"""A schedule that fires 1,000 jobs every 5 minutes, in the simulator: flexiqd with and without
workers started ahead of each firing, against the oracle.

The firings are jobs that become runnable at the slot with nothing in the store before it
(a schedule's task fanning out its batch), so the store's "jobs coming due" never sees
them: only the forecast does.  The forecast is built as the daemon builds it
(flexiqd.schedules.forecast): the next slot from the calendar, the size of a firing from
the rise of the queue's arrivals in the minute after each of the last ten slots (here the
simulated arrivals up to now), counted as jobs coming due within the lead time.

    .venv/bin/python bench/schedule_warm_bench.py [--json bench/results-schedule-warm.json]

Prints, per policy: seconds the oldest job was over the age target, the worst wait, the
worker-seconds against the oracle's, and per firing the worst wait of its jobs.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from dataclasses import replace

from flexiqd.schedules.forecast import FAN_OUT_WINDOW, Firing, Forecast, fan_out, jobs_coming_due, size
from flexiqd.sim.engine import run
from flexiqd.sim.oracle import Oracle
from flexiqd.sim.policies import Flexiqd, observation_from
from flexiqd.sim.trace import Burst, LogNormal, Source, Steady, Trace, Workers, realise
from flexiqd.policy import PoolInput, decide_fleet

PERIOD = 300.0       # a firing every 5 minutes
JOBS = 1000          # jobs per firing
FIRST = 120.0        # the first slot
DURATION = 1800.0    # half an hour: six firings


def warm_trace(seed: int = 25) -> Trace:
    slots = [FIRST + k * PERIOD for k in range(int((DURATION - FIRST) // PERIOD) + 1)]
    work = LogNormal(median=1.0, p99=4.0)
    sources = [Source(Steady(rate=2.0, start=0.0, end=DURATION), work, 0.0, "base")]
    sources += [Source(Burst(at=slot, jobs=JOBS, spread=2.0), work, 0.0, f"firing-{slot:g}") for slot in slots]
    return Trace(name="schedule-warm", description="1,000 jobs every 5 minutes from a schedule's fan-out",
                 seed=seed, duration=DURATION, tick_interval=1.0, target_age=10.0,
                 workers=Workers(concurrency=4, cold_start=1.0, min=1, max=200, initial=1, stop_timeout=60.0,
                                 cpu_per_slot=0.05, cpu_idle=0.02, cpu_bound=False),
                 sources=tuple(sources), dependency=None)


class FlexiqdWarm(Flexiqd):
    """flexiqd with the schedule's forecast folded in as the controller folds it."""

    name = "flexiqd-warm"

    def start(self, trace, sim):
        super().start(trace, sim)
        self.sim = sim
        self.runnable = sorted(self.workload.runnable_at)

    def forecast(self, now: float) -> Forecast | None:
        past = [FIRST + k * PERIOD for k in range(int(DURATION // PERIOD) + 1) if FIRST + k * PERIOD + FAN_OUT_WINDOW <= now]
        upcoming = [FIRST + k * PERIOD for k in range(int(DURATION // PERIOD) + 1) if FIRST + k * PERIOD > now]
        if not upcoming:
            return None
        arrivals: dict[int, int] = {}
        start = bisect.bisect_left(self.runnable, (past[-10:][0] if past else now) - FAN_OUT_WINDOW)
        for at in self.runnable[start:bisect.bisect_left(self.runnable, now)]:
            arrivals[int(at)] = arrivals.get(int(at), 0) + 1
        firings = [Firing(at=slot, jobs=max(1, fan_out(arrivals, slot)), seconds=None) for slot in past[-10:]]
        jobs, seconds, samples = size(firings)
        return Forecast(pool=self.trace.name, schedule="warm", at=upcoming[0], jobs=jobs, seconds=seconds,
                        samples=samples)

    def desired(self, snapshot):
        obs = observation_from(snapshot, self.trace)
        extra = jobs_coming_due(self.forecast(snapshot.now), snapshot.now, self.sim.coming_due_within)
        if extra:
            obs = replace(obs, metrics=replace(obs.metrics, coming_due=obs.metrics.coming_due + extra))
        pool = PoolInput(observation=obs, policy=self.policy, history=self.history)
        decision = decide_fleet([pool], self.dependencies, snapshot.now)[self.trace.name]
        self.history = decision.history
        return decision.desired


def slots() -> list[float]:
    return [FIRST + k * PERIOD for k in range(int((DURATION - FIRST) // PERIOD) + 1)]


def worst_age_per_firing(result) -> list[float]:
    """Per firing, the oldest runnable job's worst age in the minute after its slot (sampled)."""
    return [max((p.oldest_age for p in result.timeline if slot <= p.at < slot + 60.0), default=0.0)
            for slot in slots()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    trace = warm_trace()
    workload = realise(trace)
    rows = {}
    for policy in (Flexiqd(), FlexiqdWarm(), Oracle()):
        if isinstance(policy, FlexiqdWarm):
            policy.workload = workload
        result = run(trace, workload, policy)
        rows[policy.name] = result
    oracle = rows["oracle"]
    out = {}
    print(f"{'policy':<14} {'over target s':>13} {'wait p95':>8} {'wait max':>8} {'worker-s':>9} {'x oracle':>8}")
    for name, result in rows.items():
        ratio = result.worker_seconds / oracle.worker_seconds
        print(f"{name:<14} {result.slo_seconds:>13.1f} {result.wait_p95:>8.2f} {result.wait_max:>8.2f} "
              f"{result.worker_seconds:>9.0f} {ratio:>8.2f}")
        per_firing = worst_age_per_firing(result)
        print(f"{'':<14} worst age per firing: {', '.join(f'{age:.1f}' for age in per_firing)}")
        out[name] = {"slo_seconds": result.slo_seconds, "wait_p95": result.wait_p95, "wait_max": result.wait_max,
                     "worker_seconds": result.worker_seconds, "x_oracle": ratio,
                     "worst_age_per_firing": per_firing}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"trace": {"period": PERIOD, "jobs": JOBS, "target_age": trace.target_age,
                                 "cold_start": trace.workers.cold_start, "duration": DURATION},
                       "results": out}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
