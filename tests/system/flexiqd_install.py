"""Installing this checkout's flexiqd into the sandbox, as the package would, and looking at it.

The units are the shipped ones with only the program paths pointed at the
checkout's virtual environment (the container sees the checkout at the same
path).  Test workers run ``tests/apps/counting_app.py``, which records every
execution in ``/var/lib/flexiq/marks`` so tests count executions, not results.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

from .sandbox import Sandbox

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"
STORE = "sqlite:////var/lib/flexiq/queue.db"
MARKS = "/var/lib/flexiq/marks"
DAEMON = "flexiqd.service"
BUS_NAME = "org.flexiq.flexiqd1"

CONFIG = f"""
store: {STORE}
tick: 500ms
pools:
  default:
    app: counting_app:queue
    concurrency: 2
    min_workers: 1
    max_workers: 6
    drain_timeout: 20s
    environment:
      PYTHONPATH: {REPO / "tests" / "apps"}
      FLEXIQ_TEST_MARKS: {MARKS}
    targets: {{age: 2s, lead_time: 1s}}
    behavior:
      down_window: 4s
      up_limit: {{workers: 6, percent: 100, period: 1s}}
      down_limit: {{workers: 6, percent: 100, period: 1s}}
"""


# The units run programs from the checkout's .venv; where the checkout lies below /tmp
# their PrivateTmp= would hide it, so it is bound into their namespace (read-only).
CHECKOUT_DROPIN = f"[Service]\nBindReadOnlyPaths={REPO}\n"


def unit_text(name: str, tree: Path = REPO) -> str:
    """A shipped unit of ``tree`` (this checkout, or another release's), its programs those of
    ``tree``'s .venv."""
    text = (tree / "units" / name).read_text()
    bin_ = tree / ".venv" / "bin"
    return text.replace("/usr/bin/flexiqd ", f"{bin_}/flexiqd ").replace("/usr/bin/flexiq ", f"{bin_}/flexiq ")


def install(sbx: Sandbox, config: str = CONFIG, *, daemon_dropin: str | None = None,
            before_start: str | None = None, tree: Path = REPO) -> None:
    """Stop any previous flexiqd and its workers, wipe its state, install and start afresh.

    ``before_start``: a shell script run once the state folders exist, just before the daemon
    starts (a fault test mounts a small file system over /var/lib/flexiq there); ``tree``: the
    release to install, a folder inside the checkout with its own .venv (the previous release
    for the rolling-upgrade test)."""
    sbx.run(f"systemctl stop {DAEMON} 'flexiq-worker@*' 2>/dev/null; "
            "systemctl reset-failed 'flexiq-worker@*' flexiqd.service 2>/dev/null; "
            "rm -rf /var/lib/flexiq /var/lib/flexiqd /var/lib/flexiq-worker /run/systemd/system/flexiq-worker@*.d "
            "/etc/systemd/system/flexiqd.service.d; true")
    sbx.write_file("/etc/sysusers.d/flexiqd.conf", (tree / "units" / "flexiqd.sysusers").read_text())
    sbx.write_file("/etc/tmpfiles.d/flexiqd.conf", (tree / "units" / "flexiqd.tmpfiles").read_text())
    sbx.run(["systemd-sysusers"])
    sbx.run(["systemd-tmpfiles", "--create", "/etc/tmpfiles.d/flexiqd.conf"])
    sbx.run(f"install -d -m 0777 -o flexiq -g flexiq {MARKS}")
    sbx.write_file("/etc/flexiqd/flexiqd.yaml", config)
    sbx.write_file(f"/etc/dbus-1/system.d/{BUS_NAME}.conf", (tree / "units" / f"{BUS_NAME}.conf").read_text())
    sbx.run(["systemctl", "reload", "dbus"])
    sbx.write_file(f"/etc/systemd/system/{DAEMON}", unit_text("flexiqd.service", tree))
    sbx.write_file("/etc/systemd/system/flexiq-worker@.service", unit_text("flexiq-worker@.service", tree))
    for unit in (DAEMON, "flexiq-worker@.service"):
        sbx.write_file(f"/etc/systemd/system/{unit}.d/10-checkout.conf", CHECKOUT_DROPIN)
    if daemon_dropin:
        sbx.write_file(f"/etc/systemd/system/{DAEMON}.d/50-test.conf", daemon_dropin)
    sbx.systemctl("daemon-reload")
    if before_start:
        sbx.script(before_start)
    started = sbx.systemctl("start", DAEMON, check=False)
    if started.returncode != 0:
        tail = sbx.run(f"journalctl --no-pager -n 25 -u {DAEMON}", check=False).stdout
        raise AssertionError(f"flexiqd did not start:\n{started.stderr}\n{tail}")


def flexiq(sbx: Sandbox, *args: str, check: bool = True):
    return sbx.run([str(BIN / "flexiq"), "--url", STORE, *args], check=check)


def enqueue(sbx: Sandbox, seconds: float, count: int) -> None:
    flexiq(sbx, "enqueue", "count", str(seconds), "--count", str(count))


def stats(sbx: Sandbox) -> dict:
    return json.loads(flexiq(sbx, "stats", "--json", "--queue", "default").stdout)["default"]


def workers(sbx: Sandbox, state: str = "active") -> list[str]:
    out = sbx.run(["systemctl", "list-units", "--plain", "--no-legend", f"--state={state}",
                   "flexiq-worker@*.service"]).stdout
    return sorted(line.split()[0] for line in out.splitlines() if line.strip())


def main_pids(sbx: Sandbox, units: list[str]) -> dict[str, str]:
    return {unit: sbx.unit_property(unit, "MainPID") for unit in units}


def marks(sbx: Sandbox) -> tuple[collections.Counter, collections.Counter]:
    """(starts per job id, ends per job id) written by the tasks themselves."""
    text = sbx.run(f"cat {MARKS}/*.log 2>/dev/null || true").stdout
    starts: collections.Counter = collections.Counter()
    ends: collections.Counter = collections.Counter()
    for line in text.splitlines():
        what, job_id, _attempt, _pid = line.split()
        (starts if what == "start" else ends)[int(job_id)] += 1
    return starts, ends


def done_count(sbx: Sandbox) -> int:
    out = flexiq(sbx, "jobs", "list", "--state", "done", "--limit", "100000", "--json").stdout
    return len(json.loads(out))
