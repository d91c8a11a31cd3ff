"""`make demo`: flexiqd with its SQLite queue and demo app, a burst of jobs, the fleet scaling live.

By default everything happens in a throw-away container booted with the
machine's own systemd (nothing on the host changes); ``--host`` installs into
the host's systemd instead (it must be PID 1) and leaves flexiqd running.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
BIN = REPO / ".venv" / "bin"
STORE = "sqlite:////var/lib/flexiq/queue.db"

# The shipped defaults, with windows short enough to watch the pool come back down.
DEMO_CONFIG = f"""
store: {STORE}
tick: 1s
pools:
  default:
    app: flexiqd.demo:queue
    concurrency: 4
    min_workers: 1
    max_workers: 12
    targets: {{age: 10s, lead_time: 2s}}
    # Workers start in a fraction of a second: allow faster steps than the defaults.
    behavior: {{down_window: 20s, up_limit: {{workers: 8, percent: 100, period: 5s}},
               down_limit: {{workers: 4, percent: 50, period: 5s}}}}
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


def show(machine, jobs: int, seconds: float) -> None:
    print(f"Enqueuing {jobs} jobs of flexiqd.demo.sleep {seconds:g}s (IO-bound) ...", flush=True)
    machine.run([str(BIN / "flexiq"), "--url", STORE, "enqueue", "flexiqd.demo.sleep", str(seconds),
                 "--count", str(jobs)])
    start = time.monotonic()
    peak, seen_work, cursor = 0, False, None
    print(f"{'time':>5}  {'workers':>7}  {'runnable':>8}  {'running':>7}  {'oldest':>7}  done/s", flush=True)
    while time.monotonic() - start < 600:
        workers, stats = snapshot(machine)
        peak = max(peak, workers)
        seen_work = seen_work or stats["running"] > 0
        print(f"{time.monotonic() - start:5.0f}s  {workers:7d}  {stats['runnable']:8d}  {stats['running']:7d}  "
              f"{stats['oldest_runnable_age']:6.1f}s  {stats['completion_rate']:.1f}", flush=True)
        journal = machine.run(["journalctl", "--no-pager", "-o", "cat", "-u", "flexiqd",
                               "--grep", " -> ", *(["--after-cursor", cursor] if cursor else []),
                               "--show-cursor"], check=False).stdout.splitlines()
        for line in journal:
            if line.startswith("-- cursor: "):
                cursor = line[len("-- cursor: "):]
            elif " -> " in line:
                print(f"        decision: {line.split(': ', 1)[-1]}", flush=True)
        if seen_work and stats["runnable"] == 0 and stats["running"] == 0 and workers <= 1:
            print(f"Drained back to {workers} worker after a peak of {peak}.", flush=True)
            return
        time.sleep(1)
    print("The demo did not finish within 10 minutes.", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", action="store_true", help="use this machine's systemd (PID 1)")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    if args.host:
        if not pathlib.Path("/run/systemd/system").is_dir():
            print("demo: this machine's PID 1 is not systemd; run `make demo` without HOST=1.", file=sys.stderr)
            return 1
        machine = Host()
        install(machine)
        show(machine, args.jobs, args.seconds)
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
        show(sandbox, args.jobs, args.seconds)
        print("Stopping flexiqd (the fleet drains) and the container.", flush=True)
        sandbox.run("systemctl stop flexiqd; true", timeout=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
