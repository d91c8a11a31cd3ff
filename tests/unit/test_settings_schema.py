"""Every setting has one definition, ``flexiqd.settings_schema``, and everything that states one agrees.

The code reads its defaults from the schema (the loader, the config's model, the policy,
the worker's settings, ``AutoscaleConfig``, the ``flexiq`` options); what cannot -- the
shipped ``units/flexiqd.yaml``, the man pages, the worker unit's ``TimeoutStopSec``, the
docs that state a default, the queue's own copies -- is compared with the schema here.
A default changed in one place only makes a test here fail, naming the place.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import inspect
import pathlib
import re
import sys
import threading
from collections.abc import Mapping
from typing import Any, Iterator

import pytest
import yaml
from test_worker import run_until

from flexiqd import Queue
from flexiqd import settings_schema as schema
from flexiqd.settings_schema import AUTOSCALE_FIELDS, BY_KEY, REQUIRED, SETTINGS, default, schema_key, show_default
from flexiqd.durations import parse_duration
from flexiqd.worker.settings import WorkerConfig

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "units" / "flexiqd.yaml"


def _plain(value: Any) -> Any:
    """A default as YAML would load it: mappings as dicts, sequences as lists."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return list(value)
    return value


# -- the schema itself -------------------------------------------------------------------------------

def test_every_setting_is_defined_once_with_a_type_and_a_sentence():
    keys = [s.key for s in schema.SETTINGS + schema.AUTOSCALE_SETTINGS]
    assert len(keys) == len(set(keys))
    for s in BY_KEY.values():
        assert s.type, s.key
        assert s.doc.endswith(".") and not re.search(r"[.!?]\s+[A-Z]", s.doc), f"{s.key}: one sentence"
        if s.type == "duration":
            assert s.unit == "s", s.key
            assert s.default in (None, REQUIRED) or isinstance(s.default, float), s.key
        if s.choices:
            assert s.default in s.choices, s.key
    for s in SETTINGS:
        parent = s.key.rpartition(".")[0]
        assert not parent or parent in BY_KEY or parent.endswith(">"), f"{s.key}: its parent is no setting"


def test_schema_keys_name_the_pool_dependency_and_tenant_placeholders():
    assert schema_key("pools.default.drain_timeout") == "pools.<pool>.drain_timeout"
    assert schema_key("pools.uses.uses.db.weight") == "pools.<pool>.uses.<name>.weight"
    assert schema_key("dependencies.pools.capacity") == "dependencies.<name>.capacity"
    assert schema_key("tenants.acme.max_running") == "tenants.<name>.max_running"


def test_the_schema_imports_nothing_but_the_standard_library():
    source = pathlib.Path(schema.__file__).read_text()
    imports = re.findall(r"^(?:from|import) (\S+)", source, re.M)
    assert set(imports) <= {"__future__", "dataclasses", "types", "typing"}


# -- the code that reads the defaults ----------------------------------------------------------------

def _parsed(text: str):
    from flexiqd.config import parse_config

    return parse_config(text, "test.yaml")


def _loaded() -> dict[str, Any]:
    """Every setting's value in a file that leaves it unset, as the loader builds it."""
    config = _parsed("dependencies: {db: {capacity: 10}}\n"
                     "pools: {default: {uses: {db: {per_worker: 1}}}}\n"
                     "schedules: {hourly: {task: t, cron: '0 * * * *'}}\n"
                     "http: {}\n")
    pool = config.pools["default"]
    policy = pool.policy
    db = config.dependencies["db"]
    use = policy.dependencies[0]
    schedule = config.schedules["hourly"]
    probe = _parsed("dependencies: {db: {capacity: 10, probe: {tcp: 'db:5432'}}}\n").probes["db"]
    pressure = {rule.source.split(":")[1]: rule.threshold for rule in policy.evidence
                if rule.source.startswith("pressure:")}
    values = {
        "store": config.store, "tick": config.tick, "heartbeat": config.heartbeat, "fleet": config.fleet,
        "retention": config.retention, "dead_retention": config.dead_retention,
        "dependencies.<name>.reserved": db.reserved, "dependencies.<name>.start_burst": db.start_burst,
        "dependencies.<name>.limit": config.dependency_limits.get("db"),
        "dependencies.<name>.global": "db" in config.global_dependencies,
        "dependencies.<name>.probe": config.probes.get("db"),
        "dependencies.<name>.probe.postgresql": None, "dependencies.<name>.probe.http": None,
        "dependencies.<name>.probe.tcp": None,  # each unset unless it is the probe's kind
        "dependencies.<name>.probe.statement": probe.statement, "dependencies.<name>.probe.timeout": probe.timeout,
        "dependencies.<name>.probe.factor": probe.factor,
        "pools.<pool>.pressure": pressure or None, "pools.<pool>.pressure.cpu": pressure.get("cpu"),
        "pools.<pool>.pressure.io": pressure.get("io"), "pools.<pool>.pressure.memory": pressure.get("memory"),
        "pools": {name: {} for name in _parsed("").pools},
        "pools.<pool>.app": pool.app, "pools.<pool>.queues": pool.queues,
        "pools.<pool>.concurrency": pool.concurrency, "pools.<pool>.batch_size": pool.batch_size,
        "pools.<pool>.python": pool.python, "pools.<pool>.unit_settings": dict(pool.unit_settings),
        "pools.<pool>.drain_timeout": pool.drain_timeout, "pools.<pool>.lease": pool.lease,
        "pools.<pool>.policy": pool.policy_kind, "pools.<pool>.environment": dict(pool.environment),
        "pools.<pool>.credentials": {c.name: c.path for c in pool.credentials},
        "pools.<pool>.resources.memory_max": pool.memory_max, "pools.<pool>.resources.cpu_weight": pool.cpu_weight,
        "pools.<pool>.min_workers": policy.min_workers, "pools.<pool>.max_workers": policy.max_workers,
        "pools.<pool>.scale_to_zero": policy.scale_to_zero, "pools.<pool>.cpu_bound": policy.cpu_bound,
        "pools.<pool>.uses.<name>.weight": use.weight, "pools.<pool>.uses.<name>.max_latency": use.max_latency,
        "http.token_file": config.http.token_file, "http.allow_remote": config.http.allow_remote,
        "http.scaler_target": config.http.scaler_target,
        "http.listen": f"{config.http.host}:{config.http.port}",
        "http": _parsed("").http,
        "schedules": dict(_parsed("").schedules),
        "schedules.<name>.args": schedule.args, "schedules.<name>.kwargs": dict(schedule.kwargs),
        "schedules.<name>.queue": schedule.queue, "schedules.<name>.priority": schedule.priority,
        "schedules.<name>.max_attempts": schedule.max_attempts, "schedules.<name>.timeout": schedule.timeout,
        "schedules.<name>.tenant": schedule.tenant, "schedules.<name>.timezone": schedule.timezone,
        "schedules.<name>.catch_up": schedule.catch_up.catch_up,
        "schedules.<name>.max_delay": schedule.catch_up.max_delay,
        "schedules.<name>.overlap": schedule.catch_up.overlap,
    }
    for section, value in (("targets", policy.targets), ("behavior", policy.behavior), ("knee", policy.knee),
                           ("flexiq", pool.flexiq)):
        for field in dataclasses.fields(value):
            item = getattr(value, field.name)
            values[f"pools.<pool>.{section}.{field.name}"] = (dataclasses.asdict(item)
                                                             if dataclasses.is_dataclass(item) else item)
    return values


# Settings whose default is "empty" (a section of other settings, a mapping of names) or that must
# be given: the loader has no value of their own to compare.
_CONTAINERS = {s.key for s in SETTINGS if s.type == "section" or s.default is REQUIRED
               or s.key in ("dependencies", "tenants", "pools.<pool>.uses")}


def test_the_loader_gives_every_unset_setting_its_schema_default():
    loaded = _loaded()
    for s in SETTINGS:
        # A limit's keys (the queue's) and a credential's form have no value of their own.
        if s.key in _CONTAINERS or s.key.startswith(("dependencies.<name>.limit.",
                                                      "pools.<pool>.credentials.<name>.")):
            continue
        assert s.key in loaded, f"{s.key}: add it to _loaded() (what the loader makes of it)"
        assert _plain(loaded[s.key]) == _plain(s.default), s.key


def test_the_loaders_known_keys_are_the_schemas():
    from flexiqd.config import load
    from flexiqd.queue.limits import LIMIT_KEYS, TENANT_CAP_KEYS

    assert load.TOP_KEYS == schema.children("")
    assert set(load.POLICY_KEYS) < set(schema.children("pools.<pool>"))
    # The queue parses these two itself (flexiqd.queue.limits): its lists must name the same keys.
    assert LIMIT_KEYS == schema.children("dependencies.<name>.limit")
    assert TENANT_CAP_KEYS == schema.children("tenants.<name>")


def test_the_policys_defaults_are_the_schemas():
    from flexiqd.policy.config import Behavior, Dependency, DependencyUse, KneeConfig, PoolPolicy, Targets
    from flexiqd.policy.flexiq_compat import compute_desired_workers

    for kind, prefix in ((Targets, "pools.<pool>.targets."), (Behavior, "pools.<pool>.behavior."),
                         (KneeConfig, "pools.<pool>.knee."), (Dependency, "dependencies.<name>."),
                         (DependencyUse, "pools.<pool>.uses.<name>."), (PoolPolicy, "pools.<pool>.")):
        for field in dataclasses.fields(kind):
            if prefix + field.name in BY_KEY and field.default is not dataclasses.MISSING:
                value = field.default
                value = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
                assert _plain(value) == _plain(default(prefix + field.name)), f"{kind.__name__}.{field.name}"
    flexiq = inspect.signature(compute_desired_workers).parameters
    for name, key in (("min_workers", "pools.<pool>.min_workers"), ("max_workers", "pools.<pool>.max_workers"),
                      ("concurrency_per_worker", "pools.<pool>.concurrency"),
                      ("target_queue_depth_per_worker", "pools.<pool>.flexiq.target_queue_depth_per_worker"),
                      ("target_utilisation", "pools.<pool>.flexiq.target_utilisation"),
                      ("tolerance", "pools.<pool>.flexiq.tolerance")):
        assert flexiq[name].default == default(key), name


def test_a_worker_left_at_its_defaults_runs_a_default_pools_settings():
    from flexiqd.config.model import FlexiqOptions, HttpConfig
    from flexiqd.worker.settings_reader import DEFAULT_SETTINGS, pool_settings
    from flexiqd.queue.types import ClaimRequest
    from flexiqd.queue.url import DEFAULT_URL
    from flexiqd.worker.settings import WorkerConfig

    pool = _parsed("").pools["default"]
    assert dict(DEFAULT_SETTINGS) == pool_settings(pool)
    worker = WorkerConfig()
    assert {key: getattr(worker, key) for key in DEFAULT_SETTINGS} == pool_settings(pool)
    assert worker.heartbeat == default("heartbeat")
    assert FlexiqOptions() == pool.flexiq
    assert HttpConfig() == _parsed("http: {}").http
    # The queue's own copies (flexiqd.queue is the store's, not the config's).
    assert DEFAULT_URL == default("store")
    assert {f.name: f.default for f in dataclasses.fields(ClaimRequest)}["lease_seconds"] == default(
        "pools.<pool>.lease")


def _flexiq_parser() -> argparse.ArgumentParser:
    from flexiqd.cli.flexiq import build_parser

    return build_parser()


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = _flexiq_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[name]


def test_autoscale_config_and_flexiq_autoscale_take_their_defaults_from_the_schema():
    from flexiqd.autoscale import AutoscaleConfig

    fields = {f.name: f.default for f in dataclasses.fields(AutoscaleConfig) if f.name != "app"}
    assert set(fields) == set(AUTOSCALE_FIELDS)
    for name, key in AUTOSCALE_FIELDS.items():
        assert fields[name] == default(key), name
    options = {a.dest: a for a in _subparser("autoscale")._actions if a.dest not in ("help", "app")}
    assert set(options) == {"target_queue_depth" if n == "target_queue_depth_per_worker" else n
                            for n in AUTOSCALE_FIELDS}
    for name, key in AUTOSCALE_FIELDS.items():
        action = options["target_queue_depth" if name == "target_queue_depth_per_worker" else name]
        assert action.default == default(key), name
        if default(key) not in (None, False):
            assert f"default: {show_default(key)}" in action.help, name


def test_flexiq_worker_options_say_the_default_of_their_setting():
    keys = {"queues": "pools.<pool>.queues", "concurrency": "pools.<pool>.concurrency",
            "lease_seconds": "pools.<pool>.lease", "drain_timeout": "pools.<pool>.drain_timeout",
            "batch_size": "pools.<pool>.batch_size"}
    options = {a.dest: a for a in _subparser("worker")._actions}
    for dest, key in keys.items():
        action = options["lease" if dest == "lease_seconds" else dest]
        assert action.default is None, dest  # not given: the pool's, else the schema's (DEFAULT_SETTINGS)
        if default(key) is not None:
            assert f"else {show_default(key)}" in action.help, dest
    scaler = {a.dest: a.default for a in _subparser("scaler")._actions}
    assert f"{scaler['host']}:{scaler['port']}" == default("http.listen")
    assert scaler["target_queue_depth"] == default("http.scaler_target")


# -- the stop grace ----------------------------------------------------------------------------------

def test_the_stop_grace_is_its_parts_and_every_copy_is_the_schemas():
    from flexiqd.fleet.base import STOP_GRACE, WorkerSpec
    from flexiqd.worker import execution, runtime

    assert schema.STOP_GRACE == (schema.LAST_FLUSH_TIME + schema.INTERRUPT_GRACE + schema.FINAL_SETTLE_TIME
                                 + schema.EXIT_TIME + schema.KILL_MARGIN)
    assert STOP_GRACE is schema.STOP_GRACE
    assert execution.INTERRUPT_GRACE is schema.INTERRUPT_GRACE
    assert runtime.FINAL_SETTLE_TIME is schema.FINAL_SETTLE_TIME
    spec = WorkerSpec(pool="p", app="a:q", queues=("default",), concurrency=1,
                      drain_timeout=default("pools.<pool>.drain_timeout"), lease_seconds=30, store_url="sqlite://")
    assert spec.stop_timeout == default("pools.<pool>.drain_timeout") + schema.STOP_GRACE


def test_a_drain_past_its_budget_asks_systemd_for_the_parts_of_the_grace(tmp_path):
    """The worker's end game as systemd sees it: while draining, never more than the next check
    plus the last flush; when the budget is spent, the interrupt, the last settle and the exit."""
    queue = Queue(f"sqlite:///{tmp_path / 'q.db'}")
    started = threading.Event()

    @queue.task("long")
    async def long():
        started.set()
        await asyncio.sleep(60)

    try:
        long.enqueue()
        _, notifier, code = run_until(queue, started.is_set,
                                      config=WorkerConfig(concurrency=1, drain_timeout=0.3, idle_poll_max=0.05))
    finally:
        queue.close()
    assert code == 0
    asked = [int(m.split("=")[1]) / 1e6 for m in notifier.messages if m.startswith("EXTEND_TIMEOUT_USEC=")]
    *draining, giving_up = asked
    assert draining and all(s <= schema.PROGRESS_PROMISE + schema.LAST_FLUSH_TIME for s in draining)
    assert giving_up == schema.INTERRUPT_GRACE + schema.FINAL_SETTLE_TIME + schema.EXIT_TIME
    assert schema.LAST_FLUSH_TIME + giving_up + schema.KILL_MARGIN == schema.STOP_GRACE


# -- what cannot read the schema: the shipped config, the man pages, the units, the docs --------------

def _generator():
    spec = importlib.util.spec_from_file_location("flexiqd_manpages", REPO / "man" / "manpages.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _once(pairs: Iterator[tuple[str, tuple[str, bool]]], where: str) -> dict[str, tuple[str, bool]]:
    found: dict[str, tuple[str, bool]] = {}
    for path, shown in pairs:
        # Twice: a comment line that reads as a key ("# store: a job ..."), say.
        assert path not in found, f"{where} shows {path} twice: {found[path][0]!r} and {shown[0]!r}"
        found[path] = shown
    return found


def _example_keys() -> dict[str, tuple[str, bool]]:
    """units/flexiqd.yaml as path -> (value as written, commented out?), as man/manpages.py reads it."""
    _title, _header, keys = _generator().parse_config_example(EXAMPLE.read_text())

    def walk(keys, prefix="") -> Iterator[tuple[str, tuple[str, bool]]]:
        for key in keys:
            yield prefix + key.name, (key.value, key.example)
            yield from walk(key.children, f"{prefix}{key.name}.")

    return _once(walk(keys), "units/flexiqd.yaml")


_MAN_KEY = re.compile(r"^\\fB([a-z_][a-z0-9_]*):\\fR(?: (.*))?$")
_EXAMPLE_MARK = " (an example: unset by default)"


def _man_keys() -> dict[str, tuple[str, bool]]:
    """man/flexiqd.yaml.5's KEYS section as path -> (value as shown, an example?)."""
    text = (REPO / "man" / "flexiqd.yaml.5").read_text()
    lines = text.split(".SH KEYS", 1)[1].split("\n.SH ", 1)[0].splitlines()

    def walk() -> Iterator[tuple[str, tuple[str, bool]]]:
        parents: list[str] = []  # the paths of the keys whose children are listed (.RS ... .RE)
        last = ""
        for before, line in zip([""] + lines, lines):
            if line == ".RS":
                parents.append(last)
            elif line == ".RE":
                parents.pop()
            elif before == ".TP" and (match := _MAN_KEY.match(line)):
                value = (match.group(2) or "").replace("\\-", "-").replace("\\e", "\\")
                example = value.endswith(_EXAMPLE_MARK) or value == _EXAMPLE_MARK.strip()
                value = value.removesuffix(_EXAMPLE_MARK).removesuffix(_EXAMPLE_MARK.strip()).strip()
                last = f"{parents[-1]}.{match.group(1)}" if parents else match.group(1)
                yield last, (value, example)

    return _once(walk(), "man/flexiqd.yaml.5")


# Values the shipped file shows as an illustration, not as the default (the default is 0).
_ILLUSTRATIONS = {"dependencies.<name>.reserved"}


def _as_setting(key: str, value: Any) -> Any:
    """A value as the file writes it (``30s``, ``{period: 15s}``) in the schema's terms."""
    kind = BY_KEY[key].type
    if kind == "duration":
        return parse_duration(value)
    if kind == schema._RATE_LIMIT and isinstance(value, dict):
        return {**value, "period": parse_duration(value["period"])}
    return value


def _shown(source: dict[str, tuple[str, bool]]) -> Iterator[tuple[str, str, Any, bool, bool]]:
    """(path, schema key, value, example, inside a flow mapping) of every key the source shows,
    and of the keys in its flow mappings (``limit: {concurrency: 20, ...}``)."""
    for path, (text, example) in source.items():
        key = schema_key(path)
        value = yaml.safe_load(text) if text else None
        yield path, key, value, example, False
        if isinstance(value, dict) and text.startswith("{"):
            for name, item in value.items():
                yield f"{path}.{name}", schema_key(f"{path}.{name}"), item, example, True


def _check_shows_the_defaults(source: dict[str, tuple[str, bool]], where: str) -> None:
    documented = set()
    for path, key, value, example, inside in _shown(source):
        if key.endswith(">"):  # a name of the user's own: pools.default, dependencies.db
            continue
        assert key in BY_KEY, f"{where}: {path} is not in flexiqd.settings_schema"
        documented.add(key)
        s = BY_KEY[key]
        if inside and not key.rpartition(".")[0].endswith(">"):
            continue  # part of its parent's value, which was compared whole
        if value is None and s.type in ("section", "mapping"):
            continue  # its keys follow
        if s.default is REQUIRED or s.default is None:
            assert example, f"{where}: {path} is set, but it has no default (it must be commented out)"
            continue
        if example and key in _ILLUSTRATIONS:
            continue
        assert _plain(_as_setting(key, value)) == _plain(s.default), \
            f"{where}: {path} shows {value!r}; the default is {show_default(key)}"
    missing = [s.key for s in SETTINGS if s.key not in documented]
    assert not missing, f"{where} does not document {', '.join(missing)}"


def test_the_shipped_config_shows_every_setting_with_its_default():
    _check_shows_the_defaults(_example_keys(), "units/flexiqd.yaml")
    # "Every value below is the default": the file means what an empty one means.
    text = EXAMPLE.read_text()
    assert _parsed(text) == dataclasses.replace(_parsed(""), source=text)


def test_the_config_man_page_shows_every_setting_with_its_default():
    _check_shows_the_defaults(_man_keys(), "man/flexiqd.yaml.5")


def _man_options(command: str) -> dict[str, str]:
    """man/flexiq.1's options of ``command`` (``flexiq autoscale``): option -> its help, unescaped."""
    text = (REPO / "man" / "flexiq.1").read_text()
    section = text.split(f'.SS "{command}"', 1)[1].split("\n.SS ", 1)[0].replace("\\-", "-")
    return {m.group(1): m.group(2) for m in re.finditer(r"^\\fB(--[a-z-]+)\\fR.*\n(?!\.)(.*)$", section, re.M)}


def test_the_flexiq_man_page_states_the_schemas_defaults():
    autoscale = _man_options("flexiq autoscale")
    options = {a.dest: a.option_strings[0] for a in _subparser("autoscale")._actions}
    for name, key in AUTOSCALE_FIELDS.items():
        if default(key) not in (None, False):
            option = options["target_queue_depth" if name == "target_queue_depth_per_worker" else name]
            assert f"default: {show_default(key)}" in autoscale[option], f"man/flexiq.1: flexiq autoscale {option}"
    worker = _man_options("flexiq worker")
    for option, key in (("--concurrency", "pools.<pool>.concurrency"), ("--lease", "pools.<pool>.lease"),
                        ("--drain-timeout", "pools.<pool>.drain_timeout"), ("--queues", "pools.<pool>.queues")):
        assert f"else {show_default(key)}" in worker[option], f"man/flexiq.1: flexiq worker {option}"


_WORDS = {"one": 1, "two": 2, "three": 3, "five": 5, "ten": 10}


def _number(text: str) -> float:
    return float(_WORDS.get(text, None) or parse_duration(text))


# (file, what it says with the value in a group, the value the schema gives).  A space in a
# pattern stands for any whitespace: the docs wrap their lines.
STATEMENTS = [
    ("units/flexiq-worker@.service", r"^TimeoutStopSec=(\S+)$",
     lambda: default("pools.<pool>.drain_timeout") + schema.STOP_GRACE),
    ("units/flexiq-worker@.service", r"the pool's drain budget \+ (\d+) s", lambda: schema.STOP_GRACE),
    ("units/flexiqd.yaml", r"TimeoutStopSec is this plus (\w+)\.", lambda: schema.STOP_GRACE),
    ("units/flexiqd.yaml", r"start \(and connect\) at once \(default (\d+)\)",
     lambda: default("dependencies.<name>.start_burst")),
    ("docs/guarantees.md", r"\(`STOP_GRACE`, (\d+) s\)", lambda: schema.STOP_GRACE),
    ("docs/guarantees.md", r"waits (\w+) more second", lambda: schema.INTERRUPT_GRACE),
    ("docs/guarantees.md", r"\(`heartbeat`, (\d+) s by default\)", lambda: default("heartbeat")),
    ("docs/guarantees.md", r"once the lease \((\d+) s\) ends", lambda: default("pools.<pool>.lease")),
    ("docs/postgresql.md", r"every `heartbeat` \((\d+) s by default\)", lambda: default("heartbeat")),
    ("docs/postgresql.md", r"within half a heartbeat of it\*\* \((\d+) s by default", lambda: default("heartbeat") / 2),
    ("docs/metrics.md", r"listen: (\S+) +# the default", lambda: default("http.listen")),
    ("docs/metrics.md", r"`http.scaler_target`, default (\d+)", lambda: default("http.scaler_target")),
    ("README.md", r"`http: \{\}` serves on (\S+)\)", lambda: default("http.listen")),
]


@pytest.mark.parametrize("path,pattern,expected", STATEMENTS, ids=[f"{p}:{r[:30]}" for p, r, _ in STATEMENTS])
def test_a_default_stated_outside_the_code_is_the_schemas(path, pattern, expected):
    text = (REPO / path).read_text()
    found = re.findall(pattern.replace(" ", r"\s+"), text, re.M)
    assert found, f"{path} no longer says {pattern!r}: update this table with it"
    want = expected()
    for value in found:
        assert (value if isinstance(want, str) else _number(value)) == want, \
            f"{path} says {value} where the schema has {want}"
