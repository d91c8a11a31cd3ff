"""``flexiqctl``: watch and steer flexiqd over D-Bus (``org.flexiq.flexiqd1`` on the system bus).

Reading (status, events, watch) is open to every user; changing (scale, unpin,
pause, resume, drain, restart, reload) takes root or membership of the ``flexiq-admin`` group.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from typing import Any, Callable, Sequence

from ..busnames import (BUS_NAME, DBUS_INTERFACE, DBUS_NAME, DBUS_PATH, DEFAULT_SYSTEM_BUS, ERROR_ACCESS_DENIED,
                        ERROR_DISCONNECTED, ERROR_NAME_HAS_NO_OWNER, ERROR_NO_REPLY, ERROR_SERVICE_UNKNOWN,
                        ERROR_TIMEOUT, ERROR_UNKNOWN_INTERFACE, ERROR_UNKNOWN_METHOD, ERROR_UNKNOWN_OBJECT,
                        INTERFACE, OBJECT_PATH, SIGNAL_CONFIG_RELOADED, SIGNAL_SCALE_EVENT)
from ..durations import format_duration
from .argtypes import duration, whole_number
from .live import LiveView
from .render import render_event, render_schedules, render_status, restart_progress

EXIT_OK = 0
EXIT_ERROR = 1        # the daemon refused or failed the request; its message is printed
EXIT_USAGE = 2        # bad command-line arguments (argparse's own code)
EXIT_NOT_RUNNING = 3  # nothing to talk to: no flexiqd on the bus (not running, or connecting again
                      # after the bus restarted), or no bus at all
EXIT_INTERRUPTED = 130

CALL_TIMEOUT = 30.0      # seconds for one call; D-Bus's own default is 25s
RELOAD_TIMEOUT = 30.0    # seconds for flexiqd to report a reload's outcome
RESTART_POLL = 0.5       # seconds between reads of a restart's progress (restart --wait)
MAX_UINT32 = 2**32 - 1

START_HINT = "start it with: systemctl start flexiqd"
ACCESS_HINT = "run flexiqctl as root or as a member of the flexiq-admin group"
# A running flexiqd is off the bus for a moment when the bus restarts: it connects again by itself.
GAP_HINT = "or it is connecting again after a restart of the system bus: try again in a few seconds"


class CtlError(Exception):
    """A failure to report in one line, with the exit code it means."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(" ".join(message.split()))
        self.code = code


def error_from_reply(name: str, text: str, where: str) -> CtlError:
    """A D-Bus error reply as flexiqctl reports it: the one table of error names."""
    if name in (ERROR_SERVICE_UNKNOWN, ERROR_NAME_HAS_NO_OWNER):
        return CtlError(f"flexiqd cannot be reached: nothing owns {BUS_NAME} on {where} (flexiqd is not running, "
                        f"{GAP_HINT}); {START_HINT}", EXIT_NOT_RUNNING)
    if name == ERROR_ACCESS_DENIED:
        return CtlError(f"permission denied ({ACCESS_HINT}){_refusal(text)}")
    if name == ERROR_DISCONNECTED:
        return CtlError(f"lost the connection to the bus at {where} (the bus restarted, or flexiqd stopped); "
                        f"try again in a few seconds, or {START_HINT}", EXIT_NOT_RUNNING)
    if name in (ERROR_NO_REPLY, ERROR_TIMEOUT):
        return CtlError(f"flexiqd did not answer: {text}")
    if name in (ERROR_UNKNOWN_METHOD, ERROR_UNKNOWN_OBJECT, ERROR_UNKNOWN_INTERFACE):
        return CtlError(f"the flexiqd on {where} does not understand this request (a different version?): {text}")
    return CtlError(text or name)


def _refusal(text: str) -> str:
    """What to add to "permission denied": dbus-daemon's own refusal is a dump of the message's
    header fields, of which the refused request is all a user needs; flexiqd's words are kept."""
    if not text.startswith("Rejected send message"):
        return f": {text}" if text else ""
    member = re.search(r'member="([^"]*)"', text)
    return f": the system bus's policy refused {member.group(1)}" if member else ""


def bus_address(option: str | None) -> str:
    """--bus-address, else $DBUS_SYSTEM_BUS_ADDRESS, else the standard system bus socket."""
    return option or os.environ.get("DBUS_SYSTEM_BUS_ADDRESS") or DEFAULT_SYSTEM_BUS


class Client:
    """One connection to flexiqd's API.  Async; use from one event loop only."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.bus: Any = None

    async def connect(self) -> None:
        try:
            from dbus_fast.aio import MessageBus
        except ImportError:
            raise CtlError("flexiqctl needs the dbus-fast Python package (Debian: python3-dbus-fast)") from None
        try:
            self.bus = await asyncio.wait_for(MessageBus(bus_address=self.address).connect(), CALL_TIMEOUT)
        except Exception as exc:  # OSError, a timeout, or dbus-fast's AuthError and plain Exceptions
            raise CtlError(f"cannot reach the system bus at {self.address} ({exc or type(exc).__name__}), so "
                           f"flexiqd cannot be reached either (is the bus restarting?); {START_HINT}",
                           EXIT_NOT_RUNNING) from None

    def close(self) -> None:
        if self.bus is not None:
            self.bus.disconnect()

    async def call(self, member: str, signature: str = "", body: Sequence[Any] = (), *,
                   interface: str = INTERFACE, destination: str = BUS_NAME,
                   path: str = OBJECT_PATH) -> list[Any]:
        """The reply's body; a CtlError for an error reply, a lost connection or no answer in time."""
        from dbus_fast import Message, MessageType

        message = Message(destination=destination, path=path, interface=interface, member=member,
                          signature=signature, body=list(body))
        try:
            reply = await asyncio.wait_for(self.bus.call(message), CALL_TIMEOUT)
        except asyncio.TimeoutError:
            raise CtlError(f"flexiqd did not answer {member} within {CALL_TIMEOUT:.0f}s") from None
        except Exception as exc:  # dbus-fast fails a pending call with the connection's own error
            raise CtlError(f"lost the connection to the bus at {self.address} ({exc or type(exc).__name__}): "
                           f"the bus restarted, or flexiqd stopped; try again in a few seconds", EXIT_NOT_RUNNING) from None
        if reply.message_type is MessageType.ERROR:
            raise error_from_reply(reply.error_name or "", reply.body[0] if reply.body else "", self.address)
        return list(reply.body)

    async def subscribe(self, member: str, handler: Callable[[list[Any]], None]) -> None:
        """Call ``handler(body)`` for each of flexiqd's ``member`` signals from now on."""
        from dbus_fast import MessageType

        def on_message(message: Any) -> None:
            if (message.message_type is MessageType.SIGNAL and message.path == OBJECT_PATH
                    and message.interface == INTERFACE and message.member == member):
                handler(list(message.body))

        self.bus.add_message_handler(on_message)
        rule = (f"type='signal',sender='{BUS_NAME}',path='{OBJECT_PATH}',interface='{INTERFACE}',"
                f"member='{member}'")
        await self.call("AddMatch", "s", [rule], interface=DBUS_INTERFACE, destination=DBUS_NAME, path=DBUS_PATH)

    async def status(self) -> dict[str, Any]:
        return json.loads((await self.call("Status"))[0])

    async def events(self, since: int) -> list[dict[str, Any]]:
        return json.loads((await self.call("Events", "t", [since]))[0])


# -- commands -------------------------------------------------------------------------------------

def _say(text: str) -> None:
    print(text, flush=True)


async def cmd_status(client: Client, args: argparse.Namespace) -> int:
    document = await client.status()
    _say(json.dumps(document, indent=2) if args.json else render_status(document))
    return EXIT_OK


def _show_event(event: dict[str, Any], as_json: bool) -> None:
    _say(json.dumps(event) if as_json else render_event(event))


async def cmd_events(client: Client, args: argparse.Namespace) -> int:
    signals: asyncio.Queue = asyncio.Queue()
    if args.follow:
        # Subscribe before reading the history: an event between the two is not lost.
        await client.subscribe(SIGNAL_SCALE_EVENT, signals.put_nowait)
    shown = 0  # the sequence number printed last
    for event in await client.events(args.since):
        _show_event(event, args.json)
        shown = max(shown, event["seq"])
    if not args.follow:
        return EXIT_OK
    disconnected = asyncio.ensure_future(client.bus.wait_for_disconnect())
    while True:
        getter = asyncio.ensure_future(signals.get())
        await asyncio.wait([getter, disconnected], return_when=asyncio.FIRST_COMPLETED)
        if not getter.done():
            getter.cancel()
            raise CtlError(f"lost the connection to {client.address}", EXIT_NOT_RUNNING)
        shown = await follow_event(client, getter.result(), shown, args.since, args.json)


async def follow_event(client: Client, body: list[Any], shown: int, since: int, as_json: bool) -> int:
    """Print the event one ScaleEvent signal announces (and any before it not printed yet).

    ``shown`` is the sequence number printed last; the one printed last after this is returned.
    The full record (time, rationale) comes from Events; the signal's own sequence
    number says whether it was printed already.  An event Events does not return
    (no longer kept, or not after ``--since``) is printed from the signal itself.
    """
    pool, previous, desired, reason, seq = body
    if seq <= shown:
        return shown
    for event in await client.events(max(shown, since)):
        _show_event(event, as_json)
        shown = max(shown, event["seq"])
    if shown < seq:
        _show_event({"seq": seq, "at": time.time(), "pool": pool, "previous": previous,
                     "desired": desired, "reason": reason, "rationale": ""}, as_json)
        shown = seq
    return shown


async def cmd_scale(client: Client, args: argparse.Namespace) -> int:
    await client.call("Scale", "sud", [args.pool, args.workers, args.for_seconds or 0.0])
    held = (f"for {format_duration(args.for_seconds)}" if args.for_seconds
            else f"until: flexiqctl unpin {args.pool}")
    _say(f"{args.pool}: pinned at {args.workers} workers {held}.")
    return EXIT_OK


SIMPLE_COMMANDS = {
    "unpin": ("Unpin", "{pool}: unpinned; the policy decides again."),
    "pause": ("Pause", "{pool}: paused: its workers claim no new jobs and the pool keeps its size "
                       "(undo with: flexiqctl resume {pool})."),
    "resume": ("Resume", "{pool}: resumed."),
    "drain": ("Drain", "{pool}: draining every worker; the pool stays at 0 until: flexiqctl unpin {pool}."),
    "clear-ceiling": ("ClearCeiling", "{pool}: its measured ceiling is forgotten; it is measured again "
                                      "from the next backlog."),
}


async def cmd_simple(client: Client, args: argparse.Namespace) -> int:
    member, done = SIMPLE_COMMANDS[args.command]
    await client.call(member, "s", [args.pool])
    _say(done.format(pool=args.pool))
    return EXIT_OK


async def cmd_restart(client: Client, args: argparse.Namespace) -> int:
    [ident] = await client.call("Restart", "s", [args.pool])
    if not args.wait:
        _say(f"{args.pool}: restart requested: new workers replace the old ones in steps, each old one "
             f"drained; follow it with: flexiqctl status")
        return EXIT_OK
    _say(f"{args.pool}: restart requested; waiting until every old worker is replaced.")
    return await wait_for_restart(client, args.pool, ident, args.timeout)


async def wait_for_restart(client: Client, pool: str, ident: int, timeout: float | None) -> int:
    """Print the restart's progress as it changes until it is done (EXIT_OK) or failed, or until
    ``timeout`` (CtlError).  A later restart of the pool stands for this one: it replaces these
    old workers too.  A flexiqd that restarts meanwhile is waited for: it goes on with the restart."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    said = None
    while True:
        try:
            document = await client.status()
        except CtlError as exc:
            if exc.code != EXIT_NOT_RUNNING:
                raise
            line = f"flexiqd is not answering ({exc}); still waiting"
        else:
            entry = document["pools"].get(pool)
            if entry is None:
                raise CtlError(f"{pool}: no such pool any more (the config was reloaded without it)")
            restart = entry.get("restart")
            if restart is not None and restart["id"] >= ident:
                if restart["state"] == "done":
                    _say(f"{pool}: restart {restart_progress(restart)}.")
                    return EXIT_OK
                if restart["state"] == "failed":
                    raise CtlError(f"{pool}: restart failed: {restart['error']}; the old workers left keep running")
                line = f"{pool}: restart {restart_progress(restart)}"
            else:
                line = f"{pool}: restart requested, the first step at the next tick"
        if line != said:
            _say(line)
            said = line
        if deadline is not None and loop.time() >= deadline:
            raise CtlError(f"{pool}: the restart is not done after {format_duration(timeout)}; it goes on "
                           f"(follow it with: flexiqctl status)")
        await asyncio.sleep(RESTART_POLL)


async def cmd_reload(client: Client, args: argparse.Namespace) -> int:
    outcome: asyncio.Future = asyncio.get_running_loop().create_future()

    def reported(body: list[Any]) -> None:
        if not outcome.done():
            outcome.set_result(body)

    await client.subscribe(SIGNAL_CONFIG_RELOADED, reported)
    await client.call("Reload")
    try:
        ok, message = await asyncio.wait_for(outcome, RELOAD_TIMEOUT)
    except asyncio.TimeoutError:
        raise CtlError(f"flexiqd took the reload request but reported no outcome within "
                       f"{RELOAD_TIMEOUT:.0f}s; see: systemctl status flexiqd") from None
    if not ok:
        raise CtlError(f"reload rejected, flexiqd keeps the previous config: {message}")
    _say(message)
    return EXIT_OK


async def cmd_watch(client: Client, args: argparse.Namespace) -> int:
    """The status screen every interval, redrawn in place on a terminal, until Ctrl-C (exit 130)."""
    first = True
    with LiveView(sys.stdout) as view:
        try:
            while True:
                try:
                    body = render_status(await client.status())
                except CtlError as exc:
                    if first:
                        raise
                    body = f"flexiqctl: {exc}"  # keep watching: the daemon may come back
                first = False
                header = (f"every {format_duration(args.interval)}, Ctrl-C to quit"
                          f"{' ' * 4}{time.strftime('%H:%M:%S')}")
                view.show(f"{header}\n\n{body}")
                await asyncio.sleep(args.interval)
        except asyncio.CancelledError:
            # Ctrl-C: asyncio.run cancels this task; the view gives the cursor back on the way out.
            return EXIT_INTERRUPTED


async def cmd_schedules(client: Client, args: argparse.Namespace) -> int:
    document = json.loads((await client.call("Schedules"))[0])
    _say(json.dumps(document, indent=2) if args.json else render_schedules(document))
    return EXIT_OK


async def cmd_schedule(client: Client, args: argparse.Namespace) -> int:
    if args.action == "run":
        [job_id] = await client.call("RunSchedule", "s", [args.name])
        _say(f"{args.name}: enqueued job {job_id} now, outside its slots.")
    elif args.action == "pause":
        [changed] = await client.call("PauseSchedule", "s", [args.name])
        _say(f"{args.name}: {'paused' if changed else 'already paused'} on every host sharing the store; its "
             f"slots are skipped (reason paused) until: flexiqctl schedule resume {args.name}.")
    else:
        [changed] = await client.call("ResumeSchedule", "s", [args.name])
        _say(f"{args.name}: {'resumed' if changed else 'was not paused'}.")
    return EXIT_OK


COMMANDS = {"status": cmd_status, "schedules": cmd_schedules, "schedule": cmd_schedule, "events": cmd_events, "scale": cmd_scale, "unpin": cmd_simple,
            "pause": cmd_simple, "resume": cmd_simple, "drain": cmd_simple, "clear-ceiling": cmd_simple,
            "restart": cmd_restart, "reload": cmd_reload,
            "watch": cmd_watch}


# -- arguments ------------------------------------------------------------------------------------

_workers = whole_number(0, MAX_UINT32, what="a worker count (0 or more)")
_sequence = whole_number(0, what="0 or more")
_positive_duration = duration(positive=True)


def _version() -> str:
    from .. import __version__

    return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flexiqctl", description="Watch and steer flexiqd over D-Bus.",
        epilog="Exit codes: 0 done, 1 refused or failed (the reason is printed), 2 bad arguments, "
               "3 flexiqd cannot be reached (not running, or off the bus while the bus restarts).")
    parser.add_argument("--bus-address", metavar="ADDRESS", default=None,
                        help="the D-Bus address to use (default: $DBUS_SYSTEM_BUS_ADDRESS, else the system bus)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    status = commands.add_parser("status", help="every pool: workers, measured start cost, queue, rates, the last "
                                                "decision, a measured ceiling and the evidence heeded")
    status.add_argument("--json", action="store_true", help="print the Status document (docs/dbus-api.md)")

    events = commands.add_parser("events", help="scale events, oldest first")
    events.add_argument("--since", type=_sequence, default=0, metavar="SEQ",
                        help="only events after sequence number SEQ")
    events.add_argument("--follow", "-f", action="store_true", help="then print new events as they happen")
    events.add_argument("--json", action="store_true", help="one JSON object per line")

    scale = commands.add_parser("scale", help="pin a pool at N workers (the policy is overridden)")
    scale.add_argument("pool")
    scale.add_argument("workers", type=_workers, metavar="N")
    scale.add_argument("--for", dest="for_seconds", type=_positive_duration, default=None, metavar="DURATION",
                       help="only for this long, e.g. 30s, 5m (default: until unpin)")

    for name, text in (("unpin", "let the policy decide again (ends scale and drain)"),
                       ("pause", "workers stop claiming jobs; the pool keeps its size"),
                       ("resume", "undo pause"),
                       ("drain", "drain every worker and hold the pool at 0 until unpin"),
                       ("clear-ceiling", "forget the pool's measured ceiling (the knee), so that it is "
                                         "measured again")):
        commands.add_parser(name, help=text).add_argument("pool")

    restart = commands.add_parser("restart", help="replace the pool's workers by new ones in steps (a deploy "
                                                  "of new code), never below the pool's need; each old one drains")
    restart.add_argument("pool")
    restart.add_argument("--wait", action="store_true",
                         help="print the progress and return once every old worker is replaced: exit 0 when "
                              "done, 1 when it failed (or --timeout ran out)")
    restart.add_argument("--timeout", type=_positive_duration, default=None, metavar="DURATION",
                         help="with --wait, give up waiting after this long, e.g. 10m (the restart goes on; "
                              "default: no limit)")

    commands.add_parser("reload", help="reload the config file (like systemctl reload flexiqd)")

    schedules = commands.add_parser("schedules", help="every schedule: next fire, last slot and its job, "
                                                       "slots fired and skipped")
    schedules.add_argument("--json", action="store_true", help="print the Schedules document (docs/dbus-api.md)")
    schedule = commands.add_parser("schedule", help="run a schedule's job now, or pause or resume a schedule")
    schedule.add_argument("action", choices=["run", "pause", "resume"],
                          help="run: enqueue its job now, outside its slots; pause: skip its slots on every "
                               "host until resume")
    schedule.add_argument("name")

    watch = commands.add_parser("watch", help="status, refreshed in place until Ctrl-C")
    watch.add_argument("--interval", type=_positive_duration, default=1.0, metavar="DURATION",
                       help="time between refreshes (default: 1s)")
    return parser


async def run(args: argparse.Namespace) -> int:
    client = Client(bus_address(args.bus_address))
    await client.connect()
    try:
        return await COMMANDS[args.command](client, args)
    finally:
        client.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "restart" and args.timeout is not None and not args.wait:
        parser.error("restart: --timeout is for --wait (without it, restart returns at once)")
    try:
        return asyncio.run(run(args))
    except CtlError as exc:
        print(f"flexiqctl: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        # Ctrl-C is how watch and events --follow end.
        return EXIT_OK if args.command in ("watch", "events") else EXIT_INTERRUPTED
    except BrokenPipeError:
        # `flexiqctl events | head`: the reader left; nothing more to say.
        sys.stderr.close()
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
