"""``flexiq backup``, ``move-store``, ``hosts`` and ``forget-host``: the store's operations.

Only parsing and printing: what each does lives in flexiqd.queue.backup, .move and
.host_admin.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

from ..durations import format_duration
from ..queue.url import open_backend, safe_url
from .store_choice import store_for_command

COMMANDS = ("backup", "move-store", "hosts", "forget-host")
CONFIG_PATH = "/etc/flexiqd/flexiqd.yaml"


def add_commands(commands: Any) -> None:
    """Add the operations' subcommands to ``flexiq``'s parser (``commands``: its subparsers)."""
    backup = commands.add_parser(
        "backup", help="copy a live SQLite store to a file, consistently, while the daemon and workers run")
    backup.add_argument("destination", metavar="DEST", help="the file to write (mode 0600)")
    backup.add_argument("--force", action="store_true", help="replace DEST if it exists")

    move = commands.add_parser(
        "move-store", help="move the SQLite store's jobs and schedules into an empty PostgreSQL store; "
                           "the daemon must be stopped")
    move.add_argument("--to", required=True, metavar="URL",
                      help="the PostgreSQL store, postgresql://user@host/database[?password_file=...]")
    move.add_argument("--without-history", action="store_true",
                      help="leave the finished jobs (done, cancelled) and their attempts behind")

    hosts = commands.add_parser("hosts", help="the hosts registered in the store: alive or dead, jobs running")
    hosts.add_argument("--json", action="store_true")

    forget = commands.add_parser(
        "forget-host", help="forget a dead host: hand its expired jobs back to the queue and remove it")
    forget.add_argument("name", metavar="NAME", help="the host's name, as `flexiq hosts` lists it")
    forget.add_argument("--force", action="store_true", help="forget it even though it beat recently")


def run(args: argparse.Namespace) -> int:
    """Run the operation ``args.command`` names; 0 when done (errors raise FlexiqdError)."""
    handlers: dict[str, Callable[[argparse.Namespace, str], int]] = {
        "backup": _backup, "move-store": _move, "hosts": _hosts, "forget-host": _forget}
    store = store_for_command(args.url)  # as the queue commands choose it
    if store.note:
        print(f"flexiq: {store.note}", file=sys.stderr)
    return handlers[args.command](args, store.url)


def _backup(args: argparse.Namespace, url: str) -> int:
    from ..queue.backup import backup_store

    report = backup_store(url, args.destination, force=args.force)
    print(f"backed up {safe_url(url)} to {report.destination} ({_size(report.size)}, integrity check ok)")
    print(f"the copy holds {_jobs(report.jobs, report.jobs_by_state)}")
    return 0


def _move(args: argparse.Namespace, url: str) -> int:
    from ..queue.move import move_store

    report = move_store(url, args.to, history=not args.without_history)
    print(f"moved {report.source} to {report.target}, in one transaction:")
    print(f"  jobs: {_jobs(report.jobs, report.jobs_by_state)}, under their own ids")
    if report.left_behind:
        print(f"  left behind: {report.left_behind} finished jobs (--without-history)")
    print(f"  attempts' history: {report.executions} rows; schedules: {report.schedules} "
          f"(ledger: {report.ledger_rows} slots, pause state kept)")
    if report.recovered:
        print(f"  first handed back {report.recovered} jobs whose workers were gone (leases expired)")
    print("  not carried: the per-second rates, the recent dependency measurements, the hosts")
    state = "read-only and marked" if report.read_only else "marked (its mode could not be changed)"
    print(f"{report.source} is now {state} as moved: flexiqd, its workers and flexiq refuse it.")
    print(f"Next: set `store: {report.target}` (with your password source) in {CONFIG_PATH}, and the URL "
          f"that producers pass to Queue(...) or FLEXIQ_URL; then systemctl start flexiqd.")
    return 0


def _hosts(args: argparse.Namespace, url: str) -> int:
    from ..queue.host_admin import list_hosts

    backend = open_backend(url)
    try:
        now = backend.clock()  # the store's time: the beats are in it
        rows = list_hosts(backend, now=now)
    finally:
        backend.close()
    if args.json:
        print(json.dumps([{"name": row.info.name, "alive": row.info.alive, "last_beat": row.info.last_beat,
                           "interval": row.info.interval, "registered_at": row.info.registered_at,
                           "running": row.running, "pools": sorted(row.info.report.get("pools") or {})}
                          for row in rows], indent=2))
        return 0
    if not rows:
        print(f"no host is registered in {safe_url(url)} (a daemon registers its host when it starts)")
        return 0
    table = [("HOST", "STATE", "LAST BEAT", "RUNNING", "POOLS")]
    for row in rows:
        table.append((row.info.name, "alive" if row.info.alive else "dead",
                      f"{format_duration(max(0.0, now - row.info.last_beat))} ago", str(row.running),
                      ",".join(sorted(row.info.report.get("pools") or {})) or "-"))
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
    return 0


def _forget(args: argparse.Namespace, url: str) -> int:
    from ..queue.host_admin import forget_host

    backend = open_backend(url)
    try:
        done = forget_host(backend, args.name, force=args.force, now=backend.clock())
    finally:
        backend.close()
    print(f"forgot host {done.name}: {done.handed_back} running jobs handed back to the queue (no attempt used)")
    if done.still_leased:
        print(f"{done.still_leased} jobs are still leased to its workers: a daemon hands them back when "
              f"their leases expire (as lost attempts)")
    return 0


def _jobs(total: int, by_state: dict[str, int]) -> str:
    parts = ", ".join(f"{state} {n}" for state, n in sorted(by_state.items()))
    return f"{total} job{'s' if total != 1 else ''}" + (f" ({parts})" if parts else "")


def _size(size: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} bytes"
