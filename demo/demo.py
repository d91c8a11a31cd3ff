"""`make demo`: flexiqd with its SQLite queue and demo app, a burst of jobs, the fleet scaling live.

On a terminal the view redraws in place; piped, it prints a line when the
numbers change and one per decision (read from the journal by their
MESSAGE_ID and fields).  At the end the run is drawn into a PNG (demo/plot.py)
whose path is printed.

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

from plot import Sample, ScaleDecision, draw  # noqa: E402

from flexiqd.cli.live import LiveView  # noqa: E402
from flexiqd.logs import MessageId  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
BIN = REPO / ".venv" / "bin"
STORE = "sqlite:////var/lib/flexiq/queue.db"
TARGET_AGE = 10.0  # seconds: the pool's age target below
DEFAULT_PLOT = REPO / "demo" / "out" / "demo.png"
TABLE_HEADER = f"{'time':>6}  {'workers':>7}  {'runnable':>8}  {'running':>7}  {'oldest':>7}  done/s"

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


def snapshot(machine) -> tuple[int, dict]:
    units = machine.run(["systemctl", "list-units", "--plain", "--no-legend", "--state=active",
                         "flexiq-worker@*.service"]).stdout
    stats = json.loads(machine.run([str(BIN / "flexiq"), "--url", STORE, "stats", "--json",
                                    "--queue", "default"]).stdout)["default"]
    return len([line for line in units.splitlines() if line.strip()]), stats


def new_decisions(machine, cursor: str | None) -> tuple[list[dict], str | None]:
    """flexiqd's scale decisions logged after ``cursor``, found by their journal fields."""
    out = machine.run(["journalctl", "--no-pager", "-o", "json", "-u", "flexiqd", "POOL=default",
                       f"MESSAGE_ID={MessageId.SCALE_DECISION}", *(["--after-cursor", cursor] if cursor else [])],
                      check=False).stdout
    entries = [json.loads(line) for line in out.splitlines() if line.strip()]
    return entries, entries[-1]["__CURSOR"] if entries else cursor


def decision_from(entry: dict, start: float) -> ScaleDecision:
    return ScaleDecision(at=int(entry["__REALTIME_TIMESTAMP"]) / 1e6 - start, previous=int(entry["FROM"]),
                         desired=int(entry["TO"]), reason=entry["REASON"])


def sample_row(sample: Sample) -> str:
    return (f"{sample.at:5.0f}s  {sample.workers:7d}  {sample.runnable:8d}  {sample.running:7d}  "
            f"{sample.oldest_age:6.1f}s  {sample.completion_rate:.1f}")


def decision_row(decision: ScaleDecision, rationale: str = "") -> str:
    # A decision taken just before the burst was enqueued (the first worker) shows as at 0s.
    return f"{max(0.0, decision.at):5.0f}s  decision: {decision.previous} -> {decision.desired} {decision.reason}" + (
        f": {rationale}" if rationale else "")


def screen(title: str, samples: list[Sample], decisions: list[str], peak: int, rows: int = 12) -> str:
    """The live view: the latest samples as a table, the latest decisions below it."""
    latest = samples[-1] if samples else None
    lines = [title, "", f"peak {peak} workers" + (f", now {latest.workers}" if latest else ""), "", TABLE_HEADER]
    lines += [sample_row(s) for s in samples[-rows:]]
    lines += ["", "decisions (newest last):"] + (decisions[-6:] or ["  none yet"])
    return "\n".join(lines)


def show(machine, jobs: int, seconds: float, plot_path: pathlib.Path) -> None:
    title = f"{jobs} jobs of flexiqd.demo.sleep {seconds:g}s (IO-bound), pool default"
    print(f"Enqueuing {title} ...", flush=True)
    machine.run([str(BIN / "flexiq"), "--url", STORE, "enqueue", "flexiqd.demo.sleep", str(seconds),
                 "--count", str(jobs)])
    start = time.time()
    samples: list[Sample] = []
    decisions: list[ScaleDecision] = []
    decision_lines: list[str] = []
    peak, seen_work, cursor, last_shown = 0, False, None, None
    outcome = "The demo did not finish within 10 minutes."
    with LiveView(sys.stdout) as view:
        if not view.tty:
            print(TABLE_HEADER, flush=True)
        while time.time() - start < 600:
            workers, stats = snapshot(machine)
            sample = Sample(at=time.time() - start, workers=workers, runnable=stats["runnable"],
                            running=stats["running"], oldest_age=stats["oldest_runnable_age"],
                            completion_rate=stats["completion_rate"])
            samples.append(sample)
            peak = max(peak, workers)
            seen_work = seen_work or stats["running"] > 0
            entries, cursor = new_decisions(machine, cursor)
            fresh = [(decision_from(e, start), e["MESSAGE"].split(": ", 1)[-1]) for e in entries]
            decisions += [d for d, _ in fresh]
            decision_lines += [decision_row(d, text.split(": ", 2)[-1]) for d, text in fresh]
            if view.tty:
                # As many samples as fit above the decisions (13 lines of title, headings, decisions).
                rows = max(3, shutil.get_terminal_size().lines - 14)
                view.show(screen(title, samples, decision_lines, peak, rows))
            else:
                # A pipe or a log: a line when something but the clock changed, and each decision.
                shown = (sample.workers, sample.runnable, sample.running)
                if shown != last_shown:
                    print(sample_row(sample), flush=True)
                    last_shown = shown
                for line in decision_lines[len(decision_lines) - len(fresh):]:
                    print(line, flush=True)
            if seen_work and stats["runnable"] == 0 and stats["running"] == 0 and workers <= 1:
                outcome = f"Drained back to {workers} worker after a peak of {peak}."
                break
            time.sleep(1)
    print(outcome, flush=True)
    if samples:
        draw(samples, decisions, plot_path, target_age=TARGET_AGE,
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
        machine = Host()
        install(machine)
        show(machine, args.jobs, args.seconds, args.plot)
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
        install(sandbox)
        show(sandbox, args.jobs, args.seconds, args.plot)
        print("Stopping flexiqd (the fleet drains) and the container.", flush=True)
        sandbox.run("systemctl stop flexiqd; true", timeout=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
