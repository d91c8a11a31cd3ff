"""``flexiqd``: the autoscaling daemon (run by flexiqd.service) and its config checker."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from ..config import DEFAULT_CONFIG_PATH, load_config
from ..errors import ConfigError, QueueError
from ..logs import setup_logging
from ..queue.url import probe_store, safe_url


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flexiqd", description="Autoscale flexiq-worker@ units from the state of their queues.")
    parser.add_argument("--config", default=DEFAULT_CONFIG_PATH, help="the config file (default: %(default)s)")
    parser.add_argument("--check-config", nargs="?", const=True, default=None, metavar="FILE",
                        help="validate the config file (or FILE) and exit: 0 valid, 1 invalid")
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
        return 0
    setup_logging(args.log_level)
    from ..daemon.service import DaemonOptions, run_daemon

    return run_daemon(DaemonOptions(config_path=args.config, fleet=args.fleet, serve_api=not args.no_api))


if __name__ == "__main__":
    sys.exit(main())
