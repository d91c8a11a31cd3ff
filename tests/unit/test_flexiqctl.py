"""flexiqctl without a bus: arguments, error replies, and the text it renders from documents."""

from __future__ import annotations

import json

import pytest

from flexiqd.cli import flexiqctl
from flexiqd.cli.render import render_event, render_status

NOW = 1_700_000_000.0


def document(**pool_changes) -> dict:
    """A Status document as flexiqd returns it (docs/dbus-api.md), one pool."""
    pool = {
        "name": "default", "queues": ["default"], "concurrency": 4, "min_workers": 1, "max_workers": 10,
        "workers": {"active": 3, "starting": 1, "draining": 0, "failed": 0},
        "desired": 4, "binding_cap": None,
        "metrics": {"runnable": 12, "delayed": 2, "running": 9, "oldest_runnable_age": 2.1,
                    "time_to_drain": 4.0, "arrival_rate": 3.2, "completion_rate": 3.0,
                    "duration_p50": 0.12, "duration_p95": 0.4, "duration_p99": 1.2},
        "utilisation": 0.75,
        "decision": {"reason": "ScaleUpAge", "rationale": "default 3 -> 4: ScaleUpAge: oldest job waits 2.1s"},
        "paused": False, "pinned": None,
    }
    pool.update(pool_changes)
    return {"version": "0.1.0", "config_path": "/etc/flexiqd/flexiqd.yaml", "config_error": None,
            "fleet": "systemd", "tick": 1.0, "generated_at": NOW, "pools": {"default": pool}}


# -- the status table ---------------------------------------------------------------------------

def test_status_table_shows_every_number_of_a_pool():
    text = render_status(document())
    assert text.splitlines()[0] == "flexiqd 0.1.0, config /etc/flexiqd/flexiqd.yaml"
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in text.splitlines() if line.startswith("  ")}
    assert rows == {
        "workers": "3 active, 1 starting",
        "desired": "4 (min 1, max 10)",
        "startup": "not measured yet",
        "queue": "12 runnable, 2 delayed, 9 running",
        "waiting": "oldest 2.1s, drains in 4.0s",
        "rates": "3.20/s in, 3.00/s done",
        "utilisation": "75% (9 running in 12 slots)",
        "durations": "p50 120ms, p95 400ms, p99 1.2s",
        "decision": "default 3 -> 4: ScaleUpAge: oldest job waits 2.1s",
    }
    assert "pool default\n" in text + "\n"


def test_status_table_says_paused_pinned_and_capped():
    text = render_status(document(paused=True, pinned={"workers": 2, "until": NOW + 52}, binding_cap="dependency:db"))
    assert "pool default (paused, pinned at 2 for 52.0s more)" in text
    assert "capped by dependency:db" in text
    forever = render_status(document(pinned={"workers": 0, "until": None}))
    assert "pool default (pinned at 0 until unpinned)" in forever


def test_status_table_shows_unknowns_as_such():
    text = render_status(document(metrics=None, utilisation=None, decision=None, desired=None))
    assert "stats unavailable" in text and "desired      - (min 1, max 10)" in text
    assert "decision" not in text
    down = render_status(document(metrics=None, stats_error="cannot connect to the queue database "
                                                            "postgresql://q@db/jobs: Connection refused"))
    assert ("queue        stats unavailable, the pool is held: cannot connect to the queue database "
            "postgresql://q@db/jobs: Connection refused") in down
    never = render_status(document(metrics={**document()["pools"]["default"]["metrics"], "time_to_drain": None,
                                            "duration_p50": None, "duration_p95": None, "duration_p99": None}))
    assert "drains in never (nothing completes)" in never and "p50 -, p95 -, p99 -" in never
    unsized = render_status(document(workers=None, metrics=None, desired=None, decision=None))
    assert "not sized yet" in unsized


def test_status_table_leads_with_a_rejected_config_and_copes_with_no_pools():
    doc = document()
    doc["config_error"] = "pools.default.max_wrkers: unknown key (did you mean 'max_workers'?)"
    assert render_status(doc).splitlines()[1].startswith("config rejected, running on the previous one: pools.")
    doc["pools"] = {}
    assert render_status(doc).splitlines()[-1] == "no pools configured"


def test_event_line_is_time_sequence_and_the_decision():
    event = {"seq": 7, "at": NOW, "pool": "default", "previous": 1, "desired": 3, "reason": "Pinned",
             "rationale": "default 1 -> 3: Pinned: pinned at 3 by an operator"}
    line = render_event(event)
    assert line.endswith("  #7  default 1 -> 3: Pinned: pinned at 3 by an operator")
    assert render_event({**event, "rationale": ""}).endswith("#7  default 1 -> 3: Pinned")


# -- arguments ------------------------------------------------------------------------------------

def parse(*argv: str):
    return flexiqctl.build_parser().parse_args(list(argv))


def test_arguments_of_every_command():
    args = parse("--bus-address", "unix:path=/x", "scale", "default", "3", "--for", "5m")
    assert (args.bus_address, args.command, args.pool, args.workers, args.for_seconds) == \
        ("unix:path=/x", "scale", "default", 3, 300.0)
    assert parse("scale", "default", "0").for_seconds is None
    events = parse("events", "--since", "12", "--follow")
    assert (events.since, events.follow, events.json) == (12, True, False)
    assert parse("watch").interval == 1.0 and parse("watch", "--interval", "250ms").interval == 0.25
    assert parse("status", "--json").json is True
    for command in ("unpin", "pause", "resume", "drain"):
        assert parse(command, "images").pool == "images"
    assert parse("reload").command == "reload"


@pytest.mark.parametrize("argv, message", [
    ([], "required: COMMAND"),
    (["frobnicate"], "invalid choice"),
    (["scale", "default"], "required: N"),
    (["scale", "default", "-1"], "is not a worker count"),
    (["scale", "default", "three"], "'three' is not a whole number"),
    (["scale", "default", "2", "--for", "soon"], "is not a duration"),
    (["scale", "default", "2", "--for", "0s"], "is not longer than 0s"),
    (["events", "--since", "-3"], "-3 is not 0 or more"),
    (["watch", "--interval", "0"], "is not longer than 0s"),
    (["pause"], "required: pool"),
])
def test_argument_errors_exit_2_with_argparses_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        flexiqctl.main(argv)
    assert exit_info.value.code == flexiqctl.EXIT_USAGE == 2
    assert message in capsys.readouterr().err


def test_the_bus_address_comes_from_the_option_then_the_environment(monkeypatch):
    monkeypatch.delenv("DBUS_SYSTEM_BUS_ADDRESS", raising=False)
    assert flexiqctl.bus_address(None) == "unix:path=/run/dbus/system_bus_socket"
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/tmp/bus")
    assert flexiqctl.bus_address(None) == "unix:path=/tmp/bus"
    assert flexiqctl.bus_address("unix:path=/other") == "unix:path=/other"


# -- error replies ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, code, words", [
    ("org.freedesktop.DBus.Error.ServiceUnknown", 3, "systemctl start flexiqd"),
    ("org.freedesktop.DBus.Error.NameHasNoOwner", 3, "systemctl start flexiqd"),
    ("org.freedesktop.DBus.Error.AccessDenied", 1, "as root or as a member of the flexiq-admin group"),
    ("org.flexiq.flexiqd1.Error.InvalidArgs", 1, "the daemon's text"),
    ("org.freedesktop.DBus.Error.NoReply", 1, "did not answer"),
])
def test_error_replies_map_to_exit_codes_and_one_line(name, code, words):
    error = flexiqctl.error_from_reply(name, "the daemon's text\nsecond line", "unix:path=/x")
    assert error.code == code and words in str(error) and "\n" not in str(error)


def test_the_bus_daemons_refusal_is_told_by_the_request_it_refused_not_its_header_dump():
    rejected = ('Rejected send message, 2 matched rules; type="method_call", sender=":1.5" (uid=65534 pid=7) '
                'interface="org.flexiq.flexiqd1.Manager" member="Pause" error name="(unset)" '
                'requested_reply="0" destination="org.flexiq.flexiqd1" (uid=0 pid=2)')
    text = str(flexiqctl.error_from_reply("org.freedesktop.DBus.Error.AccessDenied", rejected, "unix:path=/x"))
    assert text == ("permission denied (run flexiqctl as root or as a member of the flexiq-admin group): "
                    "the system bus's policy refused Pause")


def test_no_owner_of_the_name_says_flexiqd_may_be_connecting_again_after_a_bus_restart():
    # A running flexiqd is off the bus for a moment when the bus restarts: the operator is told
    # that it is not reachable, and that this may be why, not only that it is not running.
    error = flexiqctl.error_from_reply("org.freedesktop.DBus.Error.ServiceUnknown", "", "unix:path=/x")
    text = str(error)
    assert error.code == flexiqctl.EXIT_NOT_RUNNING == 3
    assert text.startswith("flexiqd cannot be reached: nothing owns org.flexiq.flexiqd1 on unix:path=/x")
    assert "restart of the system bus: try again in a few seconds" in text and "\n" not in text


def test_status_names_the_reason_every_pool_is_held():
    from flexiqd.cli.render import render_status

    text = render_status({"version": "1", "config_path": "/etc/flexiqd/flexiqd.yaml", "pools": {},
                          "fleet_problem": "cannot connect to systemd over the system bus: Connection refused"})
    assert ("holding every pool, the workers cannot be listed: cannot connect to systemd over the system bus: "
            "Connection refused") in text.splitlines()
    assert "holding" not in render_status({"version": "1", "config_path": "x", "pools": {}, "fleet_problem": None})


# -- the Status document, as the daemon builds it -------------------------------------------------------

def test_status_document_from_the_controllers_view(tmp_path):
    from flexiqd.config.load import parse_config
    from flexiqd.daemon.controller import PoolView
    from flexiqd.daemon.documents import status_document
    from flexiqd.daemon.overrides import Override
    from flexiqd.policy import PoolMetrics
    from flexiqd.daemon.startcost import StartCost
    from flexiqd.policy import Decision, History
    from flexiqd.policy.types import CapValue
    from flexiqd.queue.types import Stats

    config = parse_config("store: sqlite:///x.db\npools:\n  default:\n    concurrency: 4\n    max_workers: 6\n"
                          "  idle: {queues: [idle]}\n", "/etc/flexiqd/flexiqd.yaml")
    stats = Stats(queue="default", runnable=12, delayed=2, running=6, dead=0, oldest_runnable_age=2.0,
                  arrival_rate=3.0, completion_rate=4.0, failure_rate=0.0, duration_p50=0.1,
                  duration_p95=0.3, duration_p99=0.9, window=60.0, coming_due=5, coming_due_within=10.0)
    decision = Decision(pool="default", current=3, desired=4, raw_desired=9, capped=4, stabilized=4,
                        reason="CappedByDependency", message="capped by db", recommendations=(), winner="age",
                        caps=(CapValue("dependency:db", 4),), binding_cap=CapValue("dependency:db", 4),
                        smoothing=(), history=History())
    view = PoolView(pool="default", active=2, starting=1, draining=1, failed=0, max_workers=6,
                    decision=decision, stats=[stats], metrics=PoolMetrics.from_queues([stats]),
                    start_cost=StartCost(seconds=0.62, ready=0.41, samples=9), line=decision.line())
    doc = status_document(config, "/etc/flexiqd/flexiqd.yaml", None, {"default": view},
                          {"default": Override(pinned=4, until=NOW + 60)}, NOW)
    json.dumps(doc)  # it travels as JSON
    assert list(doc["pools"]) == ["default", "idle"]
    pool = doc["pools"]["default"]
    assert pool["workers"] == {"active": 2, "starting": 1, "draining": 1, "failed": 0}
    assert (pool["desired"], pool["max_workers"], pool["concurrency"]) == (4, 6, 4)
    assert pool["metrics"]["runnable"] == 12 and pool["metrics"]["delayed"] == 2
    assert pool["metrics"]["time_to_drain"] == 3.0
    assert (pool["metrics"]["coming_due"], pool["metrics"]["coming_due_within"]) == (5, 10.0)
    assert pool["binding_cap"] == "dependency:db"
    assert pool["decision"]["rationale"].startswith("default 3 -> 4: CappedByDependency: capped by db")
    assert pool["start_cost"] == {"seconds": 0.62, "ready": 0.41, "samples": 9}
    assert "startup      620ms to first claim (ready in 410ms), median of 9 starts" in render_status(doc)
    assert "5 coming due within 10.0s" in render_status(doc)
    assert pool["utilisation"] == 6 / (2 * 4)
    assert pool["pinned"] == {"workers": 4, "until": NOW + 60} and pool["paused"] is False
    assert doc["pools"]["idle"]["workers"] is None  # configured, not sized yet
    assert "pool idle" in render_status(doc) and "pool default (pinned at 4" in render_status(doc)


def test_only_root_and_the_operators_group_may_steer():
    from flexiqd.dbus.service import caller_allowed

    assert caller_allowed(0, [], None)
    assert caller_allowed(1000, [27, 990], 990)
    assert not caller_allowed(1000, [27], 990)
    assert not caller_allowed(1000, [27], None)


# -- events --follow: each ScaleEvent signal carries its sequence number ---------------------------------

class EventsClient:
    """Answers Events(since) from a fixed history, as flexiqd would."""

    def __init__(self, history: list[dict]) -> None:
        self.history = history
        self.asked: list[int] = []

    async def events(self, since: int) -> list[dict]:
        self.asked.append(since)
        return [event for event in self.history if event["seq"] > since]


def event(seq: int, desired: int = 3) -> dict:
    return {"seq": seq, "at": NOW, "pool": "default", "previous": 1, "desired": desired, "reason": "Pinned",
            "rationale": f"default 1 -> {desired}: Pinned: pinned at {desired} by an operator"}


def follow(client, body, shown, since=0) -> int:
    import asyncio

    return asyncio.run(flexiqctl.follow_event(client, body, shown, since, as_json=True))


def test_follow_skips_a_signal_already_printed_and_fetches_the_record_of_a_new_one(capsys):
    client = EventsClient([event(5), event(6), event(7, desired=4)])
    assert follow(client, ["default", 1, 3, "Pinned", 6], shown=6) == 6
    assert capsys.readouterr().out == "" and client.asked == []  # printed from the history already
    assert follow(client, ["default", 1, 4, "Pinned", 7], shown=6) == 7
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [event(7, desired=4)]
    assert client.asked == [6]


def test_follow_prints_from_the_signal_an_event_events_does_not_return(capsys):
    client = EventsClient([event(3)])
    # --since beyond the history: only new events, each from its signal when Events has nothing after SEQ.
    assert follow(client, ["default", 1, 3, "Pinned", 4], shown=0, since=10) == 4
    printed = json.loads(capsys.readouterr().out)
    assert (printed["seq"], printed["desired"], printed["rationale"]) == (4, 3, "")
    assert client.asked == [10]


# -- restart --wait: follows the Status document's restart until it ends ---------------------------------

def restart(ident: int, state: str, **fields) -> dict:
    entry = {"id": ident, "state": state, "requested_at": NOW, "finished_at": None, "error": None, "target": 3,
             "step": 1, "old_serving": 2, "old_draining": 1, "new_ready": 1, "new_starting": 1, "waiting": None}
    entry.update(fields)
    return entry


class StatusClient:
    """Answers Status from a script of documents (a CtlError in it is raised instead)."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)

    async def status(self) -> dict:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def fast_poll(monkeypatch):
    monkeypatch.setattr(flexiqctl, "RESTART_POLL", 0.0)


def wait(client, ident=10, timeout=None) -> int:
    import asyncio

    return asyncio.run(flexiqctl.wait_for_restart(client, "default", ident, timeout))


def test_restart_wait_prints_progress_waits_through_a_daemon_restart_and_exits_0_when_done(capsys, fast_poll):
    not_running = flexiqctl.CtlError("flexiqd is not running", flexiqctl.EXIT_NOT_RUNNING)
    client = StatusClient(document(restart=restart(9, "done", finished_at=NOW)),   # an earlier restart's
                          document(restart=restart(10, "replacing")), not_running,
                          document(restart=restart(10, "finishing", old_serving=0)),
                          document(restart=restart(10, "done", finished_at=NOW + 5, old_serving=0, old_draining=0)))
    assert wait(client) == flexiqctl.EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "default: restart requested, the first step at the next tick"
    assert lines[1] == ("default: restart replacing: 2 old serving, 1 old draining, 1 new ready, 1 starting "
                        "(target 3, steps of 1)")
    assert "still waiting" in lines[2] and lines[3].startswith("default: restart finishing: 0 old serving")
    assert lines[4].startswith("default: restart done at ")


def test_restart_wait_fails_with_the_reason_and_a_later_restart_stands_for_this_one(fast_poll):
    failed = StatusClient(document(restart=restart(10, "failed", finished_at=NOW, error="replacement workers keep "
                                                                                         "failing")))
    with pytest.raises(flexiqctl.CtlError, match="restart failed: replacement workers keep failing; the old "
                                                 "workers left keep running") as error:
        wait(failed)
    assert error.value.code == flexiqctl.EXIT_ERROR
    assert wait(StatusClient(document(restart=restart(11, "done", finished_at=NOW)))) == flexiqctl.EXIT_OK


def test_restart_wait_gives_up_at_its_timeout_and_says_the_restart_goes_on(fast_poll):
    with pytest.raises(flexiqctl.CtlError, match="not done after 10ms; it goes on"):
        wait(StatusClient(document(restart=restart(10, "replacing"))), timeout=0.01)


def test_status_table_shows_a_restart_while_it_runs_and_for_an_hour_after_it_ended():
    def row(entry, now=NOW):
        text = render_status(dict(document(restart=entry), generated_at=now))
        return [line.split(None, 1)[1] for line in text.splitlines() if line.strip().startswith("restart")]

    assert row(restart(10, "replacing", waiting="held: no room for a new worker: max_workers=4")) == [
        "replacing: 2 old serving, 1 old draining, 1 new ready, 1 starting (target 3, steps of 1); held: no room "
        "for a new worker: max_workers=4"]
    failed = restart(10, "failed", finished_at=NOW - 60, error="replacement workers keep failing (3 within 300s)")
    assert row(failed)[0].startswith("FAILED at ") and row(failed)[0].endswith(
        ": replacement workers keep failing (3 within 300s); the old workers left keep running")
    assert row(restart(10, "done", finished_at=NOW - 3601)) == []
    assert row(None) == []
