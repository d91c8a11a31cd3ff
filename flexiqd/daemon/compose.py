"""The one place a controller is put together, for the daemon and for ``flexiq autoscale``.

``build_controller`` wires every part the tick sequences -- the observer with the recovery,
the evidence (probes and pressure), the start costs and the crash loops; the resizer with
the retiring workers, the operators' intent and the restarts; the events and the histories
and samples (the knee's measurements among them) -- the same way for both.  Each entry point passes only
what differs: its fleet, and where (if anywhere) the state outlives the process.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

from ..config.model import DaemonConfig
from ..fleet.base import Fleet
from ..queue.owners import process_exists, this_host
from ..queue.store.backend import Backend
from .activity import Activity
from .apply import Resizer, ResizerParts
from .controller import Controller, ControllerParts
from .crashloop import CrashLoops
from .events import EVENTS_FILE, EventLog
from .evidence import EvidenceReader
from .intent import HISTORY_FILE, INTENT_FILE, SAMPLES_FILE, HistoryFile, IntentFile, SamplesFile
from .observe import Observer, ObserverParts
from .operators import OperatorIntent
from .recovery import Recovery
from .restarts import RESTARTS_FILE, RestartFile, Restarts
from .retiring import Retiring
from .startcost import StartCosts


@dataclasses.dataclass(frozen=True)
class StateFiles:
    """Where the controller keeps what must outlive the process; None: in memory only."""

    events: str | None = None     # the scale events (EventLog)
    intent: str | None = None     # the operators' pins, drains and pauses (IntentFile)
    paused: str | None = None     # the paused pools, published for the workers
    history: str | None = None    # the policies' histories and start costs (HistoryFile)
    samples: str | None = None    # the charts' last hour (SamplesFile)
    restarts: str | None = None   # the restarts in progress (RestartFile)

    @classmethod
    def in_folder(cls, folder: str | None, paused: str | None = None) -> "StateFiles":
        """Each file under its usual name in ``folder`` (None: none kept)."""
        if not folder:
            return cls(paused=paused)
        return cls(events=os.path.join(folder, EVENTS_FILE), intent=os.path.join(folder, INTENT_FILE),
                   paused=paused, history=os.path.join(folder, HISTORY_FILE),
                   samples=os.path.join(folder, SAMPLES_FILE), restarts=os.path.join(folder, RESTARTS_FILE))


def build_controller(config: DaemonConfig, backend: Backend, fleet: Fleet, *, files: StateFiles = StateFiles(),
                     host: str | None = None, clock: Callable[[], float] | None = None,
                     pid_alive: Callable[[int], bool] = process_exists) -> Controller:
    """A controller for ``config`` over ``backend`` and ``fleet``.  Blocking: it loads the kept
    state and brings the running workers up to the config.  ``clock`` defaults to the store's
    time (leases, run-ats and ages are in it, and no step of the wall clock moves it)."""
    host = host or this_host()
    clock = clock or backend.clock
    activity = Activity()
    retiring = Retiring(fleet)
    start_costs, crash_loops = StartCosts(), CrashLoops()
    observer = Observer(config, backend, fleet, ObserverParts(
        recovery=Recovery(config, backend, fleet, host=host, pid_alive=pid_alive, doing=activity),
        retiring=retiring, start_costs=start_costs, crash_loops=crash_loops, evidence=EvidenceReader(config)),
        host=host, doing=activity)
    operators = OperatorIntent(config.pools, fleet, clock=clock, file=IntentFile(files.intent),
                               paused_path=files.paused, retiring=retiring)
    # A restart in progress goes on with the same old workers after the daemon's own restart.
    restarts = Restarts(config.pools, file=RestartFile(files.restarts))
    events = EventLog(files.events)
    resizer = Resizer(config, fleet, ResizerParts(
        retiring=retiring, operators=operators, restarts=restarts, crash_loops=crash_loops,
        start_costs=start_costs, events=events), doing=activity)
    return Controller(config, backend, fleet, ControllerParts(
        host=host, clock=clock, activity=activity, observer=observer, retiring=retiring, operators=operators,
        resizer=resizer, start_costs=start_costs, crash_loops=crash_loops, events=events,
        history_file=HistoryFile(files.history), samples_file=SamplesFile(files.samples)))
