"""`make demo`: flexiqd with its SQLite queue and demo app, a burst of jobs, the fleet scaling live.

Every time is in seconds since the burst was committed (its jobs' enqueued_at).
The view is one timeline: a row per sample and a line per decision (read from
the journal by their MESSAGE_ID and fields) at the decision's own time.  On a
terminal it redraws in place; piped, it prints a row when the numbers change.
At the end the store tells when each worker the burst brought claimed its first
job; the start chain is summed up in a line and the run drawn into a PNG
(demo/plot.py) whose path is printed.

By default everything happens in a throw-away container booted with the
machine's own systemd (nothing on the host changes); ``--host`` installs into
the host's systemd instead (it must be PID 1) and leaves flexiqd running.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # plot.py beside this file

from chain import UNIT_PROPERTIES, Unit, chain_summary, new_worker_starts, parse_units, release, timeline  # noqa: E402
from plot import Sample, ScaleDecision, draw  # noqa: E402

from flexiqd.cli.live import LiveView  # noqa: E402
from flexiqd.logs import MessageId  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
BIN = REPO / ".venv" / "bin"
STORE = "sqlite:////var/lib/flexiq/queue.db"
TARGET_AGE = 10.0  # seconds: the pool's age target below
DEFAULT_PLOT = REPO / "demo" / "out" / "demo.png"
TABLE_HEADER = f"{'time':>7}  {'workers':>7}  {'runnable':>8}  {'running':>7}  {'oldest':>7}  done/s"

# The shipped policy (an idle worker is given back once holding it costs more than a
# start), with an age target short enough to watch: 300 two-second jobs need 15 workers
# to start within 10 s.
DEMO_CONFIG = f"""
store: {STORE}
tick: 1s
pools:
  default:
    app: flexiqd.demo:queue
    concurrency: 4
    min_workers: 1
    max_workers: 16
    targets: {{age: {TARGET_AGE:g}s}}
"""


class Host:
    """Runs commands on this machine's own systemd."""

    def run(self, cmd, check=True, input=None):
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else cmd
        return subprocess.run(argv, check=check, capture_output=True, text=True, input=input)

    def write_file(self, path, text, mode=0o644):
        target = pathlib.Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(mode)


def unit_text(name: str) -> str:
    text = (REPO / "units" / name).read_text()
    return text.replace("/usr/bin/flexiqd ", f"{BIN}/flexiqd ").replace("/usr/bin/flexiq ", f"{BIN}/flexiq ")


def install(machine) -> None:
    machine.write_file("/etc/sysusers.d/flexiqd.conf", (REPO / "units" / "flexiqd.sysusers").read_text())
    machine.write_file("/etc/tmpfiles.d/flexiqd.conf", (REPO / "units" / "flexiqd.tmpfiles").read_text())
    machine.run(["systemd-sysusers"])
    machine.run(["systemd-tmpfiles", "--create", "/etc/tmpfiles.d/flexiqd.conf"])
    machine.write_file("/etc/flexiqd/flexiqd.yaml", DEMO_CONFIG)
    machine.write_file("/etc/systemd/system/flexiqd.service", unit_text("flexiqd.service"))
    machine.write_file("/etc/systemd/system/flexiq-worker@.service", unit_text("flexiq-worker@.service"))
    # The units run the checkout's .venv: keep it visible behind PrivateTmp= if it lies below /tmp.
    for unit in ("flexiqd.service", "flexiq-worker@.service"):
        machine.write_file(f"/etc/systemd/system/{unit}.d/10-checkout.conf", f"[Service]\nBindReadOnlyPaths={REPO}\n")
    policy = REPO / "units" / "org.flexiq.flexiqd1.conf"
    if policy.exists():
        machine.write_file("/etc/dbus-1/system.d/org.flexiq.flexiqd1.conf", policy.read_text())
        machine.run("systemctl reload dbus || true")
    machine.run(["systemctl", "daemon-reload"])
    machine.run(["systemctl", "restart", "flexiqd"])


# Who ran what, for the first jobs: the store's attempts as JSON (no flexiq command lists them all).
EXECUTIONS = ("import json, sys; from flexiqd.queue import open_backend; "
              "print(json.dumps(open_backend(sys.argv[1]).executions()))")


def snapshot(machine) -> tuple[list[Unit], dict]:
    # The stats first: `flexiq` takes a while to start and reads the store just before it ends,
    # then systemctl answers at once, so both are read just before the sample's time is taken.
    stats = json.loads(machine.run([str(BIN / "flexiq"), "--url", STORE, "stats", "--json",
                                    "--queue", "default"]).stdout)["default"]
    units = machine.run(["systemctl", "show", "--timestamp=us+utc", "-p", UNIT_PROPERTIES,
                         "flexiq-worker@*.service"]).stdout
    return parse_units(units), stats


def burst_time(machine) -> float:
    """When the burst was committed: the newest job's enqueued_at (one enqueue, one time)."""
    [job] = json.loads(machine.run([str(BIN / "flexiq"), "--url", STORE, "jobs", "list", "--queue", "default",
                                    "--limit", "1", "--json"]).stdout)
    return float(job["enqueued_at"])


def new_decisions(machine, cursor: str | None, since: float) -> tuple[list[dict], str | None]:
    """flexiqd's scale decisions logged after ``cursor`` (the first time: since ``since``, epoch),
    found by their journal fields."""
    after = ["--after-cursor", cursor] if cursor else [f"--since=@{int(since)}"]
    out = machine.run(["journalctl", "--no-pager", "-o", "json", "-u", "flexiqd", "POOL=default",
                       f"MESSAGE_ID={MessageId.SCALE_DECISION}", *after], check=False).stdout
    entries = [json.loads(line) for line in out.splitlines() if line.strip()]
    return entries, entries[-1]["__CURSOR"] if entries else cursor


def decision_from(entry: dict, origin: float) -> ScaleDecision:
    # MESSAGE reads "<logger>: <pool> <from> -> <to>: <REASON>: <rationale>".
    _, marker, rationale = entry["MESSAGE"].partition(f"{entry['REASON']}: ")
    return ScaleDecision(at=int(entry["__REALTIME_TIMESTAMP"]) / 1e6 - origin, previous=int(entry["FROM"]),
                         desired=int(entry["TO"]), reason=entry["REASON"], rationale=rationale if marker else "")


def sample_row(sample: Sample) -> str:
    return (f"{sample.at:6.1f}s  {sample.workers:7d}  {sample.runnable:8d}  {sample.running:7d}  "
            f"{sample.oldest_age:6.1f}s  {sample.completion_rate:.1f}")


def decision_row(decision: ScaleDecision) -> str:
    # Before the burst (the pool's first worker) a decision's time is negative: shown as it is.
    return (f"{decision.at:6.1f}s  decision: {decision.previous} -> {decision.desired} {decision.reason}"
            + (f": {decision.rationale}" if decision.rationale else ""))


def row(entry: Sample | ScaleDecision) -> str:
    return sample_row(entry) if isinstance(entry, Sample) else decision_row(entry)


def screen(title: str, samples: list[Sample], decisions: list[ScaleDecision], peak: int, rows: int = 12) -> str:
    """The live view: the latest ``rows`` lines of the timeline, decisions among the samples."""
    latest = samples[-1] if samples else None
    lines = [title, "", f"peak {peak} workers" + (f", now {latest.workers}" if latest else ""), "", TABLE_HEADER]
    return "\n".join(lines + [row(e) for e in timeline(samples, decisions)[-rows:]])


def show(machine, jobs: int, seconds: float, plot_path: pathlib.Path, since: float) -> None:
    """The burst and the live view until the pool drained, then the start chain and the picture.

    ``since``: when flexiqd was (re)started for the demo, so no older decision is shown.
    """
    title = f"{jobs} jobs of flexiqd.demo.sleep {seconds:g}s (IO-bound), pool default"
    print(f"Enqueuing {title} ...", flush=True)
    machine.run([str(BIN / "flexiq"), "--url", STORE, "enqueue", "flexiqd.demo.sleep", str(seconds),
                 "--count", str(jobs)])
    origin = burst_time(machine)
    samples: list[Sample] = []
    decisions: list[ScaleDecision] = []
    pending: list[Sample | ScaleDecision] = []  # piped: lines not yet printed, see chain.release
    units: dict[tuple[str, int], Unit] = {}     # every worker process seen, by (instance, pid)
    peak, seen_work, cursor, last_shown = 0, False, None, None
    outcome = "The demo did not finish within 10 minutes."
    with LiveView(sys.stdout) as view:
        if not view.tty:
            print(TABLE_HEADER, flush=True)
        while time.time() - origin < 600:
            seen, stats = snapshot(machine)
            units.update({(u.instance, u.pid): u for u in seen if u.pid})
            workers = sum(u.active for u in seen)
            sample = Sample(at=time.time() - origin, workers=workers, runnable=stats["runnable"],
                            running=stats["running"], oldest_age=stats["oldest_runnable_age"],
                            completion_rate=stats["completion_rate"])
            samples.append(sample)
            peak = max(peak, workers)
            seen_work = seen_work or stats["running"] > 0
            # Read after the snapshot: every decision up to the sample's time is in the journal by now.
            entries, cursor = new_decisions(machine, cursor, since)
            fresh = [decision_from(e, origin) for e in entries]
            decisions += fresh
            if view.tty:
                # As many lines as fit below the title and the table's heading (5 lines).
                view.show(screen(title, samples, decisions, peak, max(3, shutil.get_terminal_size().lines - 6)))
            else:
                # A pipe or a log: a row when something but the clock changed, and each decision.
                shown = (sample.workers, sample.runnable, sample.running)
                pending += fresh + ([sample] if shown != last_shown else [])
                last_shown = shown
                due, pending = release(pending, horizon=sample.at)
                for entry in due:
                    print(row(entry), flush=True)
            if seen_work and stats["runnable"] == 0 and stats["running"] == 0 and workers <= 1:
                outcome = f"Drained back to {workers} worker after a peak of {peak}."
                break
            time.sleep(1)
        for entry in pending:
            print(row(entry), flush=True)
    print(outcome, flush=True)
    executions = json.loads(machine.run([str(BIN / "python"), "-c", EXECUTIONS, STORE]).stdout)
    starts = new_worker_starts(executions, units.values(), origin)
    summary = chain_summary(decisions, starts)
    print(f"Start chain: {summary}", flush=True)
    if samples:
        draw(samples, decisions, plot_path, target_age=TARGET_AGE, starts=starts, chain=summary,
             title=f"make demo: {title}; {len(decisions)} decisions, peak {peak} workers")
        print(f"Picture of this run: {plot_path}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", action="store_true", help="use this machine's systemd (PID 1)")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--plot", type=pathlib.Path, default=DEFAULT_PLOT, metavar="PNG",
                        help=f"where to draw the picture of the run (default: {DEFAULT_PLOT.relative_to(REPO)})")
    args = parser.parse_args()
    if args.host:
        if not pathlib.Path("/run/systemd/system").is_dir():
            print("demo: this machine's PID 1 is not systemd; run `make demo` without HOST=1.", file=sys.stderr)
            return 1
        machine, since = Host(), time.time()
        install(machine)
        show(machine, args.jobs, args.seconds, args.plot, since)
        print("flexiqd keeps running: try `flexiqctl status`, or `systemctl stop flexiqd`.")
        return 0
    sys.path.insert(0, str(REPO / "tests"))
    from system.sandbox import Sandbox, unavailable_reason

    reason = unavailable_reason()
    if reason:
        print(f"demo: cannot boot a systemd sandbox here: {reason}", file=sys.stderr)
        return 1
    print("Booting a throw-away systemd container (this machine's own OS, nothing on the host changes) ...",
          flush=True)
    with Sandbox() as sandbox:
        since = time.time()
        install(sandbox)
        show(sandbox, args.jobs, args.seconds, args.plot, since)
        print("Stopping flexiqd (the fleet drains) and the container.", flush=True)
        sandbox.run("systemctl stop flexiqd; true", timeout=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
