"""The schedules' firing loop: every due slot decided, on a thread of its own.

A pass reads each schedule's newest ledger slot from the store (never from this
daemon's memory), plans the slots due since (``schedules.plan``) and writes each
decision in its own transaction with the slot's ledger row
(``Backend.fire_slot``).  Any number of daemons on one store may run passes at
once: the ledger's key decides which one wrote a slot, and a daemon that finds a
slot taken plans again from the store.  A daemon killed mid-pass leaves its
undecided slots to the next pass, its own after a restart or another host's.

The loop sleeps until the next slot of any schedule, at most ``MAX_WAIT`` (so a
step of the wall clock is noticed within it), and wakes at once on a reload or a
``flexiqctl schedule`` order.  A failing store is retried every ``MAX_WAIT``:
the slots wait in the calendar, not in memory.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from datetime import datetime, timezone
from typing import Callable, Mapping

from ..config.model import ScheduleConfig
from ..errors import FlexiqdError, JobNotFound, QueueError
from ..logs import MessageId, journal
from ..queue.store.backend import Backend
from ..queue.schedules import FIRED, SLOT, ScheduleRecord, SlotDecision, SlotOutcome
from ..schedules.forecast import FAN_OUT_WINDOW, SAMPLE, Forecast, fan_out, firings_from, pool_forecasts
from ..schedules.plan import next_fire, plan
from ..schedules.words import MISSED, OVERLAP, PAUSED

log = logging.getLogger(__name__)

# The longest sleep between passes: how soon a clock step or a store back up is noticed.
MAX_WAIT = 5.0
# Passes in a row that found slots taken by another daemon before this one waits anyway.
MAX_REPLANS = 20
# How often the ledger is pruned (of rows past the catch-up horizon).
PRUNE_EVERY = 3600.0
# How long the store keeps the queues' per-second arrivals (Backend.arrivals_since: an hour).
ARRIVALS_KEPT = 3600.0


@dataclasses.dataclass(frozen=True)
class ScheduleView:
    """One schedule as ``flexiqctl schedules`` shows it: its config, what the store holds
    of it (None before its first pass), and its next slot (None: unknown yet)."""

    config: ScheduleConfig
    record: ScheduleRecord | None
    next_fire: float | None


@dataclasses.dataclass
class Counters:
    """What this daemon decided since it started, per schedule (the metrics' counters)."""

    fired: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    late: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # fired later than max_delay
    runs: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # flexiqctl schedule run
    skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # (schedule, reason)

    def document(self) -> dict:
        return {"fired": dict(self.fired), "late": dict(self.late), "runs": dict(self.runs),
                "skipped": {f"{name}:{reason}": n for (name, reason), n in sorted(self.skipped.items())}}


class ScheduleFirer:
    """Fires the schedules of ``schedules()`` (the config in force) into ``backend``.

    Thread-safe: ``views``, ``counters``, ``wake``, ``run_now`` and ``pause`` may be
    called from any thread; the passes run on the firer's own thread (or on the
    caller's, for ``pass_once`` in tests), one at a time.
    """

    def __init__(self, backend: Backend, host: str, schedules: Callable[[], Mapping[str, ScheduleConfig]], *,
                 clock: Callable[[], float] | None = None, store_clock: Callable[[], float] | None = None) -> None:
        self.backend = backend
        self.host = host
        self._schedules = schedules
        # Slots are wall-clock times by nature (a calendar): planned on the wall clock.  The jobs
        # they enqueue are stamped in the store's time, as every job is (``Backend.clock``), so
        # a wall clock stepped away from it does not make them wait or run early.
        self._clock = clock or time.time
        self._store_clock = store_clock or clock or backend.clock
        self._lock = threading.Lock()      # the pass, and what it publishes
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._registered: frozenset[str] = frozenset()
        self._records: dict[str, ScheduleRecord] = {}
        self._next: dict[str, float] = {}
        self._pruned = float("-inf")
        self._failing = False
        self.counters = Counters()

    # -- one pass -------------------------------------------------------------------------------

    def pass_once(self, now: float | None = None) -> list[SlotOutcome]:
        """Decide every slot due at ``now`` (the clock's by default); what this daemon decided.
        QueueError when the store fails (nothing is lost: the next pass decides the rest)."""
        store_now = self._store_clock() if now is None else now
        now = self._clock() if now is None else now
        with self._lock:
            schedules = dict(self._schedules())
            decided: list[SlotOutcome] = []
            for _ in range(MAX_REPLANS):
                outcomes, taken = self._pass(schedules, now, store_now)
                decided += outcomes
                if not taken:
                    break
            if now - self._pruned >= PRUNE_EVERY or now < self._pruned:
                self._pruned = now
                self.backend.prune_ledger(now=now)
            return decided

    def _pass(self, schedules: Mapping[str, ScheduleConfig], now: float,
              store_now: float) -> tuple[list[SlotOutcome], bool]:
        """One plan per schedule at ``now`` (wall) and its decisions, stamped ``store_now``; and
        whether a slot was found taken."""
        names = frozenset(schedules)
        if not names:
            self._records, self._next = {}, {}
            return [], False
        if not names <= self._registered:
            self.backend.ensure_schedules(sorted(names), now=now)
            self._registered = names
        records = self.backend.schedule_records(sorted(names))
        outcomes: list[SlotOutcome] = []
        taken = False
        for name, schedule in sorted(schedules.items()):
            record = records.get(name)
            cursor = record.cursor if record is not None else now
            for planned in plan(schedule.calendar, schedule.catch_up, cursor, now):
                decision = SlotDecision(schedule=name, at=planned.at, job=schedule.new_job(planned.at), skip=planned.skip,
                                        slots=planned.slots, overlap_skip=schedule.catch_up.overlap == "skip",
                                        late=planned.late)
                outcome = self.backend.fire_slot(decision, host=self.host, now=store_now)
                if outcome is None:  # another daemon decided it: plan again from the store
                    taken = True
                    break
                outcomes.append(outcome)
                self._count(outcome, schedule, now)
        if outcomes:
            records = self.backend.schedule_records(sorted(names))
        self._records = records
        self._next = {name: next_fire(schedule.calendar, records[name].cursor if name in records else now, now)
                      for name, schedule in schedules.items()}
        return outcomes, taken

    def _count(self, outcome: SlotOutcome, schedule: ScheduleConfig, now: float) -> None:
        slot = datetime.fromtimestamp(outcome.at, timezone.utc).isoformat()
        if outcome.outcome == FIRED:
            self.counters.fired[outcome.schedule] += 1
            self.counters.late[outcome.schedule] += int(outcome.late)
            log.info("Schedule %s fired its slot %s: job %s in queue %s (%.1fs after the slot%s).",
                     outcome.schedule, slot, outcome.job_id, schedule.queue, now - outcome.at,
                     ", later than max_delay: caught up" if outcome.late else "",
                     extra=journal(MessageId.SCHEDULE_FIRED, SCHEDULE=outcome.schedule, SLOT=slot, KIND="slot",
                                   JOB_ID=outcome.job_id, QUEUE=schedule.queue, LATE_SEC=f"{now - outcome.at:.3f}"))
            return
        reason = outcome.reason or MISSED
        self.counters.skipped[(outcome.schedule, reason)] += outcome.slots
        why = {MISSED: f"missed by more than max_delay (catch_up: {schedule.catch_up.catch_up})",
               OVERLAP: "the job of the slot before is still queued or running (overlap: skip)",
               PAUSED: "the schedule is paused"}.get(reason, reason)
        what = f"{outcome.slots} slots up to {slot}" if outcome.slots > 1 else f"its slot {slot}"
        log.log(logging.WARNING if reason == MISSED else logging.INFO, "Schedule %s skipped %s: %s.",
                outcome.schedule, what, why,
                extra=journal(MessageId.SCHEDULE_SKIPPED, SCHEDULE=outcome.schedule, SLOT=slot, REASON=reason,
                              SLOTS=outcome.slots))

    # -- orders (any thread) --------------------------------------------------------------------

    def run_now(self, name: str) -> int:
        """``flexiqctl schedule run``: enqueue the schedule's job now, outside its slots; its id.
        KeyError for a schedule not configured."""
        schedule = self._schedules()[name]
        now = self._clock()
        job_id = self.backend.run_schedule(name, schedule.new_job(), host=self.host, now=self._store_clock())
        with self._lock:
            self.counters.runs[name] += 1
        log.info("Schedule %s run by an operator: job %s in queue %s.", name, job_id, schedule.queue,
                 extra=journal(MessageId.SCHEDULE_FIRED, SCHEDULE=name, KIND="run", JOB_ID=job_id,
                               QUEUE=schedule.queue, SLOT=datetime.fromtimestamp(now, timezone.utc).isoformat()))
        self.wake()
        return job_id

    def pause(self, name: str, paused: bool) -> bool:
        """Pause or resume the schedule in the store (every host); whether that changed it.
        KeyError for a schedule not configured."""
        self._schedules()[name]
        changed = self.backend.pause_schedule(name, paused, now=self._clock())
        self.wake()
        return changed

    # -- reads (any thread) ---------------------------------------------------------------------

    def views(self) -> dict[str, ScheduleView]:
        """Every configured schedule as the last pass saw it, by name."""
        schedules = self._schedules()
        records, upcoming = self._records, self._next  # replaced whole by a pass, never changed
        return {name: ScheduleView(config=schedule, record=records.get(name), next_fire=upcoming.get(name))
                for name, schedule in sorted(schedules.items())}

    def forecasts(self, pool_queues: Mapping[str, tuple[str, ...]], now: float | None = None) -> dict[str, Forecast]:
        """Per pool, its next firing and the measured size of the past ones (schedules.forecast),
        read from the ledger, the slots' jobs and the queues' arrivals (blocking: store reads)."""
        now = self._clock() if now is None else now
        upcoming = {name: (view.config.queue, view.next_fire) for name, view in self.views().items()
                    if not (view.record is not None and view.record.paused)}
        history = {}
        for name, (queue, _at) in upcoming.items():
            rows = []
            for row in self.backend.schedule_ledger(name, limit=4 * SAMPLE):
                if row.kind != SLOT or row.outcome != FIRED or row.job_id is None:
                    continue
                try:
                    job = self.backend.get(row.job_id)
                    rows.append((row.at, row.job_id, job.started_at, job.finished_at))
                except JobNotFound:  # deleted by retention: the firing counts, its time is unknown
                    rows.append((row.at, row.job_id, None, None))
            history[name] = firings_from(rows, self._fanned_out(queue, [row[0] for row in rows], now))
        return pool_forecasts(pool_queues, upcoming, history)

    def _fanned_out(self, queue: str, slots: list[float], now: float) -> dict[float, int]:
        """Per slot whose window has passed and whose arrivals the store still keeps, the jobs it
        brought to ``queue`` (``forecast.fan_out``)."""
        measurable = [slot for slot in slots
                      if slot + FAN_OUT_WINDOW <= now and slot - FAN_OUT_WINDOW >= now - ARRIVALS_KEPT]
        if not measurable:
            return {}
        arrivals = self.backend.arrivals_since(queue, int(min(measurable)) - FAN_OUT_WINDOW)
        return {slot: fan_out(arrivals, slot) for slot in measurable}

    # -- the thread -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="flexiqd-schedules", daemon=True)
            self._thread.start()

    def wake(self) -> None:
        """Run a pass now (a reload, an order)."""
        self._wake.set()

    def stop(self) -> None:
        """Stop firing (idempotent); returns once the pass under way, if any, has ended."""
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wake.clear()
            try:
                self.pass_once()
                if self._failing:
                    log.info("The schedules are fired again: the store answers.")
                self._failing = False
            except QueueError as exc:
                if not self._failing:
                    log.warning("Cannot fire the schedules (retried every %gs; no slot is lost): %s", MAX_WAIT, exc)
                self._failing = True
            except FlexiqdError as exc:
                log.error("Firing the schedules failed: %s", exc)
            except Exception:  # a bug here must not stop the schedules for good
                log.exception("Firing the schedules failed.")
            self._wake.wait(self._wait())

    def _wait(self) -> float:
        if self._failing or not self._next:
            return MAX_WAIT
        return min(MAX_WAIT, max(0.0, min(self._next.values()) - self._clock()))
