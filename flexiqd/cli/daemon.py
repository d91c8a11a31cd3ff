"""``flexiqd``: the autoscaling daemon (run by flexiqd.service) and its config checker."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

from ..config import DEFAULT_CONFIG_PATH, load_config
from ..errors import ConfigError, QueueError
from ..logs import setup_logging
from ..queue.url import probe_store, safe_url
from ..settings_schema import format_seconds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flexiqd", description="Autoscale flexiq-worker@ units from the state of their queues.")
    parser.add_argument("--config", default=DEFAULT_CONFIG_PATH, help="the config file (default: %(default)s)")
    parser.add_argument("--check-config", nargs="?", const=True, default=None, metavar="FILE",
                        help="validate the config file (or FILE), import each pool's app as its workers would, "
                             "show each schedule's next five fire times (UTC and its zone), and exit: "
                             "0 valid, 1 invalid or an app its workers could not run")
    parser.add_argument("--fleet", choices=["systemd", "process"], default=None,
                        help="where workers run (default: the config's 'fleet', else systemd)")
    parser.add_argument("--no-api", action="store_true",
                        help="do not offer the D-Bus API (flexiqctl) -- for machines without a system bus")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    return parser


def _version() -> str:
    from .. import __version__

    return __version__


# How many fire times --check-config shows of each schedule.
SHOWN_FIRES = 5


def schedule_lines(config, now: float) -> list[str]:
    """Each schedule's next fire times, in UTC and in its zone (``flexiqd --check-config``)."""
    from ..schedules.calendar import show_instant

    lines = []
    served = {queue for pool in config.pools.values() for queue in pool.queues}
    for name, schedule in sorted(config.schedules.items()):
        policy = schedule.catch_up
        lines.append(f"schedule {name}: {schedule.task} to queue {schedule.queue}, cron '{schedule.cron}' in "
                     f"{schedule.timezone}; catch_up {policy.catch_up}, max_delay {format_seconds(policy.max_delay)}, "
                     f"overlap {policy.overlap}")
        if schedule.queue not in served:
            lines.append(f"  note: no pool of this file serves queue {schedule.queue} (another host's may)")
        for instant in schedule.calendar.next_fires(now, SHOWN_FIRES):
            lines.append(f"  {show_instant(instant)}  =  {show_instant(instant, schedule.calendar.zone)}")
    return lines


def app_lines(probes) -> list[str]:
    """One line per pool: its app, who imported it with which python, and the tasks it registers."""
    lines = []
    for probe in probes:
        who = probe.identity.name + ("" if probe.identity.is_worker_user else " (not as the workers' user)")
        if probe.error is None:
            tasks = ", ".join(sorted(probe.tasks)) or "none"
            lines.append(f"pool {probe.pool}: app {probe.app} imports as {who} with {probe.python}; tasks: {tasks}")
        else:
            lines.append(f"pool {probe.pool}: app {probe.app} does not import as {who} with {probe.python}")
    return lines


def check_apps_and_say(config) -> bool:
    """Import each pool's app as its workers would; print what was found, errors and warnings
    on stderr.  False when a worker of some pool could not run."""
    from ..apps.check import check_apps

    probes, findings = check_apps(config)
    for line in app_lines(probes):
        print(line)
    for finding in findings:
        print(f"flexiqd: {finding}", file=sys.stderr)
    return not any(finding.severity == "error" for finding in findings)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.check_config is not None:
        path = args.config if args.check_config is True else args.check_config
        try:
            config = load_config(path, fleet=args.fleet)
            reached = probe_store(config.store)
        except ConfigError as exc:
            print(f"flexiqd: {exc}", file=sys.stderr)
            return 1
        except QueueError as exc:
            print(f"flexiqd: {path}: store: {exc}", file=sys.stderr)
            return 1
        print(f"{path}: valid; pools: {', '.join(sorted(config.pools)) or 'none'}; "
              f"store {safe_url(config.store)}{f' ({reached})' if reached else ''}; fleet {config.fleet}")
        for line in schedule_lines(config, time.time()):
            print(line)
        return 0 if check_apps_and_say(config) else 1
    setup_logging(args.log_level)
    from ..daemon.service import DaemonOptions, run_daemon

    return run_daemon(DaemonOptions(config_path=args.config, fleet=args.fleet, serve_api=not args.no_api))


if __name__ == "__main__":
    sys.exit(main())
