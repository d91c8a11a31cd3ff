"""The replay's machine: a throw-away systemd container running this checkout's flexiqd.

``flexiq bench replay`` (flexiqd/cli/bench.py) loads this file from the checkout's
bench/: it is the benchmark's harness, not part of the installed package (the packages
do not ship it), since it needs a source checkout anyway.  The container is the system
tests' sandbox (``tests/system/sandbox.py``: this machine's own root file system booted
by ``systemd-nspawn`` on a volatile overlay, nothing on the host changes), so the
replay needs a source checkout with its ``.venv`` (``make venv``), root, and
systemd-nspawn.  flexiqd is installed into it as ``make demo`` installs it: the shipped
units with their programs pointed at the checkout's ``.venv``; ``replay_driver.py``
beside this file runs inside it.

``replay()`` is blocking: it boots a container, runs one compressed trace and
tears the container down, whatever happens (Ctrl-C included).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from flexiqd.busnames import BUS_NAME
from flexiqd.sim.replay import POOL, STORE, JobRecord, Recording, ScheduledJob, job_records, worker_spans
from flexiqd.sim.trace import Trace

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "bench" / "replay_driver.py"  # run inside the container (the checkout is at the same path there)
BIN = REPO / ".venv" / "bin"
SANDBOX_FILE = REPO / "tests" / "system" / "sandbox.py"
DATABASE = "/var/lib/flexiq/queue.db"
EVENTS = "/var/lib/flexiqd/events.jsonl"
SCHEDULE = "/root/replay-schedule.json"
DAEMON = "flexiqd.service"
# systemd's own messages about the worker units: starting, then deactivated, failed or stopped.
_UNIT_MESSAGES = ("7d4958e842da4a758f6c1cdc7b36dcc5", "7ad2d189f7e94e70a38c781354912448",
                  "d9b373ed55a64feb8242e02dbe79a49c", "9d1aaa27d60140bd96365438aad20286")
LEAD_IN = 2.0  # seconds between starting the driver and the trace's time 0


class ReplayError(Exception):
    """The container, the daemon or the driver failed during a replay; the message says which."""


def unavailable_reason() -> str | None:
    """Why no replay can run on this machine, or None when one can (it may still fail)."""
    if os.geteuid() != 0:
        return "the replay needs root (for systemd-nspawn, mount and nsenter)"
    if not SANDBOX_FILE.is_file():
        return f"it needs a source checkout of flexiqd ({SANDBOX_FILE} is missing)"
    if not (BIN / "flexiqd").exists():
        return f"the checkout has no virtual environment ({BIN / 'flexiqd'} is missing): run `make venv`"
    return _sandbox_module().unavailable_reason()


def _sandbox_module() -> Any:
    name = "flexiqd_replay_sandbox"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SANDBOX_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def replay(compressed: Trace, config: str, jobs: Sequence[ScheduledJob]) -> Recording:
    """Run ``jobs`` through flexiqd configured by ``config`` in a fresh container.

    The trace's initial workers are started as units before flexiqd, which
    adopts them as it adopts workers after its own restart: the trace starts
    with them up and a policy without history, as in the simulator.
    """
    sandbox = _sandbox_module()
    try:
        with sandbox.Sandbox(stop_timeout=60.0) as machine:
            return _run(machine, compressed, config, jobs)
    except ReplayError:
        raise
    except sandbox.SandboxCommandError as error:
        detail = (error.stderr or error.stdout or "").strip().splitlines()
        raise ReplayError(f"{compressed.name}: a command in the container failed: {' '.join(error.cmd)[:120]}"
                          f": {detail[-1] if detail else 'exit ' + str(error.returncode)}") from None
    except sandbox.SandboxError as error:
        raise ReplayError(f"{compressed.name}: the container failed: {error}") from None
    except TimeoutError as error:
        raise ReplayError(f"{compressed.name}: timed out: {error}") from None


def _run(machine: Any, compressed: Trace, config: str, jobs: Sequence[ScheduledJob]) -> Recording:
    _install(machine, config)
    initial = compressed.workers.initial
    if initial:
        machine.systemctl("start", *(f"flexiq-worker@{POOL}-{n}.service" for n in range(1, initial + 1)),
                          timeout=120)
    _start_daemon(machine)
    machine.wait_for(lambda: len(_active_workers(machine)) >= initial, timeout=120, interval=0.5,
                     what=f"{initial} worker units of pool {POOL} to be active")
    machine.write_file(SCHEDULE, json.dumps([[job.enqueue_at, job.delay, job.duration] for job in jobs]))
    start = time.time() + LEAD_IN
    end = start + compressed.duration
    driven = machine.run([str(BIN / "python"), str(DRIVER), "enqueue", SCHEDULE, STORE,
                          POOL, repr(start)], timeout=compressed.duration + 300)
    print(f"  driver: {driven.stderr.strip().splitlines()[-1] if driven.stderr.strip() else 'done'}",
          file=sys.stderr, flush=True)
    enqueued = [(int(job_id), float(runnable)) for job_id, runnable in json.loads(driven.stdout)]
    if time.time() < end:
        time.sleep(end - time.time())
    return _collect(machine, start, end, enqueued)


def _collect(machine: Any, start: float, end: float, enqueued: list[tuple[int, float]]) -> Recording:
    started = json.loads(machine.run([str(BIN / "python"), str(DRIVER), "executions",
                                      DATABASE, POOL], timeout=120).stdout)
    jobs: tuple[JobRecord, ...] = job_records(enqueued, ((int(job), at) for job, at in started))
    events, decisions = [], []
    read = machine.run(["cat", EVENTS], check=False)
    if read.returncode != 0:
        print(f"  no scale events: cannot read {EVENTS} in the container", file=sys.stderr, flush=True)
    for line in read.stdout.splitlines():
        try:
            event = json.loads(line)
            if event.get("pool") != POOL:
                continue
            at, previous, desired = float(event["at"]), int(event["previous"]), int(event["desired"])
        except (ValueError, TypeError, KeyError, AttributeError):
            continue  # a line another version of the daemon wrote differently: not an event we can count
        events.append((at, previous, desired))
        decisions.append(f"t={at - start:.1f}s {event.get('rationale', '')}")
    matches = [f"MESSAGE_ID={message}" for message in _UNIT_MESSAGES]
    journal = machine.run(["journalctl", "--no-pager", "-o", "json", "--output-fields=UNIT,MESSAGE_ID",
                           "_PID=1", *matches], timeout=120).stdout
    entries = []
    for line in journal.splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    spans = worker_spans(entries, f"flexiq-worker@{POOL}-")
    return Recording(start=start, end=end, jobs=jobs, worker_spans=tuple(spans), events=tuple(events),
                     decisions=tuple(decisions))


def _active_workers(machine: Any) -> list[str]:
    out = machine.run(["systemctl", "list-units", "--plain", "--no-legend", "--state=active",
                       f"flexiq-worker@{POOL}-*.service"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _unit_text(name: str) -> str:
    text = (REPO / "units" / name).read_text()
    return text.replace("/usr/bin/flexiqd ", f"{BIN}/flexiqd ").replace("/usr/bin/flexiq ", f"{BIN}/flexiq ")


def _install(machine: Any, config: str) -> None:
    """flexiqd from this checkout, as ``make demo`` installs it, configured by ``config`` (not started)."""
    units = REPO / "units"
    machine.write_file("/etc/sysusers.d/flexiqd.conf", (units / "flexiqd.sysusers").read_text())
    machine.write_file("/etc/tmpfiles.d/flexiqd.conf", (units / "flexiqd.tmpfiles").read_text())
    machine.run(["systemd-sysusers"])
    machine.run(["systemd-tmpfiles", "--create", "/etc/tmpfiles.d/flexiqd.conf"])
    machine.write_file("/etc/flexiqd/flexiqd.yaml", config)
    machine.write_file(f"/etc/dbus-1/system.d/{BUS_NAME}.conf", (units / f"{BUS_NAME}.conf").read_text())
    machine.run(["systemctl", "reload", "dbus"])
    machine.write_file(f"/etc/systemd/system/{DAEMON}", _unit_text(DAEMON))
    machine.write_file("/etc/systemd/system/flexiq-worker@.service", _unit_text("flexiq-worker@.service"))
    # The units run the checkout's .venv: keep it visible behind PrivateTmp= if it lies below /tmp.
    for unit in (DAEMON, "flexiq-worker@.service"):
        machine.write_file(f"/etc/systemd/system/{unit}.d/10-checkout.conf",
                           f"[Service]\nBindReadOnlyPaths={REPO}\n")
    machine.systemctl("daemon-reload")


def _start_daemon(machine: Any) -> None:
    started = machine.systemctl("start", DAEMON, check=False, timeout=120)
    if started.returncode != 0:
        tail = machine.run(f"journalctl --no-pager -n 5 -o cat -u {DAEMON}", check=False).stdout.strip()
        last = tail.splitlines()[-1] if tail else started.stderr.strip()
        raise ReplayError(f"flexiqd did not start in the container: {last}")
