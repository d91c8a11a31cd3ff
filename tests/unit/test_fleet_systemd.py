"""The systemd fleet's pure parts: unit naming, states, drop-ins (the rest is tested in tests/system)."""

from __future__ import annotations

import pytest

from flexiqd.fleet.base import STOP_GRACE, Credential, WorkerSpec, WorkerState, parse_instance
from flexiqd.fleet.dropin import dropin_text, escape_quoted
from flexiqd.fleet.systemd import UNLIMITED, SystemdFleet, unit_name, unit_path, worker_state


def test_a_pending_start_job_counts_as_starting_before_the_unit_leaves_inactive():
    assert worker_state("inactive", "start") is WorkerState.STARTING
    assert worker_state("activating", "") is WorkerState.STARTING
    assert worker_state("active", "") is WorkerState.ACTIVE
    assert worker_state("active", "stop") is WorkerState.DRAINING
    assert worker_state("deactivating", "") is WorkerState.DRAINING
    assert worker_state("failed", "") is WorkerState.FAILED
    assert worker_state("inactive", "") is None


def test_a_unit_being_restarted_counts_as_starting_not_as_leaving():
    # `systemctl restart` of a worker: it comes back by itself, so no replacement is started.
    assert worker_state("deactivating", "restart") is WorkerState.STARTING
    assert worker_state("active", "restart") is WorkerState.STARTING
    assert worker_state("inactive", "restart") is WorkerState.STARTING
    assert worker_state("deactivating", "try-restart") is WorkerState.STARTING


def test_unit_names_and_paths_follow_systemds_escaping():
    assert unit_name("default", 3) == "flexiq-worker@default-3.service"
    assert unit_path("flexiq-worker@default-3.service") == \
        b"/org/freedesktop/systemd1/unit/flexiq_2dworker_40default_2d3_2eservice"
    assert parse_instance("img_resize-12") == ("img_resize", 12)
    assert parse_instance("Bad-1") is None and parse_instance("default") is None


def test_the_dropin_carries_the_stop_timeout_environment_and_config_path():
    fleet = SystemdFleet(systemd=None, config_path="/srv/flexiqd.yaml")
    spec = WorkerSpec(pool="p", app="a:q", queues=("q",), concurrency=2, drain_timeout=45,
                      lease_seconds=30, store_url="sqlite:////x.db", environment={"MODE": 'a "b"'})
    text = fleet.dropin_text(spec)
    assert "TimeoutStopSec=55s" in text
    assert 'Environment="FLEXIQD_CONFIG=/srv/flexiqd.yaml"' in text
    assert 'Environment="MODE=a \\"b\\""' in text


# -- drop-ins: what systemd reads back must be exactly the configured value ------------------

def systemd_unquote(word: str) -> str:
    """What systemd 252 makes of one double-quoted Environment= word: C-unescape, then %% -> %.

    Only the escapes ``escape_quoted`` writes; anything else fails the test.
    """
    assert word.startswith('"') and word.endswith('"')
    body, out, i = word[1:-1], [], 0
    simple = {"\\": "\\", '"': '"', "n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}
    while i < len(body):
        char = body[i]
        if char == '"':
            raise AssertionError(f"an unescaped quote ends the word early: {word}")
        if char == "\\":
            nxt = body[i + 1]
            if nxt == "x":
                out.append(chr(int(body[i + 2:i + 4], 16)))
                i += 4
                continue
            out.append(simple[nxt])
            i += 2
            continue
        if char == "%":
            assert body[i + 1] == "%", f"a bare % is a specifier: {word}"
            out.append("%")
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out)


HOSTILE = ["x\nExecStartPre=/bin/sh -c 'touch /tmp/pwned'", "%h and %i", "$HOME ${PATH}", 'a "quoted" \\ value',
           "tab\there\r\x1b[31m\x7f", "trailing backslash \\"]


@pytest.mark.parametrize("value", HOSTILE)
def test_a_hostile_environment_value_stays_one_directive_and_reads_back_verbatim(value):
    spec = WorkerSpec(pool="p", app="a:q", queues=("q",), concurrency=1, drain_timeout=30,
                      lease_seconds=30, store_url="sqlite:////x.db", environment={"EVIL": value})
    lines = dropin_text(spec).splitlines()
    evil = [line for line in lines if line.startswith('Environment="EVIL=')]
    assert len(evil) == 1 and len(lines) == 4  # comment, [Service], TimeoutStopSec, the variable
    assert systemd_unquote(evil[0][len("Environment="):]) == f"EVIL={value}"


def test_a_nul_cannot_be_written():
    with pytest.raises(ValueError):
        escape_quoted("a\0b")


def test_credentials_become_load_credential_lines_with_specifiers_escaped():
    spec = WorkerSpec(pool="p", app="a:q", queues=("q",), concurrency=1, drain_timeout=30,
                      lease_seconds=30, store_url="sqlite:////x.db",
                      credentials=(Credential("db", "/etc/flexiqd/db%i.secret"),
                                   Credential("api", "/etc/flexiqd/api.cred", encrypted=True)))
    text = dropin_text(spec, config_path="/run/flexiqd/applied.yaml", paused_path="/run/flexiqd/paused.json")
    assert "LoadCredential=db:/etc/flexiqd/db%%i.secret\n" in text
    assert "LoadCredentialEncrypted=api:/etc/flexiqd/api.cred\n" in text
    assert 'Environment="FLEXIQD_PAUSED_FILE=/run/flexiqd/paused.json"' in text
    assert f"TimeoutStopSec={30 + STOP_GRACE:g}s" in text


# -- the fleet's calls, against a recording stand-in for systemd's Manager ---------------------

class RecordingSystemd:
    """Answers ListUnitsByPatterns from ``units`` (name -> (ActiveState, job, pid)); records the rest."""

    def __init__(self, units):
        self.units = units
        self.calls = []

    def ListUnitsByPatterns(self, states, patterns):
        return [(name, "", "loaded", active, "", "", name.encode(), 0, job, b"/")
                for name, (active, job, _) in self.units.items()]

    def unit_property(self, path, interface, prop, signature):
        if prop == "MainPID":
            return self.units[path.decode()][2]
        return 0

    def __getattr__(self, method):
        return lambda *args: self.calls.append((method, *args))


def test_signals_go_to_ready_workers_only_and_a_paused_pool_is_signalled_once_per_process(tmp_path):
    import signal

    systemd = RecordingSystemd({"flexiq-worker@p-1.service": ("active", "", 101),
                                "flexiq-worker@p-2.service": ("activating", "start", 102)})
    fleet = SystemdFleet(systemd, dropin_root=str(tmp_path))
    workers = fleet.list()
    fleet.set_paused(workers, True)
    fleet.set_paused(fleet.list(), True)  # the next tick: nothing new to tell
    assert systemd.calls == [("KillUnit", "flexiq-worker@p-1.service", "main", signal.SIGUSR1)]
    systemd.units["flexiq-worker@p-2.service"] = ("active", "", 102)  # became ready
    systemd.calls.clear()
    fleet.set_paused(fleet.list(), True)
    assert systemd.calls == [("KillUnit", "flexiq-worker@p-2.service", "main", signal.SIGUSR1)]
    systemd.units["flexiq-worker@p-1.service"] = ("active", "", 201)  # restarted by systemd
    systemd.calls.clear()
    fleet.set_paused(fleet.list(), True)
    assert systemd.calls == [("KillUnit", "flexiq-worker@p-1.service", "main", signal.SIGUSR1)]


def test_a_starting_worker_is_stopped_without_a_signal(tmp_path):
    import signal

    systemd = RecordingSystemd({"flexiq-worker@p-1.service": ("active", "", 101),
                                "flexiq-worker@p-2.service": ("activating", "start", 102)})
    fleet = SystemdFleet(systemd, dropin_root=str(tmp_path))
    fleet.stop(fleet.list())
    assert systemd.calls == [("KillUnit", "flexiq-worker@p-1.service", "main", signal.SIGUSR1),
                             ("StopUnit", "flexiq-worker@p-1.service", "replace"),
                             ("StopUnit", "flexiq-worker@p-2.service", "replace")]


def test_configure_rewrites_running_instances_dropins_once_and_sets_their_limits(tmp_path):
    systemd = RecordingSystemd({"flexiq-worker@p-1.service": ("active", "", 101),
                                "flexiq-worker@q-1.service": ("active", "", 102)})
    fleet = SystemdFleet(systemd, dropin_root=str(tmp_path))
    spec = WorkerSpec(pool="p", app="a:q", queues=("q",), concurrency=1, drain_timeout=50,
                      lease_seconds=30, store_url="sqlite:////x.db", memory_max=2 ** 30)
    fleet.configure([spec])
    assert systemd.calls == [
        ("Reload",),
        ("SetUnitProperties", "flexiq-worker@p-1.service", True,
         [("MemoryMax", b"t", 2 ** 30), ("CPUWeight", b"t", UNLIMITED)])]
    dropin = tmp_path / "flexiq-worker@p-1.service.d" / "50-flexiqd.conf"
    assert "TimeoutStopSec=60s" in dropin.read_text()
    systemd.calls.clear()
    fleet.configure([spec])  # nothing changed on disk: no Reload
    assert [c[0] for c in systemd.calls] == ["SetUnitProperties"]


def test_a_start_sets_the_limits_before_starting_and_reloads_once_per_batch(tmp_path):
    systemd = RecordingSystemd({})
    fleet = SystemdFleet(systemd, dropin_root=str(tmp_path))
    spec = WorkerSpec(pool="p", app="a:q", queues=("q",), concurrency=1, drain_timeout=5,
                      lease_seconds=30, store_url="sqlite:////x.db", cpu_weight=50)
    fleet.start(spec, [1, 2])
    assert [c[:2] for c in systemd.calls] == [
        ("Reload",), ("SetUnitProperties", "flexiq-worker@p-1.service"), ("StartUnit", "flexiq-worker@p-1.service"),
        ("SetUnitProperties", "flexiq-worker@p-2.service"), ("StartUnit", "flexiq-worker@p-2.service")]


def test_a_configured_pool_starts_its_workers_without_a_reload(tmp_path):
    # The drop-ins of every instance the pool may start are written at configure, with one
    # Reload then: a scale-up does not wait ~100 ms for systemd to reload every unit.
    systemd = RecordingSystemd({})
    fleet = SystemdFleet(systemd, dropin_root=str(tmp_path))
    spec = WorkerSpec(pool="p", app="a:q", queues=("q",), concurrency=1, drain_timeout=5,
                      lease_seconds=30, store_url="sqlite:////x.db", ready_ahead=3)
    fleet.configure([spec])
    assert systemd.calls == [("Reload",)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"flexiq-worker@p-{i}.service.d" for i in (1, 2, 3)]
    systemd.calls.clear()
    fleet.start(spec, [1, 2, 3])
    assert "Reload" not in [c[0] for c in systemd.calls]
    fleet.start(spec, [4])  # beyond what was written ahead: written now, and reloaded
    assert ("Reload",) in systemd.calls


class TimedSystemd(RecordingSystemd):
    """Also answers the units' monotonic timestamps, and counts the reads of them."""

    def __init__(self, units, stamps):
        super().__init__(units)
        self.stamps = stamps      # name -> (InactiveExitTimestampMonotonic, ActiveEnterTimestampMonotonic)
        self.reads = 0

    def unit_property(self, path, interface, prop, signature):
        if prop == "ExecMainStartTimestampMonotonic":
            return 0  # read once per process too (the launch test below)
        if prop.endswith("TimestampMonotonic"):
            self.reads += 1
            exited, entered = self.stamps[path.decode()]
            return exited if prop.startswith("InactiveExit") else entered
        return super().unit_property(path, interface, prop, signature)


def test_a_ready_workers_start_is_read_from_systemds_timestamps_once_per_run(tmp_path):
    systemd = TimedSystemd({"flexiq-worker@p-1.service": ("active", "", 101),
                            "flexiq-worker@p-2.service": ("activating", "start", 102)},
                           {"flexiq-worker@p-1.service": (5_000_000, 5_420_000),
                            "flexiq-worker@p-2.service": (6_000_000, 0)})
    fleet = SystemdFleet(systemd, dropin_root=str(tmp_path))
    ready = {w.instance: w.ready_after for w in fleet.list()}
    assert ready == {"p-1": pytest.approx(0.42), "p-2": None}  # p-2 is not ready yet
    reads = systemd.reads
    fleet.list()
    assert systemd.reads == reads  # the same run: not read again
    systemd.units["flexiq-worker@p-1.service"] = ("active", "", 201)  # restarted by systemd
    systemd.stamps["flexiq-worker@p-1.service"] = (9_000_000, 9_300_000)
    assert {w.instance: w.ready_after for w in fleet.list()}["p-1"] == pytest.approx(0.3)


def test_how_a_worker_ended_is_told_from_its_units_last_main_process_only():
    from flexiqd.fleet.systemd import exit_description

    class Ended:
        def __init__(self, **props):
            self.props = props

        def unit_property(self, path, interface, prop, signature):
            assert path == unit_path("flexiq-worker@default-2.service")
            return self.props[prop]

    fleet = SystemdFleet(Ended(ExecMainPID=41, ExecMainCode=2, ExecMainStatus=9, Result="signal"))
    assert fleet.how_it_ended("default-2", 41) == "killed by SIGKILL"
    assert fleet.how_it_ended("default-2", 40) is None  # restarted since: the unit tells of another process
    oom = SystemdFleet(Ended(ExecMainPID=41, ExecMainCode=2, ExecMainStatus=9, Result="oom-kill"))
    assert oom.how_it_ended("default-2", 41) == "out of memory: killed by the kernel's OOM killer"
    assert exit_description(1, 75, "exit-code") == "exited with status 75"
    assert exit_description(3, 6, "core-dump") == "killed by SIGABRT (core dumped)"
    assert exit_description(0, 0, "success") is None


class LaunchedSystemd(RecordingSystemd):
    """Also answers ExecMainStartTimestampMonotonic (name -> usec), counting the reads."""

    def __init__(self, units, launched):
        super().__init__(units)
        self.launched = launched
        self.reads = 0

    def unit_property(self, path, interface, prop, signature):
        if prop == "ExecMainStartTimestampMonotonic":
            self.reads += 1
            return self.launched[path.decode()]
        return super().unit_property(path, interface, prop, signature)


def test_a_workers_launch_is_read_from_systemd_once_per_process_and_not_before_it_exists(tmp_path):
    systemd = LaunchedSystemd({"flexiq-worker@p-1.service": ("active", "", 101),
                               "flexiq-worker@p-2.service": ("inactive", "start", 0)},
                              {"flexiq-worker@p-1.service": 5_250_000, "flexiq-worker@p-2.service": 0})
    fleet = SystemdFleet(systemd, dropin_root=str(tmp_path))
    launched = {w.instance: w.launched for w in fleet.list()}
    assert launched == {"p-1": 5.25, "p-2": None}
    fleet.list()
    assert systemd.reads == 1
    systemd.units["flexiq-worker@p-1.service"] = ("active", "", 202)   # restarted: a new process
    systemd.launched["flexiq-worker@p-1.service"] = 9_000_000
    assert {w.instance: w.launched for w in fleet.list()}["p-1"] == 9.0


# -- a connection the bus closed: connect again, repeat the (idempotent) call once -------------

class BusError(Exception):
    """As pystemd raises them: a negative errno and sd-bus's error name."""

    def __init__(self, number: int, name: bytes) -> None:
        super().__init__(name)
        self.errno, self.err_name, self.err_message = number, name, b"gone"


class Reply:
    body = [(b"flexiq-worker@p-1.service",)]


class StandInBus:
    """A pystemd bus whose calls fail with ``failure`` until it is None; counts calls and closes."""

    def __init__(self, failure: Exception | None = None) -> None:
        self.failure, self.calls, self.closed = failure, [], False

    def call_method(self, destination, path, interface, method, args):
        self.calls.append(method)
        if self.failure is not None:
            raise self.failure
        return Reply()

    def close(self):
        self.closed = True


def test_a_lost_connection_is_told_from_a_refused_call():
    import errno

    from flexiqd.fleet.systemd import connection_lost

    assert connection_lost(BusError(-errno.ECONNRESET, b"System.Error.ECONNRESET"))
    assert connection_lost(BusError(-errno.ENOTCONN, b"System.Error.ENOTCONN"))
    assert connection_lost(BusError(0, b"org.freedesktop.DBus.Error.Disconnected"))
    # systemd re-executing answers nothing to a call in flight; the connection itself is fine.
    assert not connection_lost(BusError(-errno.ETIMEDOUT, b"org.freedesktop.DBus.Error.NoReply"))
    assert not connection_lost(BusError(-errno.ENOENT, b"org.freedesktop.systemd1.NoSuchUnit"))
    assert not connection_lost(ValueError("no errno at all"))


def test_a_call_on_a_connection_the_bus_closed_is_made_again_on_a_new_one():
    import errno

    from flexiqd.fleet.systemd import Systemd

    old = StandInBus(BusError(-errno.ECONNRESET, b"System.Error.ECONNRESET"))
    new = StandInBus()
    opened = []

    def reopen():
        opened.append(new)
        return new

    systemd = Systemd(old, reopen=reopen)
    systemd.StartUnit("flexiq-worker@p-1.service")
    assert old.calls == [b"StartUnit"] and old.closed
    assert new.calls == [b"StartUnit"] and opened == [new] and systemd.bus is new


def test_while_the_bus_is_away_each_call_fails_in_one_line_and_the_next_connects_again():
    import errno

    from flexiqd.errors import FleetError
    from flexiqd.fleet.systemd import Systemd

    old = StandInBus(BusError(-errno.ENOTCONN, b"System.Error.ENOTCONN"))
    later = StandInBus()
    attempts = []

    def reopen():
        attempts.append(len(attempts))
        if len(attempts) < 3:
            raise FleetError("cannot connect to systemd over the system bus: Connection refused")
        return later

    systemd = Systemd(old, reopen=reopen)
    for _ in range(2):
        with pytest.raises(FleetError, match="cannot connect to systemd over the system bus"):
            systemd.ListUnitsByPatterns([], ["flexiq-worker@*.service"])
    assert systemd.ListUnitsByPatterns([], ["flexiq-worker@*.service"]) == Reply.body
    assert len(attempts) == 3 and later.calls == [b"ListUnitsByPatterns"]


def test_a_refused_call_is_not_made_again():
    import errno

    from flexiqd.errors import FleetError
    from flexiqd.fleet.systemd import Systemd

    bus = StandInBus(BusError(-errno.ENOENT, b"org.freedesktop.systemd1.NoSuchUnit"))
    systemd = Systemd(bus, reopen=lambda: pytest.fail("connected again after a refusal"))
    with pytest.raises(FleetError, match=r"systemd StopUnit\(flexiq-worker@p-1.service, replace\) failed: "
                                         r"org.freedesktop.systemd1.NoSuchUnit"):
        systemd.StopUnit("flexiq-worker@p-1.service")
    assert bus.calls == [b"StopUnit"] and not bus.closed


def test_retries_back_off_from_first_to_most():
    from flexiqd.daemon.backoff import Retry

    retry = Retry(first=1.0, most=4.0)
    assert retry.due(0.0)
    assert retry.failed(0.0) is True      # the first failure of a run: the one to log
    assert not retry.due(0.5) and retry.due(1.0)
    assert retry.failed(1.0) is False and retry.next_at == 3.0
    retry.failed(3.0)
    retry.failed(7.0)
    assert retry.next_at == 11.0          # 1, 2, 4, then 4 at most


class FailsOnce(StandInBus):
    def call_method(self, *args):
        try:
            return super().call_method(*args)
        finally:
            self.failure = None


def test_a_call_systemd_left_unanswered_as_it_re_executed_is_made_again(monkeypatch):
    import errno

    from flexiqd.errors import FleetError
    from flexiqd.fleet.systemd import Systemd

    left = BusError(-errno.ETIMEDOUT, b"org.freedesktop.DBus.Error.NoReply")
    left.err_message = b"Message recipient disconnected from message bus without replying"
    bus = FailsOnce(left)
    systemd = Systemd(bus, reopen=lambda: pytest.fail("the connection itself was fine"))
    systemd.StartUnit("flexiq-worker@p-1.service")
    assert bus.calls == [b"StartUnit", b"StartUnit"]
    # As pystemd raises it: no error name, ETIMEDOUT, and the bus's words.
    nameless = BusError(-errno.ETIMEDOUT, None)
    nameless.err_message = b"Message recipient disconnected from message bus without replying"
    bus = FailsOnce(nameless)
    Systemd(bus).ListUnitsByPatterns([], ["flexiq-worker@*.service"])
    assert bus.calls == [b"ListUnitsByPatterns"] * 2
    # Not forever: a systemd that keeps leaving fails the call after the pauses.
    monkeypatch.setattr("flexiqd.fleet.systemd.REEXEC_PAUSES", (0.0, 0.0))
    bus = StandInBus(left)
    with pytest.raises(FleetError, match="recipient disconnected"):
        Systemd(bus).StartUnit("flexiq-worker@p-1.service")
    assert bus.calls == [b"StartUnit"] * 3
    # A call that timed out is not made again: systemd may be hung, and the tick must not wait twice.
    timed_out = BusError(-errno.ETIMEDOUT, b"org.freedesktop.DBus.Error.NoReply")
    timed_out.err_message = b"Connection timed out"
    bus = StandInBus(timed_out)
    with pytest.raises(FleetError):
        Systemd(bus).StartUnit("flexiq-worker@p-1.service")
    assert bus.calls == [b"StartUnit"]


def test_a_failed_calls_arguments_read_as_text():
    import errno

    from flexiqd.errors import FleetError
    from flexiqd.fleet.systemd import Systemd

    systemd = Systemd(StandInBus(BusError(-errno.ETIMEDOUT, b"org.freedesktop.DBus.Error.NoReply")))
    with pytest.raises(FleetError) as failed:
        systemd.ListUnitsByPatterns([], ["flexiq-worker@*.service"])
    assert str(failed.value).startswith("systemd ListUnitsByPatterns([], [flexiq-worker@*.service]) failed: "
                                        "org.freedesktop.DBus.Error.NoReply")
