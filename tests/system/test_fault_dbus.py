"""Fault: the system D-Bus restarts, and systemd is reloaded and re-executed, under load.

A real flexiqd with real worker units in the sandbox, on a SQLite store, under a steady
load of jobs that record their own executions (tests/apps/chaos_app.py: one
``time.sleep``, blocking in C).  The daemon uses the bus three ways: its systemd client
(method calls), a second connection following systemd's unit changes, and its own API
(``org.flexiq.flexiqd1``, what flexiqctl calls).  The workers use none of it: they speak
to systemd over the notify socket only (READY=, STATUS=, WATCHDOG=, EXTEND_TIMEOUT_USEC=).

How the bus goes away, as it does on a host (Debian's dbus-daemon here: ``dbus.service``
has no ``Restart=``; ``dbus.socket`` stays in PID 1's hands):
- ``killed``: the bus daemon is SIGKILLed (a crash, the OOM killer); it stays down until
  a client connects and socket activation starts it again;
- ``restarted``: ``systemctl restart dbus`` (an operator, a package's restart);
- ``away``: ``dbus.socket`` and ``dbus.service`` stopped for ``AWAY_SECONDS``, then started
  -- a bus that takes seconds to come back, so that calls surely meet the gap; an operator
  reloads flexiqd in the middle of it.
Each while the pool is busy and has grown; the next backlog comes only after it.

systemd reloaded and re-executed: ``systemctl daemon-reload`` and ``daemon-reexec``,
several times each, some while nothing happens, some right as a backlog is enqueued (a
scale-up in flight), some right after an operator's pin to one worker (a scale-in in flight).

What must hold, and what is measured (printed; ``pytest -s``):
- nothing lost: every job enqueued ends done, having run to its end;
- no job runs twice, no worker is cut or restarted: every worker running before a fault
  runs with the same main pid after it, unless the daemon itself stopped it afterwards (a
  scale-in); no unit failed, no start-limit hit;
- the daemon never restarts (same pid, NRestarts=0), holds every pool while it cannot list
  the workers (no decision meanwhile), and says so in STATUS= and the journal;
- flexiqd is back on the bus by itself: ``flexiqctl status`` answers again (seconds from the
  fault's end: measured); a call made in the gap fails in one line, no traceback, exit 3,
  naming the bus or flexiqd;
- scaling goes on after each fault: the pool shrinks when the backlog is done and grows for
  the next one;
- jobs kept completing: the longest pause between two completions around the fault, and the
  time from the fault's end to the first completion after it (measured).
"""

from __future__ import annotations

import json
import re
import threading
import time

import pytest

from .executions import judge
from .faults import (Load, completed_jobs, config, cut_workers, executions, journal_entries, start_limit_hits,
                     wait_all_done, worker_restarts)
from .flexiqd_install import BIN, DAEMON, STORE, install, workers
from .sandbox import Sandbox, SandboxTimeout

DB = "/var/lib/flexiq/queue.db"
MAX_WORKERS = 4
CONFIG = config(STORE, max_workers=MAX_WORKERS)
# Every 0.5 s: short jobs, and a longer one so that workers hold work when a fault comes.
BATCH = ((3, 0.2), (1, 1.5))
BACKLOG = (160, 0.2)  # a backlog the pool grows for (and shrinks after)
AWAY_SECONDS = 3.0
FLEXIQCTL = str(BIN / "flexiqctl")
# A one-line error about the bus or flexiqd (exit 3): the words flexiqctl must use.
GAP_WORDS = ("bus", "flexiqd")

# Each fault as a shell command; {call} is where a flexiqctl call is made in the gap.
BUS_FAULTS = {
    "killed": "kill -KILL $(systemctl show -p MainPID --value dbus.service); {call}",
    "restarted": "systemctl restart dbus.service; {call}",
    # ... and an operator's reload of flexiqd in the middle of it.
    "away": (f"systemctl stop dbus.socket dbus.service; {{call}}; sleep 1; systemctl reload {DAEMON}; "
             f"sleep {AWAY_SECONDS - 1}; systemctl start dbus.socket"),
}
GAP_CALL = f"{FLEXIQCTL} status >/run/flexiq-gap-call 2>&1; echo $? >>/run/flexiq-gap-call"


API_AGAIN = re.compile(r"on the bus again, ([\d.]+)s after the connection was lost")


def _states(sbx: Sandbox) -> dict[str, int]:
    code = (f"import json, sqlite3; c = sqlite3.connect('{DB}', timeout=30); "
            "print(json.dumps(dict(c.execute('SELECT state, COUNT(*) FROM jobs GROUP BY state').fetchall())))")
    return json.loads(sbx.run(["python3", "-c", code]).stdout)


class Calls(threading.Thread):
    """``flexiqctl status`` called again and again, and STATUS= read, while a fault lasts: each
    call's (start, end, exit code, output) and each new STATUS= (when, text)."""

    def __init__(self, sbx: Sandbox) -> None:
        super().__init__(name="calls", daemon=True)
        self.sbx = sbx
        self.calls: list[tuple[float, float, int, str]] = []
        self.status: list[tuple[float, str]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            began = time.time()
            # One process inside: the call, then STATUS= (systemctl uses PID 1's private socket, not the bus).
            done = self.sbx.run(f"{FLEXIQCTL} status 2>&1; echo \"rc=$?\"; "
                                f"systemctl show -p StatusText --value {DAEMON}", check=False, timeout=60)
            ended = time.time()
            lines = done.stdout.splitlines()
            code_at = max((i for i, line in enumerate(lines) if line.startswith("rc=")), default=None)
            if code_at is None:
                continue
            self.calls.append((began, ended, int(lines[code_at][3:]), "\n".join(lines[:code_at])))
            status = "\n".join(lines[code_at + 1:]).strip()
            if status and (not self.status or self.status[-1][1] != status):
                self.status.append((ended, status))
            self._halt.wait(0.05)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def one_line_gap_error(output: str) -> bool:
    text = output.strip()
    return ("\n" not in text and "Traceback" not in text and text.startswith("flexiqctl: ")
            and any(word in text for word in GAP_WORDS))


def judge_calls(calls: list[tuple[float, float, int, str]]) -> list[str]:
    """The calls that neither answered nor failed as the gap must: one line, exit 3."""
    return [f"exit {code}: {output[:300]}" for _, _, code, output in calls
            if code != 0 and not (code == 3 and one_line_gap_error(output))]


def _pids(sbx: Sandbox) -> dict[str, str]:
    """Each running worker unit's main pid, read in one call to PID 1 (asked again if that call
    fails: flexiqd reloads systemd itself when it starts a worker of a new index)."""
    for _ in range(5):
        done = sbx.run("systemctl show -p Id,ActiveState,MainPID 'flexiq-worker@*.service'", check=False)
        if done.returncode == 0:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"systemctl show failed five times: {done.stderr.strip()}")
    pids = {}
    for block in done.stdout.strip().split("\n\n"):
        unit = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if unit.get("ActiveState") == "active" and unit.get("MainPID", "0") != "0":
            pids[unit["Id"]] = unit["MainPID"]
    return pids


def _stopped_by_daemon(sbx: Sandbox, since: float) -> set[str]:
    return {e.get("UNIT") for e in journal_entries(sbx, DAEMON, since=since)
            if "Stopping flexiq-worker@" in e.get("MESSAGE", "")}


def _decisions(sbx: Sandbox, since: float) -> list[dict]:
    return [e for e in journal_entries(sbx, DAEMON, since=since) if "FROM" in e and "TO" in e]


def _holds(entries: list[dict], since: float) -> list[tuple[float, float]]:
    """When the daemon could not list the workers: from its first "Holding every pool" to its
    "Listing the workers again" (or the end of the journal)."""
    spans, held_at = [], None
    for entry in entries:
        if entry["at"] < since:
            continue
        message = entry.get("MESSAGE", "")
        if held_at is None and "Holding every pool" in message:
            held_at = entry["at"]
        elif held_at is not None and "Listing the workers again" in message:
            spans.append((held_at, entry["at"]))
            held_at = None
    if held_at is not None:
        spans.append((held_at, float("inf")))
    return spans


def _longest_pause(ends: list[float], start: float, end: float) -> float | None:
    within = sorted(t for t in ends if start <= t <= end)
    return round(max((b - a for a, b in zip(within, within[1:])), default=0.0), 2) if within else None


def _completion_figures(ends: list[float], start: float, end: float) -> dict:
    """The longest pause between completions from the fault's start to 5 s after its end, the
    same in the 10 s before it (the load's own pauses, to compare), and the seconds from its
    end to the first completion after it."""
    after = [t for t in sorted(ends) if t >= end]
    return {"longest_pause_between_completions_s": _longest_pause(ends, start, end + 5),
            "longest_pause_in_the_10s_before_s": _longest_pause(ends, start - 10, start),
            "complete_again_s": round(after[0] - end, 2) if after else None}


def _wait_grown(sbx: Sandbox, at_least: int = 3) -> None:
    since = time.time()
    try:
        sbx.wait_for(lambda: len(workers(sbx)) >= at_least, 60, interval=0.3, what=f"the pool to grow to {at_least}")
    except SandboxTimeout as exc:
        raise AssertionError(f"{exc}; {_what_it_decided(sbx, since)}") from None


def _what_it_decided(sbx: Sandbox, since: float) -> str:
    """The daemon's journal since ``since`` and its status: why a pool did not do what a test waited for."""
    lines = [e.get("MESSAGE", "") for e in journal_entries(sbx, DAEMON, since=since - 5)]
    status = sbx.run(f"{FLEXIQCTL} status", check=False).stdout
    return f"the daemon's journal: {lines[-40:]}; its status: {status}"


def _inject(sbx: Sandbox, name: str, command: str) -> dict:
    """Run ``command`` (the fault) with a flexiqctl call right behind it, in the gap; the fault
    ends when the bus daemon runs again (socket activation, for ``killed``, starts it at the
    first connection: that call's)."""
    before = _pids(sbx)
    started = time.time()
    sbx.run(command.format(call=GAP_CALL), check=False, timeout=120)
    sbx.wait_for(lambda: sbx.run("systemctl is-active dbus.service", check=False).stdout.strip() == "active",
                 60, interval=0.05, what="the bus daemon to run again")
    ended = time.time()
    lines = sbx.run("cat /run/flexiq-gap-call").stdout.strip().splitlines()
    gap_call = (int(lines[-1]), "\n".join(lines[:-1])[:400])
    return {"fault": name, "started": started, "ended": ended, "before": before, "gap_call": gap_call}


def _back_on_bus(sbx: Sandbox, since: float) -> float:
    """Seconds from ``since`` until flexiqctl reaches the daemon again."""
    sbx.wait_for(lambda: sbx.run([FLEXIQCTL, "status"], check=False, timeout=60).returncode == 0,
                 60, interval=0.05, what="flexiqctl to reach flexiqd again")
    return time.time() - since


def _after_fault(sbx: Sandbox, fault: dict, daemon_pid: str) -> dict:
    """What holds once the fault is over: the daemon back on the bus, its workers untouched."""
    fault["api_back_after_end_s"] = round(_back_on_bus(sbx, fault["ended"]), 2)
    assert sbx.unit_property(DAEMON, "MainPID") == daemon_pid, f"flexiqd was restarted by {fault['fault']}"
    after = _pids(sbx)
    stopped = _stopped_by_daemon(sbx, fault["started"])
    # Every worker running before the fault runs on with the same process, unless the daemon
    # stopped it since (a scale-in after the fault).
    changed = {unit: (pid, after.get(unit)) for unit, pid in fault["before"].items()
               if after.get(unit) != pid and unit not in stopped}
    if changed:
        # Read once more: a replaced worker stays replaced; a unit that was only unreadable for a
        # moment (PID 1 reloading) shows its same process again.
        time.sleep(1.0)
        again, stopped = _pids(sbx), _stopped_by_daemon(sbx, fault["started"])
        fault["read_again"] = {unit: again.get(unit) for unit in changed}
        changed = {unit: (pid, again.get(unit)) for unit, (pid, _) in changed.items()
                   if again.get(unit) != pid and unit not in stopped}
    fault["workers_before"] = len(fault["before"])
    fault["workers_replaced"] = changed
    return fault


@pytest.fixture
def bus_restored(sandbox: Sandbox):
    yield sandbox
    # The sandbox is the session's: leave its bus running, and flexiqd stopped.
    sandbox.run("systemctl unmask --runtime dbus.socket dbus.service; systemctl start dbus.socket dbus.service",
                check=False, timeout=60)
    sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*' 2>/dev/null; true", timeout=120)


def _start(sbx: Sandbox) -> tuple[float, str, Load]:
    began = time.time()
    install(sbx, CONFIG)
    sbx.wait_for(lambda: workers(sbx), 30, what="the minimum worker")
    load = Load(sbx, STORE, BATCH, every=0.5)
    load.start()
    return began, sbx.unit_property(DAEMON, "MainPID"), load


def _finish(sbx: Sandbox, began: float, load: Load, daemon_pid: str) -> dict:
    """Stop the load, let everything finish, and judge the executions: the shared figures."""
    load.stop()
    total = len(load.enqueues.ids)
    states = wait_all_done(sbx, lambda: _states(sbx), total, 300)
    runs = executions(sbx)
    workers_journal = journal_entries(sbx, "flexiq-worker@*", since=began)
    cut = cut_workers(workers_journal)
    verdict = judge(runs, cut)
    failed_exits = [e["MESSAGE"] for e in workers_journal
                    if "Main process exited" in e.get("MESSAGE", "") and "status=0/SUCCESS" not in e["MESSAGE"]]
    return {
        "jobs": total, "states": states, "executions": len(runs),
        "missing": sorted(load.enqueues.ids - completed_jobs(runs))[:10],
        "jobs_run_twice": len(verdict.duplicated_otherwise) + verdict.crash_duplicates,
        "overlapping": len(verdict.overlapping), "workers_cut": len(cut),
        "worker_restarts": worker_restarts(workers_journal), "worker_failed_exits": failed_exits[:5],
        "start_limit_hits": start_limit_hits(workers_journal), "units_failed": workers(sbx, "failed"),
        "daemon_restarts": int(sbx.unit_property(DAEMON, "NRestarts") or 0),
        "daemon_same_pid": sbx.unit_property(DAEMON, "MainPID") == daemon_pid,
        "enqueue_failures": len(load.enqueues.failed),
        "ends": [run.ended for run in runs if run.ended is not None],
    }


def _assert_shared(report: dict) -> None:
    assert report["states"] == {"done": report["jobs"]}, "a job was lost or dead-lettered"
    assert report["missing"] == [], "jobs done in the store that never ran to their end"
    assert report["jobs_run_twice"] == 0 and report["overlapping"] == 0
    assert report["workers_cut"] == 0
    assert report["worker_restarts"] == 0 and report["worker_failed_exits"] == []
    assert report["start_limit_hits"] == [] and report["units_failed"] == []
    assert report["daemon_same_pid"] and report["daemon_restarts"] == 0
    assert report["enqueue_failures"] == 0  # enqueues do not use the bus


def _scaling_after(sbx: Sandbox, load: Load, since: float) -> dict:
    """Scaling goes on: the pool given back down when idle, and grown for a new backlog."""
    def shrank():
        return [d for d in _decisions(sbx, since) if int(d["TO"]) < int(d["FROM"])]
    down = sbx.wait_for(shrank, 90, interval=0.5, what="a scale-in after the fault")
    sbx.wait_for(lambda: len(workers(sbx)) <= 2, 90, interval=0.3, what="idle workers to be given back")
    grow_from = time.time()
    assert load.enqueue(*BACKLOG), load.enqueues.failed[-1:]
    def grew():
        return [d for d in _decisions(sbx, grow_from) if int(d["TO"]) > int(d["FROM"])]
    try:
        up = sbx.wait_for(grew, 60, interval=0.3, what="a scale-up for the new backlog")
    except SandboxTimeout as exc:
        raise AssertionError(f"{exc}; {_what_it_decided(sbx, grow_from)}") from None
    _wait_grown(sbx)
    return {"scale_in_after": f'{down[0]["FROM"]}->{down[0]["TO"]} {down[0].get("REASON")}',
            "scale_up_after": f'{up[0]["FROM"]}->{up[0]["TO"]} {up[0].get("REASON")}'}


def _enqueue_backlog(sbx: Sandbox, load: Load) -> None:
    load.enqueue(*BACKLOG)


def test_a_restart_of_the_system_bus_loses_nothing_and_restarts_no_worker(bus_restored: Sandbox):
    sbx = bus_restored
    began, daemon_pid, load = _start(sbx)
    faults = []
    try:
        for name, command in BUS_FAULTS.items():
            _enqueue_backlog(sbx, load)
            _wait_grown(sbx)
            calls = Calls(sbx)
            calls.start()
            try:
                fault = _inject(sbx, name, command)
                fault = _after_fault(sbx, fault, daemon_pid)
            finally:
                calls.stop()
            fault["calls"], fault["status_seen"] = calls.calls, calls.status
            fault.update(_scaling_after(sbx, load, fault["ended"]))
            faults.append(fault)
    finally:
        load.stop()
    report = _finish(sbx, began, load, daemon_pid)
    daemon_journal = journal_entries(sbx, DAEMON, since=began)
    rows = []
    for number, fault in enumerate(faults):
        start, end = fault["started"], fault["ended"]
        until = faults[number + 1]["started"] if number + 1 < len(faults) else float("inf")
        gap_calls = [c for c in fault["calls"] if c[2] != 0]
        during = [f'{d["FROM"]}->{d["TO"]} {d.get("REASON")}' for d in _decisions(sbx, start)
                  if any(a <= d["at"] <= b for a, b in _holds(daemon_journal, start))]
        rows.append({
            "fault": fault["fault"], "bus_away_s": round(end - start, 2),
            "flexiqctl_back_after_end_s": fault["api_back_after_end_s"],
            "workers_running": fault["workers_before"], "workers_replaced": fault["workers_replaced"],
            "read_again": fault.get("read_again"),
            "held_s": [round(b - a, 2) for a, b in _holds(daemon_journal, start) if a <= end + 5],
            "api_again_after_loss_s": [float(m.group(1)) for e in daemon_journal if start <= e["at"] < until
                                       for m in [API_AGAIN.search(e.get("MESSAGE", ""))] if m],
            "decisions_while_held": during,
            **_completion_figures(report["ends"], start, end),
            "gap_call": fault["gap_call"],
            "calls": len(fault["calls"]), "calls_failed": len(gap_calls),
            "failed_calls_said": sorted({c[3] for c in gap_calls})[:3],
            "calls_unclear": judge_calls(fault["calls"]),
            "status_seen": [text for _, text in fault["status_seen"]][:5],
            "journal": [e["MESSAGE"] for e in daemon_journal if start - 0.5 <= e["at"] <= end + 5
                        and e.get("PRIORITY") in ("3", "4", "6") and "FROM" not in e
                        and "Starting flexiq-worker" not in e["MESSAGE"]
                        and "Stopping flexiq-worker" not in e["MESSAGE"]][:12],
            "scale_in_after": fault["scale_in_after"], "scale_up_after": fault["scale_up_after"],
        })
    errors = [e["MESSAGE"] for e in daemon_journal if e.get("PRIORITY") in ("2", "3")]
    shown = {k: v for k, v in report.items() if k != "ends"}
    print("system bus restarts:", json.dumps({"shared": shown, "faults": rows, "errors": errors[:10]}, indent=1))
    _assert_shared(report)
    assert errors == [], errors
    for row in rows:
        assert row["workers_replaced"] == {}, f"{row['fault']}: workers restarted: {row['workers_replaced']}"
        assert row["calls_unclear"] == [], f"{row['fault']}: flexiqctl failed unclearly: {row['calls_unclear']}"
        code, said = row["gap_call"]
        assert code == 0 or (code == 3 and one_line_gap_error(said)), f"{row['fault']}: the call in the gap: {said}"
        assert row["decisions_while_held"] == [], f"{row['fault']}: the pool was resized while it was held"
    # flexiqd owned its name again by itself after each loss of the bus.
    assert all(len(row["api_again_after_loss_s"]) == 1 for row in rows), [r["api_again_after_loss_s"] for r in rows]
    away = next(row for row in rows if row["fault"] == "away")
    away_fault = next(fault for fault in faults if fault["fault"] == "away")
    # The bus was away for seconds: calls surely met it, and said so.
    assert away["gap_call"][0] == 3 and away["calls_failed"] >= 1
    assert any("cannot reach the system bus" in said or "nothing owns" in said
               for said in away["failed_calls_said"]), away["failed_calls_said"]
    # While it could not list the workers the daemon said so, and that it held every pool.
    assert any("holding every pool" in text for text in away["status_seen"]), away["status_seen"]
    # The whole span of the fault, not the dozen lines the report shows: a busy pool logs more.
    said_away = [e["MESSAGE"] for e in daemon_journal
                 if away_fault["started"] - 0.5 <= e["at"] <= away_fault["ended"] + 5]
    assert any("Holding every pool" in line for line in said_away), said_away
    assert any("again" in line for line in said_away), said_away
    # The reload made while the bus was away was applied, and its workers configured once it was back.
    assert any("Reloaded /etc/flexiqd/flexiqd.yaml" in e["MESSAGE"] for e in daemon_journal
               if away_fault["started"] <= e["at"] <= away_fault["ended"]), "the reload in the gap"


# (name, what makes the scale in flight just before it, the command)
SYSTEMD_RELOADS = (
    ("daemon-reload", None, "systemctl daemon-reload"),
    ("daemon-reexec", None, "systemctl daemon-reexec"),
    ("daemon-reload", "scale-up", "systemctl daemon-reload"),
    ("daemon-reexec", "scale-up", "systemctl daemon-reexec"),
    ("daemon-reload", "scale-in", "systemctl daemon-reload"),
    ("daemon-reexec", "scale-in", "systemctl daemon-reexec"),
    ("daemon-reexec", "scale-up", "systemctl daemon-reexec; systemctl daemon-reexec; systemctl daemon-reload"),
)


def _in_flight(sbx: Sandbox, load: Load, kind: str | None) -> str:
    """A shell prefix that sets a scale going just before the fault's command."""
    if kind == "scale-up":
        sbx.wait_for(lambda: len(workers(sbx)) <= 2, 90, interval=0.3, what="a small pool before the backlog")
        # Enqueued by the load (its ids are counted); the command follows as the pool grows.
        assert load.enqueue(*BACKLOG), load.enqueues.failed[-1:]
        return ""
    if kind == "scale-in":
        assert load.enqueue(*BACKLOG), load.enqueues.failed[-1:]
        _wait_grown(sbx)
        return f"{FLEXIQCTL} scale default 1 --for 3s >/dev/null; "
    return ""


def test_systemd_reloaded_and_reexecuted_under_load_restarts_no_worker(bus_restored: Sandbox):
    sbx = bus_restored
    began, daemon_pid, load = _start(sbx)
    rows = []
    try:
        _enqueue_backlog(sbx, load)
        for name, kind, command in SYSTEMD_RELOADS:
            prefix = _in_flight(sbx, load, kind)
            calls = Calls(sbx)
            calls.start()
            try:
                before = _pids(sbx)
                started = time.time()
                done = sbx.run(prefix + command, check=False, timeout=120)
                ended = time.time()
                assert done.returncode == 0, done.stderr
                fault = _after_fault(sbx, {"fault": name, "started": started, "ended": ended, "before": before},
                                     daemon_pid)
                time.sleep(1.0)  # calls after it, too
            finally:
                calls.stop()
            rows.append({"fault": name, "in_flight": kind, "command": command, "took_s": round(ended - started, 2),
                         "flexiqctl_back_after_end_s": fault["api_back_after_end_s"],
                         "workers_running": fault["workers_before"], "workers_replaced": fault["workers_replaced"],
                         "read_again": fault.get("read_again"),
                         "calls": len(calls.calls), "calls_unclear": judge_calls(calls.calls),
                         "calls_failed": [c[3] for c in calls.calls if c[2] != 0][:2],
                         "started": started, "ended": ended})
        scaling = _scaling_after(sbx, load, rows[-1]["ended"])
    finally:
        load.stop()
    report = _finish(sbx, began, load, daemon_pid)
    journal = journal_entries(sbx, DAEMON, since=began)
    for row in rows:
        row.update(_completion_figures(report["ends"], row.pop("started"), row["ended"]))
        row.pop("ended")
    held = [e["MESSAGE"] for e in journal if "Holding every pool" in e.get("MESSAGE", "")
            or "Listing the workers again" in e.get("MESSAGE", "")]
    errors = [e["MESSAGE"] for e in journal if e.get("PRIORITY") in ("2", "3")]
    shown = {k: v for k, v in report.items() if k != "ends"}
    print("systemd reloads:", json.dumps({"shared": shown, "reloads": rows, "held": held[:10],
                                          "errors": errors[:10], **scaling}, indent=1))
    _assert_shared(report)
    # A call systemd left unanswered as it re-executed is asked again: no scale fails to apply.
    assert errors == [], errors
    for row in rows:
        assert row["workers_replaced"] == {}, f"{row['fault']} ({row['in_flight']}): workers restarted"
        assert row["calls_unclear"] == [], row["calls_unclear"]
    # A scale-up and a scale-in met a reload and a re-execution, and each went through.
    ups = [d for d in _decisions(sbx, began) if int(d["TO"]) > int(d["FROM"])]
    pins = [d for d in _decisions(sbx, began) if d.get("REASON") == "Pinned"]
    assert len(ups) >= 3 and len(pins) >= 2, (len(ups), len(pins))


def test_flexiqd_restarted_while_the_bus_cannot_start_waits_for_it_and_keeps_its_workers(bus_restored: Sandbox):
    """A restart of flexiqd (an upgrade, an operator) while the bus is down and cannot start (its
    units masked: as a bus whose start fails): the old daemon leaves its workers running without
    waiting for the bus, and the new one waits for systemd -- STATUS= says so -- instead of failing
    its start into a restart loop, then adopts the workers once the bus is back."""
    sbx = bus_restored
    began, _, load = _start(sbx)
    try:
        _enqueue_backlog(sbx, load)
        _wait_grown(sbx)
        before = _pids(sbx)
        sbx.run("systemctl stop dbus.socket dbus.service; systemctl mask --runtime dbus.socket dbus.service")
        away_at = time.time()
        sbx.run(f"systemctl restart --no-block {DAEMON}")
        waiting = sbx.wait_for(lambda: "waiting" in (s := sbx.unit_property(DAEMON, "StatusText")) and s,
                               60, interval=0.2, what="the new daemon to say it waits")
        waited_from = time.time() - away_at
        time.sleep(AWAY_SECONDS)
        sbx.run("systemctl unmask --runtime dbus.socket dbus.service; systemctl start dbus.socket")
        back_at = time.time()
        sbx.wait_for(lambda: sbx.unit_property(DAEMON, "ActiveState") == "active", 60, interval=0.1,
                     what="flexiqd to be up")
        up_s = time.time() - back_at
        api_s = _back_on_bus(sbx, back_at)
        after = _pids(sbx)
    finally:
        load.stop()
    journal = journal_entries(sbx, DAEMON, since=away_at)
    said = [e["MESSAGE"] for e in journal if ("aiting for systemd" in e.get("MESSAGE", ""))
            or "Reached systemd" in e.get("MESSAGE", "") or "leaving the workers" in e.get("MESSAGE", "")]
    report = {"status_while_away": waiting, "new_daemon_waiting_after_s": round(waited_from, 2),
              "journal": said[:5], "up_after_bus_s": round(up_s, 2),
              "flexiqctl_after_bus_s": round(api_s, 2),
              "daemon_restarts_by_systemd": int(sbx.unit_property(DAEMON, "NRestarts") or 0),
              "workers_before": before, "workers_after": after,
              "stopped_by_the_new_daemon": sorted(_stopped_by_daemon(sbx, away_at))}
    print("flexiqd restarted while the bus cannot start:", json.dumps(report, indent=1))
    assert waiting.startswith("waiting") and "systemd" in waiting, waiting
    assert report["daemon_restarts_by_systemd"] == 0  # it waited; it did not fail into Restart=
    assert any("Reached systemd after" in line for line in said), said
    # The workers ran on through the restart and the outage, and the new daemon adopted them
    # (it may have given back since what the finished backlog no longer needs).
    stopped = _stopped_by_daemon(sbx, away_at)
    assert {unit: pid for unit, pid in before.items() if after.get(unit) != pid and unit not in stopped} == {}
    states = wait_all_done(sbx, lambda: _states(sbx), len(load.enqueues.ids), 300)
    assert states == {"done": len(load.enqueues.ids)}
