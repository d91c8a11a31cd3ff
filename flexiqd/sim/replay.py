"""``bench replay``'s parts: a trace's jobs, time-compressed, through the real daemon on a real systemd.

    flexiq bench replay --trace FILE [--trace FILE ...] [--speed K] [--json | --markdown]

(the command itself is ``flexiqd.cli.bench``).  Every time in the trace is divided by
``K`` (arrivals, job durations, delays, the age target, the tick, the workers' cold
start and stop timeout), so a 30-minute trace runs in 3 minutes at ``--speed 10``.
The compressed trace is then run twice with the same pool policy:

- in the simulator (``flexiqd.policy.decide_fleet`` through the engine, as
  ``bench policies`` runs it), which gives the *simulated* row;
- through the real flexiqd and real ``flexiq-worker@replay-<n>.service`` units
  in a throw-away systemd container (the harness, ``bench/replay_machine.py`` of a
  source checkout, not installed): a driver inside enqueues each job of
  ``flexiqd.demo.sleep`` (``time.sleep``, blocking in C) at its compressed time,
  and the *measured* row is computed afterwards from the store (each job's
  first execution), the daemon's scale events and systemd's journal (when each
  worker unit was starting and stopped).

Both rows cover the trace's compressed duration from its time 0 and use the
simulator's definitions (``metrics.RunResult``): waits are ages at first start,
seconds over target are the time the oldest runnable job was older than the
age target, worker-seconds count booting, active and draining workers, scale
events are changes of the desired count.  Times are printed in the trace's own
seconds (measured seconds x K), so the rows read like ``bench policies``.

Traces whose jobs share a dependency (``dependency``) or are CPU-bound
(``workers.cpu_bound``) are refused: sleeping jobs cannot reproduce a
dependency's slowdown or a CPU signal.  This is a benchmark: its timings vary
with the machine's load, and no test depends on them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterable, Sequence

from ..policy import PoolPolicy, Targets
from .engine import FLAP_WINDOW, run
from .metrics import RunResult, percentile
from .policies import Flexiqd
from .trace import (
    Burst,
    Constant,
    Diurnal,
    Distribution,
    Exponential,
    LogNormal,
    Mixture,
    Source,
    Steady,
    Trace,
    realise,
)

DEFAULT_SPEED = 10.0
POOL = "replay"  # the pool's and its queue's name: units are flexiq-worker@replay-<n>.service
APP = "flexiqd.demo:queue"
STORE = "sqlite:////var/lib/flexiq/queue.db"
# The aim for a measured row: within this fraction of the simulated one on
# worker-seconds and wait p95.
DIVERGENCE_AIM = 0.15


# --- compressing a trace -----------------------------------------------------------------------


def compress_trace(trace: Trace, speed: float) -> Trace:
    """``trace`` with every time divided by ``speed`` (rates multiplied by it).

    Realising the compressed trace gives the original trace's jobs with their
    times divided by ``speed``: the generators draw the same numbers, and every
    sample scales linearly with its time parameters.
    """
    if not speed > 0 or not math.isfinite(speed):
        raise ValueError(f"speed must be a positive number, got {speed!r}")
    k = speed
    workers = replace(trace.workers, cold_start=trace.workers.cold_start / k,
                      stop_timeout=trace.workers.stop_timeout / k)
    sources = tuple(_compress_source(source, k) for source in trace.sources)
    return replace(trace, duration=trace.duration / k, tick_interval=trace.tick_interval / k,
                   target_age=trace.target_age / k, workers=workers, sources=sources)


def _compress_source(source: Source, k: float) -> Source:
    pattern = source.pattern
    if isinstance(pattern, Steady):
        pattern = Steady(rate=pattern.rate * k, start=pattern.start / k, end=pattern.end / k)
    elif isinstance(pattern, Diurnal):
        pattern = Diurnal(base=pattern.base * k, peak=pattern.peak * k, period=pattern.period / k,
                          phase=pattern.phase / k, start=pattern.start / k, end=pattern.end / k)
    elif isinstance(pattern, Burst):
        pattern = Burst(at=pattern.at / k, jobs=pattern.jobs, spread=pattern.spread / k)
    return replace(source, pattern=pattern, duration=_compress_duration(source.duration, k), delay=source.delay / k)


def _compress_duration(dist: Distribution, k: float) -> Distribution:
    if isinstance(dist, Constant):
        return Constant(dist.value / k)
    if isinstance(dist, LogNormal):
        return LogNormal(dist.median / k, dist.p99 / k)
    if isinstance(dist, Exponential):
        return Exponential(dist.mean / k)
    if isinstance(dist, Mixture):
        return Mixture(tuple((weight, _compress_duration(part, k)) for weight, part in dist.components))
    raise TypeError(f"unknown duration distribution {dist!r}")


def unreplayable(trace: Trace) -> str | None:
    """Why sleeping jobs cannot stand for this trace's jobs, or None when they can."""
    if trace.dependency is not None:
        return (f"its jobs share the dependency {trace.dependency.name!r}, whose slowdown sleeping jobs "
                "cannot reproduce")
    if trace.workers.cpu_bound:
        return "its workers are CPU-bound, and sleeping jobs give the CPU signal nothing to see"
    return None


# --- the pool, the same on both sides ----------------------------------------------------------


def replay_policy(compressed: Trace, speed: float) -> PoolPolicy:
    """The pool policy both the simulator and the daemon run for ``compressed``.

    flexiqd's defaults with the compressed age target: the lead time follows
    the target and the start cost (measured by the daemon, the trace's
    compressed cold start in the simulator).
    """
    spec = compressed.workers
    return PoolPolicy(min_workers=spec.min, max_workers=spec.max, cpu_bound=spec.cpu_bound,
                      targets=Targets(age=compressed.target_age))


def daemon_config(compressed: Trace, policy: PoolPolicy) -> str:
    """``/etc/flexiqd/flexiqd.yaml`` for the replay: one pool, the policy's options, nothing else.

    Options the simulator leaves at their defaults are left out here too, so
    the daemon runs its own defaults (whatever a newer policy makes them).
    """
    targets = f"age: {_seconds(policy.targets.age)}"
    return "\n".join([
        f"store: {STORE}",
        f"tick: {_seconds(compressed.tick_interval)}",
        "pools:",
        f"  {POOL}:",
        f"    app: {APP}",
        f"    queues: [{POOL}]",
        f"    concurrency: {compressed.workers.concurrency}",
        f"    min_workers: {policy.min_workers}",
        f"    max_workers: {policy.max_workers}",
        f"    drain_timeout: {_seconds(compressed.workers.stop_timeout)}",
        f"    targets: {{{targets}}}",
        "",
    ])


def _seconds(value: float) -> str:
    return f"{round(value * 1000)}ms"


class _ReplayFlexiqd(Flexiqd):
    """flexiqd's policy in the simulator, with the replay's pool policy."""

    def __init__(self, policy: PoolPolicy) -> None:
        super().__init__()
        self._replay_policy = policy

    def start(self, trace: Trace, sim: Any) -> None:
        super().start(trace, sim)
        self.policy = self._replay_policy


def simulate(compressed: Trace, policy: PoolPolicy) -> tuple[RunResult, tuple[str, ...]]:
    """The simulator's run of the compressed trace under ``policy``, and its decisions' lines.

    The simulator computes the policy's inputs as the store does (flexiqd/sim/metrics.py).
    """
    subject = _ReplayFlexiqd(policy)
    result = run(compressed, realise(compressed), subject)
    return result, tuple(subject.log)


# --- the jobs a driver enqueues ----------------------------------------------------------------


@dataclass(frozen=True)
class ScheduledJob:
    """One job of the replay: enqueue it ``enqueue_at`` seconds after time 0, runnable
    ``delay`` seconds later, sleeping ``duration`` seconds."""

    enqueue_at: float
    delay: float
    duration: float


def schedule(compressed: Trace) -> list[ScheduledJob]:
    """The compressed trace's jobs in enqueue order (the same jobs the simulator runs)."""
    workload = realise(compressed)
    jobs = [
        ScheduledJob(enqueued, runnable - enqueued, duration)
        for runnable, enqueued, duration in zip(workload.runnable_at, workload.enqueued_at,
                                                workload.base_duration)
    ]
    jobs.sort(key=lambda job: job.enqueue_at)
    return jobs


# --- the measured row --------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRecord:
    """One replayed job: runnable from ``runnable_at``, first started at ``started_at`` (None: never)."""

    runnable_at: float
    started_at: float | None


@dataclass(frozen=True)
class Recording:
    """What a replay left behind, in wall-clock seconds; the trace's time 0 is ``start``.

    ``worker_spans``: (starting, stopped) per worker unit activation, ``stopped``
    None while it still ran.  ``events``: (at, previous, desired) per scale event;
    ``decisions``: the same events as lines with their reasons, for reading.
    """

    start: float
    end: float
    jobs: tuple[JobRecord, ...]
    worker_spans: tuple[tuple[float, float | None], ...]
    events: tuple[tuple[float, int, int], ...]
    decisions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Row:
    """The figures compared, in seconds of the clock they were taken with."""

    worker_seconds: float
    wait_p50: float
    wait_p95: float
    wait_max: float
    slo_seconds: float
    scale_events: int
    flaps: int
    started: int

    @classmethod
    def from_result(cls, result: RunResult) -> "Row":
        return cls(worker_seconds=result.worker_seconds, wait_p50=result.wait_p50, wait_p95=result.wait_p95,
                   wait_max=result.wait_max, slo_seconds=result.slo_seconds, scale_events=result.scale_events,
                   flaps=result.flaps, started=len_started(result))

    def scaled(self, factor: float) -> "Row":
        """Times (and worker-seconds) multiplied by ``factor``: back to the trace's own seconds."""
        return replace(self, worker_seconds=self.worker_seconds * factor, wait_p50=self.wait_p50 * factor,
                       wait_p95=self.wait_p95 * factor, wait_max=self.wait_max * factor,
                       slo_seconds=self.slo_seconds * factor)


def len_started(result: RunResult) -> int:
    """Jobs that started in a simulated run (completed, running, or killed and not re-run yet)."""
    return result.completed + result.running


def measure(recording: Recording, target_age: float) -> Row:
    """The measured row, by the simulator's definitions, over [start, end) of the recording."""
    start, end = recording.start, recording.end
    waits = sorted(job.started_at - job.runnable_at for job in recording.jobs
                   if job.started_at is not None and job.started_at < end)
    worker_seconds = sum(
        max(0.0, min(end, stopped if stopped is not None else end) - max(start, starting))
        for starting, stopped in recording.worker_spans
    )
    events = sorted(event for event in recording.events if start <= event[0] < end)
    return Row(
        worker_seconds=worker_seconds,
        wait_p50=percentile(waits, 0.50) or 0.0,
        wait_p95=percentile(waits, 0.95) or 0.0,
        wait_max=waits[-1] if waits else 0.0,
        slo_seconds=seconds_over_target(recording.jobs, target_age, start, end),
        scale_events=len(events),
        flaps=count_flaps((at, desired - previous) for at, previous, desired in events),
        started=len(waits),
    )


def seconds_over_target(jobs: Iterable[JobRecord], target_age: float, start: float, end: float) -> float:
    """Time within [start, end) during which some job was runnable, not started, and older than the target.

    That is when the oldest runnable job is over the target: job j contributes
    (runnable_at + target, started_at), and the answer is the union's length.
    """
    spans = []
    for job in jobs:
        over_from = max(start, job.runnable_at + target_age)
        over_until = min(end, job.started_at if job.started_at is not None else end)
        if over_until > over_from:
            spans.append((over_from, over_until))
    spans.sort()
    total, reached = 0.0, start
    for low, high in spans:
        low = max(low, reached)
        if high > low:
            total += high - low
            reached = high
    return total


def count_flaps(changes: Iterable[tuple[float, int]]) -> int:
    """Direction reversals within ``FLAP_WINDOW`` of the previous change (the simulator's rule)."""
    flaps, last = 0, None
    for at, delta in changes:
        if delta == 0:
            continue
        direction = 1 if delta > 0 else -1
        if last is not None and last[1] != direction and at - last[0] < FLAP_WINDOW:
            flaps += 1
        last = (at, direction)
    return flaps


def worker_spans(entries: Iterable[dict[str, Any]], unit_prefix: str) -> list[tuple[float, float | None]]:
    """(starting, stopped) of each activation of the units named ``unit_prefix*``.

    ``entries``: systemd's own journal entries (``journalctl -o json _PID=1``),
    in order; a span opens at "Starting" and closes at the first of
    "Deactivated successfully", "Failed" or "Stopped" after it.
    """
    opened: dict[str, float] = {}
    spans: list[tuple[float, float | None]] = []
    for entry in entries:
        unit = entry.get("UNIT")
        if not isinstance(unit, str) or not unit.startswith(unit_prefix):
            continue
        message = entry.get("MESSAGE_ID")
        at = int(entry["__REALTIME_TIMESTAMP"]) / 1e6
        if message == _UNIT_STARTING:
            if unit not in opened:
                opened[unit] = at
        elif message in _UNIT_ENDED and unit in opened:
            spans.append((opened.pop(unit), at))
    spans.extend((at, None) for at in opened.values())
    return sorted(spans, key=lambda span: span[0])


# sd-messages.h: SD_MESSAGE_UNIT_STARTING, then SD_MESSAGE_UNIT_SUCCESS, _FAILED, _STOPPED.
_UNIT_STARTING = "7d4958e842da4a758f6c1cdc7b36dcc5"
_UNIT_ENDED = {"7ad2d189f7e94e70a38c781354912448", "d9b373ed55a64feb8242e02dbe79a49c",
               "9d1aaa27d60140bd96365438aad20286"}


def job_records(schedule_times: Sequence[tuple[int, float]],
                executions: Iterable[tuple[int, float | None]]) -> tuple[JobRecord, ...]:
    """Each enqueued job (id, runnable at) with its first execution's start (store's ``executions``).

    An execution without ``started_at`` (released before it ran) does not count as a start.
    """
    first: dict[int, float] = {}
    for job_id, started in executions:
        if started is not None and (job_id not in first or started < first[job_id]):
            first[job_id] = started
    return tuple(JobRecord(runnable, first.get(job_id)) for job_id, runnable in schedule_times)


# --- the comparison ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayResult:
    """One trace: the simulated and the measured row, in the trace's own seconds."""

    trace: str
    speed: float
    jobs: int
    simulated: Row
    measured: Row
    simulated_decisions: tuple[str, ...] = ()
    measured_decisions: tuple[str, ...] = ()

    def divergence(self, simulated_row: Row | None = None) -> dict[str, float | None]:
        """(measured - simulated) / simulated for each figure; None where the simulation has 0.

        Against the simulated row, or against ``simulated_row`` when given.
        """
        base = simulated_row or self.simulated
        out: dict[str, float | None] = {}
        for name in ("worker_seconds", "wait_p50", "wait_p95", "wait_max", "slo_seconds", "scale_events"):
            simulated, measured = getattr(base, name), getattr(self.measured, name)
            out[name] = None if simulated == 0 else (measured - simulated) / simulated
        return out

    def within_aim(self) -> bool:
        """Worker-seconds and wait p95 within ``DIVERGENCE_AIM`` of the simulation.

        A wait p95 under one second of the trace's time on both sides counts as
        met: at that size the difference is the workers' poll, not the policy.
        """
        ratios = self.divergence()
        cost = ratios["worker_seconds"]
        wait = ratios["wait_p95"]
        cost_ok = cost is not None and abs(cost) <= DIVERGENCE_AIM
        wait_ok = (wait is not None and abs(wait) <= DIVERGENCE_AIM) or max(
            self.simulated.wait_p95, self.measured.wait_p95) < 1.0
        return cost_ok and wait_ok

    def as_dict(self) -> dict[str, Any]:
        return {"trace": self.trace, "speed": self.speed, "jobs": self.jobs,
                "simulated": asdict(self.simulated), "measured": asdict(self.measured),
                "divergence": self.divergence(), "within_aim": self.within_aim(),
                "simulated_decisions": list(self.simulated_decisions),
                "measured_decisions": list(self.measured_decisions)}


_COLUMNS = (("", "{:<18}"), ("worker-s", "{:>9}"), ("wait p50", "{:>8}"), ("p95", "{:>7}"), ("max", "{:>7}"),
            ("over target", "{:>11}"), ("scale (flaps)", "{:>13}"), ("started", "{:>7}"))


def format_table(results: Sequence[ReplayResult]) -> str:
    """Per trace: the simulated row, the measured one, and their divergence (seconds of the trace)."""
    lines = []
    for result in results:
        lines.append(f"== {result.trace}: {result.jobs} jobs at speed {result.speed:g} "
                     f"(seconds below are the trace's: measured x {result.speed:g}) ==")
        lines.append(" ".join(fmt.format(title) for title, fmt in _COLUMNS))
        for label, row in _rows(result):
            cells = [label, f"{row.worker_seconds:.0f}", f"{row.wait_p50:.1f}", f"{row.wait_p95:.1f}",
                     f"{row.wait_max:.1f}", f"{row.slo_seconds:.0f}", f"{row.scale_events} ({row.flaps})",
                     str(row.started)]
            lines.append(" ".join(fmt.format(cell) for (_, fmt), cell in zip(_COLUMNS, cells)))
        for label, base in _bases(result):
            ratios = result.divergence(base)
            cells = [label] + [_percent(ratios[name]) for name in _FIGURES] + [""]
            lines.append(" ".join(fmt.format(cell) for (_, fmt), cell in zip(_COLUMNS, cells)))
        verdict = "within" if result.within_aim() else "NOT within"
        lines.append(f"aim (worker-seconds and wait p95 within {DIVERGENCE_AIM:.0%}): {verdict}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def format_markdown(results: Sequence[ReplayResult]) -> str:
    """The same comparison as Markdown: one table, two rows and a divergence row per trace."""
    lines = ["| trace (speed) | run | worker-s | wait p50 | p95 | max | over target | scale (flaps) | started |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for result in results:
        for label, row in _rows(result):
            lines.append(f"| {result.trace} ({result.speed:g}) | {label} | {row.worker_seconds:.0f} | {row.wait_p50:.1f} | "
                         f"{row.wait_p95:.1f} | {row.wait_max:.1f} | {row.slo_seconds:.0f} | "
                         f"{row.scale_events} ({row.flaps}) | {row.started} |")
        for label, base in _bases(result):
            ratios = result.divergence(base)
            if base is None:
                label += " (within aim)" if result.within_aim() else " (**not within aim**)"
            lines.append(f"| {result.trace} ({result.speed:g}) | {label} | " + " | ".join(
                _percent(ratios[name]) for name in _FIGURES) + " | |")
    return "\n".join(lines) + "\n"


def from_json(data: dict[str, Any]) -> list[ReplayResult]:
    """``to_json``'s output read back (to re-print recorded results)."""
    return [ReplayResult(trace=item["trace"], speed=item["speed"], jobs=item["jobs"],
                         simulated=Row(**item["simulated"]), measured=Row(**item["measured"]),
                         simulated_decisions=tuple(item.get("simulated_decisions", ())),
                         measured_decisions=tuple(item.get("measured_decisions", ())))
            for item in data["traces"]]


_FIGURES = ("worker_seconds", "wait_p50", "wait_p95", "wait_max", "slo_seconds", "scale_events")


def _bases(result: ReplayResult) -> list[tuple[str, Row | None]]:
    """The rows the measured one is compared with."""
    return [("measured/simulated", None)]


def _rows(result: ReplayResult) -> list[tuple[str, Row]]:
    return [("simulated", result.simulated), ("measured", result.measured)]


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:+.0%}"


def to_json(results: Sequence[ReplayResult]) -> dict[str, Any]:
    return {"divergence_aim": DIVERGENCE_AIM, "traces": [result.as_dict() for result in results]}
