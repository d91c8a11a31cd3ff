"""Restarting a pool's workers in steps (``flexiqctl restart POOL``): a deploy of new code.

A worker imports its application once, when its process starts; new code installed on
disk reaches a pool only through new processes.  A restart replaces every worker that
was started before it was requested (an *old* worker) by a new one, so that the pool's
ready capacity never falls below its target while it does:

1. start replacements first, at most ``surge(target)`` above the target at a time;
2. once they are ready (``READY=1``), drain as many old ones as the ready workers leave
   above the target -- each as a scale-in drains it: an idle one is stopped, a busy one
   is paused and stopped once its jobs are done (``retiring``); none is cut, none runs twice;
3. again, until no old worker is left; then the restart is done.  A replacement that
   keeps failing (the pool is crash-looping, ``crashloop``) fails the restart: nothing
   more is replaced, and the old workers that are left keep running.

Old and new are told apart by when each worker's process started (``WorkerInfo.launched``,
systemd's ``ExecMainStartTimestampMonotonic``) against when the restart was requested, both
on CLOCK_MONOTONIC, which a step of the wall clock does not move.  systemd stays the source
of truth: the request (its monotonic time and the boot it was made in) is kept in a file,
so a daemon that restarts meanwhile finds the same old workers and goes on.  After a
reboot every worker is new.

The policy goes on deciding during a restart: its decisions are the target.  It sees the
pool at most at the target (``policy_counts``): the replacements above it are the
restart's, not a count to scale in.  Workers the policy adds are new ones; a scale-in
takes old ones first (``apply.choose_victims``).

Pure functions (``census``, ``plan``, ``policy_counts``) decide; ``Restarts`` keeps the
requests and their progress.  Not thread-safe: the controller's loop drives it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from typing import Callable, Container, Iterable, Mapping

from ..errors import ControlError
from ..fleet.base import WorkerInfo, WorkerState
from ..logs import MessageId, journal
from .intent import write_private_json

# The control loop's logger: these lines are the tick's, like the operators' and recovery's.
log = logging.getLogger("flexiqd.daemon.controller")

RESTARTS_FILE = "restarts.json"
VERSION = 1
# At most this share of the target (at least one worker) is started above it at a time:
# a step.  Kubernetes' rolling update starts 25 % more by default, for the same reason:
# a bigger step replaces a big pool sooner, a smaller one holds fewer extra workers.
SURGE_FRACTION = 0.25
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"

REPLACING, FINISHING, DONE, FAILED = "replacing", "finishing", "done", "failed"


def surge(target: int) -> int:
    """How many workers a restart may run above the pool's ``target``: the size of a step."""
    return max(1, math.ceil(target * SURGE_FRACTION))


@dataclasses.dataclass(frozen=True)
class Census:
    """A pool's workers during a restart, by version and state.

    ``old_ready``: old, ready and claiming; ``old_starting``: old, not ready yet;
    ``old_leaving``: old, draining or retiring; ``new_ready`` / ``new_starting``: new ones
    (not retiring)."""

    old_ready: int = 0
    old_starting: int = 0
    old_leaving: int = 0
    new_ready: int = 0
    new_starting: int = 0

    @property
    def old(self) -> int:
        return self.old_ready + self.old_starting + self.old_leaving


@dataclasses.dataclass(frozen=True)
class Step:
    """What a restart does this tick: ``start`` new workers, drain ``stop_ready`` old ready ones
    and stop ``stop_starting`` old ones not ready yet (no capacity: stopping them costs none).
    ``phase``: REPLACING, FINISHING (no old worker serves; some still drain) or DONE."""

    start: int
    stop_ready: int
    stop_starting: int
    phase: str


def is_old(worker: WorkerInfo, requested: float) -> bool:
    """Whether ``worker``'s process started before a restart requested at ``requested``
    (CLOCK_MONOTONIC seconds).  A ready worker whose start is unknown counts as old: it is
    replaced rather than trusted; one not started yet (a start job queued) is new."""
    if worker.launched is None:
        return worker.state is not WorkerState.STARTING
    return worker.launched < requested


def census(workers: Iterable[WorkerInfo], requested: float, retiring: Container[WorkerInfo]) -> Census:
    """Count ``workers`` (one pool's, failed ones left out) for a restart requested at ``requested``."""
    counts = dict.fromkeys(("old_ready", "old_starting", "old_leaving", "new_ready", "new_starting"), 0)
    for worker in workers:
        if worker.state is WorkerState.FAILED:
            continue
        old = is_old(worker, requested)
        if worker.state is WorkerState.DRAINING or worker in retiring:
            if old:
                counts["old_leaving"] += 1
            continue
        kind = "ready" if worker.state is WorkerState.ACTIVE else "starting"
        counts[f"{'old' if old else 'new'}_{kind}"] += 1
    return Census(**counts)


def plan(seen: Census, target: int) -> Step:
    """The restart's step for a pool whose target is ``target`` workers.

    Capacity -- ready workers that claim, old and new -- stays at or above the target:
    an old ready worker is drained only when the others ready cover the target.  Workers
    in service (ready or starting, old starting ones left out: they are stopped now) stay
    within ``target + surge(target)``, and new ones are started up to the target.
    """
    if seen.old_ready + seen.old_starting == 0:
        return Step(0, 0, 0, FINISHING if seen.old_leaving else DONE)
    target = max(0, target)
    in_service = seen.old_ready + seen.new_ready + seen.new_starting
    new = seen.new_ready + seen.new_starting
    stop_ready = min(seen.old_ready, max(0, seen.old_ready + seen.new_ready - target))
    # The old ones drained now leave the service now: their replacements may start at once.
    start = max(0, min(target + surge(target) - (in_service - stop_ready), target - new))
    return Step(start, stop_ready, seen.old_starting, REPLACING)


def policy_counts(active: int, starting: int, target: int | None) -> tuple[int, int]:
    """(active, starting) as the policy sees a pool during a restart: at most ``target`` in all
    (None: no target known yet, as seen).  The replacements above the target are the restart's;
    seen by the policy, they would be scaled in as soon as started.  Starting ones are hidden
    first: ready ones are what the pool serves with."""
    if target is None:
        return active, starting
    surplus = max(0, active + starting - max(0, target))
    hidden_starting = min(starting, surplus)
    return active - (surplus - hidden_starting), starting - hidden_starting


@dataclasses.dataclass(frozen=True)
class RestartRequest:
    """One pool's restart.  ``id``: microseconds since the epoch at the request (what
    ``Restart`` returns; a later request of the pool has a higher one); ``requested``: the
    request on CLOCK_MONOTONIC, in boot ``boot_id``; ``target``: the pool's target as last seen."""

    pool: str
    id: int
    requested_at: float
    requested: float
    boot_id: str
    state: str = REPLACING
    target: int | None = None
    finished_at: float | None = None
    error: str | None = None

    @property
    def in_progress(self) -> bool:
        return self.state in (REPLACING, FINISHING)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Progress:
    """What a tick found of a restart, for the Status document: its census, step size and
    what holds it (None: nothing)."""

    census: Census
    step: int
    waiting: str | None = None


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


class RestartFile:
    """Where the requests are kept (mode 0600).  ``path`` None: nowhere.  Not thread-safe."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def load(self) -> dict[str, RestartRequest]:
        if not self.path:
            return {}
        try:
            with open(self.path, encoding="utf-8") as handle:
                data = json.load(handle)
            if not isinstance(data, dict) or data.get("version") != VERSION:
                raise ValueError("not a version 1 document")
            return {name: RestartRequest(**entry) for name, entry in data["pools"].items()}
        except FileNotFoundError:
            return {}
        except OSError as exc:
            log.warning("Ignoring the pools' restarts in %s: cannot read it: %s", self.path, exc.strerror)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("Ignoring the pools' restarts in %s: it is damaged (%s).", self.path, exc)
        return {}

    def save(self, requests: Mapping[str, RestartRequest]) -> None:
        document = {"version": VERSION, "pools": {name: r.as_dict() for name, r in sorted(requests.items())}}
        if self.path and not write_private_json(self.path, document):
            log.error("Cannot keep the pools' restarts in %s (a restart of flexiqd would forget a "
                      "restart in progress).", self.path)


class Restarts:
    """Every pool's last restart: requested, followed tick by tick, kept across daemon restarts."""

    def __init__(self, pools: Container[str], *, file: RestartFile | None = None,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 boot_id: Callable[[], str] = read_boot_id) -> None:
        self.pools = pools
        self.file = file or RestartFile(None)
        self.clock = clock
        self.monotonic = monotonic
        self.boot_id = boot_id()
        self.requests = {name: r for name, r in self.file.load().items() if name in pools}
        self.progress: dict[str, Progress] = {}
        for request in self.requests.values():
            if request.in_progress:
                log.info("Pool %s: going on with the restart requested before flexiqd restarted.", request.pool)

    def reconfigure(self, pools: Container[str]) -> None:
        self.pools = pools
        kept = {name: r for name, r in self.requests.items() if name in pools}
        if kept != self.requests:
            self.requests = kept
            self.file.save(self.requests)

    def request(self, pool: str) -> int:
        """Restart ``pool``'s workers: every one started before now is replaced.  A restart in
        progress is taken over by this one (its old workers are old for this one too).  The
        request's id.  ControlError for an unknown pool."""
        if pool not in self.pools:
            raise ControlError(f"no pool named {pool!r} (pools: {', '.join(sorted(self.pools)) or 'none'})")
        now = self.clock()
        before = self.requests.get(pool)
        ident = max(int(now * 1e6), before.id + 1 if before else 0)
        self.requests[pool] = RestartRequest(pool=pool, id=ident, requested_at=now, requested=self.monotonic(),
                                             boot_id=self.boot_id, target=before.target if before else None)
        self.progress.pop(pool, None)
        self.file.save(self.requests)
        log.info("Pool %s: restart requested: every worker started before now is replaced, in steps that "
                 "keep the pool's ready workers at its target.", pool,
                 extra=journal(MessageId.POOL_RESTART, POOL=pool, STATE="requested"))
        return ident

    def active(self, pool: str) -> RestartRequest | None:
        """The pool's restart in progress, if any."""
        request = self.requests.get(pool)
        return request if request is not None and request.in_progress else None

    def old(self, request: RestartRequest, worker: WorkerInfo) -> bool:
        """Whether ``worker`` is one that ``request`` replaces (none after a reboot)."""
        return request.boot_id == self.boot_id and is_old(worker, request.requested)

    def census(self, request: RestartRequest, workers: Iterable[WorkerInfo],
               retiring: Container[WorkerInfo]) -> Census:
        if request.boot_id != self.boot_id:
            return census(workers, float("-inf"), retiring)  # rebooted since: every worker is new
        return census(workers, request.requested, retiring)

    def update(self, pool: str, *, state: str | None = None, target: int | None = None,
               error: str | None = None) -> None:
        """Change the pool's restart; kept on disk when its state or target changed."""
        request = self.requests[pool]
        changed = request
        if target is not None and target != request.target:
            changed = dataclasses.replace(changed, target=target)
        if state is not None and state != request.state:
            finished = self.clock() if state in (DONE, FAILED) else None
            changed = dataclasses.replace(changed, state=state, finished_at=finished, error=error)
        if changed != request:
            self.requests[pool] = changed
            self.file.save(self.requests)

    def document(self, pool: str) -> dict | None:
        """The pool's last restart for the Status document (docs/dbus-api.md); None: none yet."""
        request = self.requests.get(pool)
        if request is None:
            return None
        progress = self.progress.get(pool)
        seen = progress.census if progress is not None else None
        return {
            "id": request.id, "state": request.state, "requested_at": request.requested_at,
            "finished_at": request.finished_at, "error": request.error, "target": request.target,
            "step": progress.step if progress is not None else None,
            "waiting": progress.waiting if progress is not None and request.in_progress else None,
            "old_serving": (seen.old_ready + seen.old_starting) if seen else None,
            "old_draining": seen.old_leaving if seen else None,
            "new_ready": seen.new_ready if seen else None,
            "new_starting": seen.new_starting if seen else None,
        }
