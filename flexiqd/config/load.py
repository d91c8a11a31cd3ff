"""Read and validate ``/etc/flexiqd/flexiqd.yaml``.

A file is accepted whole or rejected whole: every error names the dotted path
of the bad key (``pools.default.max_workers``) and why; an unknown key also
names the nearest valid one.

A worker reads the file too, for its pool's settings (``policies=False``): it leaves
out the scaling policy's sections (the daemon, which reads them, has checked them),
and so does not load the decision code.
"""

from __future__ import annotations

import dataclasses
import re
from urllib.parse import urlsplit
from typing import Any, Mapping

from typing import TYPE_CHECKING

import yaml

from ..durations import parse_duration
from ..errors import ConfigError, FlexiqdError, StoreUnavailable
from ..fleet.base import POOL_NAME, Credential
from ..queue.limits import DependencyLimit, LimitError, TenantCaps, limit_from_mapping, tenant_caps_from_mapping
from ..queue.url import check_url, safe_url
from ..settings_schema import SETTINGS, children, default, setting
from .model import (DEFAULT_HTTP_HOST, DEFAULT_HTTP_PORT, DEFAULT_STORE, DaemonConfig, FlexiqOptions, HttpConfig,
                    ProbeConfig,
                    PoolConfig, ScheduleConfig)

if TYPE_CHECKING:
    from ..policy.config import Dependency

# The keys each level knows, in the schema's order (the order an unknown key's error lists them).
TOP_KEYS = children("")
HTTP_KEYS = children("http")
POOL_KEYS = children("pools.<pool>")
POLICY_KEYS = ("min_workers", "max_workers", "scale_to_zero", "cpu_bound", "targets", "behavior", "knee")
RESOURCE_KEYS = children("pools.<pool>.resources")
DEPENDENCY_KEYS = children("dependencies.<name>")
PROBE_KEYS = children("dependencies.<name>.probe")
PROBE_KINDS = ("postgresql", "tcp", "http")
PRESSURE_KEYS = children("pools.<pool>.pressure")
GLOBAL_MAX_KEYS = ("count", "global")
# The heartbeat's range: below it the beats load the store; above it a dead host's jobs wait long.
HEARTBEAT_MIN, HEARTBEAT_MAX = 0.2, 60.0
FLEXIQ_KEYS = children("pools.<pool>.flexiq")
# Durations inside a pool's sections (targets, behavior, knee, uses, flexiq), so `5m` works
# where the policy wants seconds.
DURATION_KEYS = frozenset(s.key.rsplit(".", 1)[1] for s in SETTINGS
                          if s.type == "duration" and s.key.startswith("pools.<pool>.") and s.key.count(".") >= 3)
CREDENTIAL_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
SCHEDULE_KEYS = children("schedules.<name>")
SCHEDULE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)?$", re.IGNORECASE)


def load_config(path: str, *, fleet: str | None = None, policies: bool = True) -> DaemonConfig:
    """Parse and validate the file at ``path``; ``ConfigError`` names what is wrong and where.
    ``policies=False``: a worker's reading, without the pools' scaling policies (None) and the
    dependencies' capacities (none)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror}") from None
    return parse_config(text, path, fleet=fleet, policies=policies)


def parse_config(text: str, path: str = "<config>", *, fleet: str | None = None,
                 policies: bool = True) -> DaemonConfig:
    """Validate ``text``; ``fleet`` (the daemon's --fleet) overrides the file's, as the checks do."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}:{where}: not valid YAML: {problem}") from None
    if data is None:
        data = {}
    try:
        config = _daemon(data, path, fleet, policies)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return dataclasses.replace(config, source=text)


def _close_match(name: str, names: list[str] | tuple[str, ...]) -> list[str]:
    import difflib  # only a file with a mistake needs it: not every worker's start

    return difflib.get_close_matches(name, names, n=1, cutoff=0.6)


def _ip_address(host: str):
    import ipaddress  # only the daemon's http section needs it

    return ipaddress.ip_address(host)


def _fail(where: str, why: str) -> ConfigError:
    return ConfigError(f"{where}: {why}")


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(where, f"must be a mapping, got {_show(value)}")
    return value


def _known(mapping: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    for key in mapping:
        if key not in known:
            close = _close_match(str(key), known)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
            raise _fail(f"{where}.{key}" if where else str(key), f"unknown key{hint}")


def _show(value: Any) -> str:
    return repr(value) if not isinstance(value, (dict, list)) else type(value).__name__


def _duration(value: Any, where: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise _fail(where, str(exc)) from None


def _int(value: Any, where: str, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, f"must be a whole number, got {_show(value)}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise _fail(where, f"must be {bound}, got {value}")
    return value


def _number(value: Any, where: str, low: float, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(where, f"must be a number, got {_show(value)}")
    if value < low or (high is not None and value > high):
        raise _fail(where, f"must be between {low:g} and {high:g}, got {value}" if high is not None
                    else f"must be at least {low:g}, got {value}")
    return float(value)


def _daemon(data: Any, path: str, fleet_override: str | None, policies: bool = True) -> DaemonConfig:
    data = _mapping(data, "the file")
    _known(data, TOP_KEYS, "")
    store = data.get("store", DEFAULT_STORE)
    if not isinstance(store, str) or "://" not in store and not store.startswith("sqlite:"):
        shown = repr(safe_url(store)) if isinstance(store, str) else _show(store)
        raise _fail("store", f"must be a store URL such as {DEFAULT_STORE}, got {shown}")
    try:
        check_url(store)
    except StoreUnavailable as exc:
        raise _fail("store", str(exc)) from None
    tick = _duration(data.get("tick", default("tick")), "tick")
    if tick <= 0:
        raise _fail("tick", "must be more than 0s")
    heartbeat = _duration(data.get("heartbeat", default("heartbeat")), "heartbeat")
    if not HEARTBEAT_MIN <= heartbeat <= HEARTBEAT_MAX:
        raise _fail("heartbeat", f"must be between {HEARTBEAT_MIN:g}s and {HEARTBEAT_MAX:g}s, got {heartbeat:g}s")
    fleet = _choice(data.get("fleet", default("fleet")), "fleet", "fleet")
    fleet = fleet_override or fleet
    dependencies_data = _mapping(data.get("dependencies") or {}, "dependencies")
    dependencies = ({name: _dependency(name, value) for name, value in dependencies_data.items()}
                    if policies else {})
    limits = {str(name): _dependency_limit(str(name), value["limit"])
              for name, value in dependencies_data.items() if value.get("limit") is not None}
    probes = ({str(name): _probe(str(name), value["probe"]) for name, value in dependencies_data.items()
               if value.get("probe") is not None} if policies else {})
    global_dependencies = frozenset(str(name) for name, value in dependencies_data.items()
                                    if _flag(value.get("global", default("dependencies.<name>.global")),
                                             f"dependencies.{name}.global"))
    pools_data = data.get("pools")
    if pools_data is None:
        pools_data = default("pools")
    pools_data = _mapping(pools_data, "pools")
    global_max = {}
    for name, value in pools_data.items():
        if isinstance(value, Mapping) and isinstance(value.get("max_workers"), Mapping):
            count, shared = _max_workers(value["max_workers"], f"pools.{name}.max_workers")
            pools_data = {**pools_data, name: {**value, "max_workers": count}}
            if shared:
                global_max[str(name)] = count
    pools = {str(name): _pool(str(name), value, dependencies, fleet, limits, policies, probes)
             for name, value in pools_data.items()}
    retention = _duration(data.get("retention", default("retention")), "retention")
    dead_retention = _duration(data.get("dead_retention", default("dead_retention")), "dead_retention")
    http = _http(data["http"]) if data.get("http") is not None else None
    schedules = _schedules(data.get("schedules")) if policies else {}
    return DaemonConfig(path=path, store=store, tick=tick, fleet=fleet, retention=retention, schedules=schedules,
                        dead_retention=dead_retention,
                        dependencies=dependencies, pools=pools, http=http,
                        dependency_limits=limits, tenant_caps=_tenant_caps(data.get("tenants")), heartbeat=heartbeat,
                        global_dependencies=global_dependencies, global_max_workers=global_max,
                        probes=probes)


def _choice(value: Any, key: str, where: str) -> str:
    """``value`` if it is one of the choices of the setting at ``key``."""
    choices = setting(key).choices
    if value not in choices:
        raise _fail(where, f"must be {' or '.join(map(repr, choices))}, got {_show(value)}")
    return value


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(where, f"must be true or false, got {_show(value)}")
    return value


def _max_workers(value: Mapping[str, Any], where: str) -> tuple[int, bool]:
    """``max_workers: {count: N, global: true}``: N workers, per host or for the whole fleet."""
    _known(value, GLOBAL_MAX_KEYS, where)
    if "count" not in value:
        raise _fail(f"{where}.count", "is required (the most workers)")
    return _int(value["count"], f"{where}.count", 0), _flag(value.get("global", False), f"{where}.global")


def parse_listen(value: Any, where: str) -> tuple[str, int]:
    """``127.0.0.1:8739``, ``[::1]:8739``, ``localhost:8739`` or a bare port -> (host, port)."""
    if isinstance(value, int) and not isinstance(value, bool):
        host, port_text = DEFAULT_HTTP_HOST, str(value)
    elif isinstance(value, str):
        match = re.match(r"^(?:\[([0-9A-Fa-f:.]+)\]|([^:\[\]]*)):(\d{1,5})$", value.strip())
        if not match:
            raise _fail(where, f"must be host:port such as {DEFAULT_HTTP_HOST}:{DEFAULT_HTTP_PORT} "
                               f"(an IPv6 address in brackets), got {_show(value)}")
        host, port_text = match.group(1) or match.group(2), match.group(3)
    else:
        raise _fail(where, f"must be host:port such as {DEFAULT_HTTP_HOST}:{DEFAULT_HTTP_PORT}, "
                           f"got {_show(value)}")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise _fail(where, f"the port must be between 1 and 65535, got {port}")
    if host != "localhost":
        try:
            _ip_address(host)
        except ValueError:
            raise _fail(where, f"the host must be an IP address or localhost, got {host!r}") from None
    return host, port


def is_loopback(host: str) -> bool:
    return host == "localhost" or _ip_address(host).is_loopback


def _http(value: Any) -> HttpConfig:
    value = _mapping(value, "http")
    _known(value, HTTP_KEYS, "http")
    host, port = parse_listen(value.get("listen", default("http.listen")), "http.listen")
    allow_remote = value.get("allow_remote", default("http.allow_remote"))
    if not isinstance(allow_remote, bool):
        raise _fail("http.allow_remote", f"must be true or false, got {_show(allow_remote)}")
    token_file = value.get("token_file", default("http.token_file"))
    if token_file is not None and (not isinstance(token_file, str) or not token_file.startswith("/")):
        raise _fail("http.token_file", f"must be an absolute file path, got {_show(token_file)}")
    if not is_loopback(host):
        if not allow_remote:
            raise _fail("http.listen", f"{host} is not a loopback address: set http.allow_remote: true "
                                       f"(and http.token_file) to serve other machines")
        if token_file is None:
            raise _fail("http.token_file", f"is required to listen on {host}, which is not loopback: "
                                           f"other machines must present a bearer token")
    target = _int(value.get("scaler_target", default("http.scaler_target")), "http.scaler_target", 1)
    return HttpConfig(host=host, port=port, token_file=token_file, allow_remote=allow_remote,
                      scaler_target=target)


def _dependency(name: str, value: Any) -> Dependency:
    from ..policy.config import Dependency
    from ..policy.errors import PolicyConfigError

    where = f"dependencies.{name}"
    value = _mapping(value, where)
    _known(value, DEPENDENCY_KEYS, where)
    if "capacity" not in value:
        raise _fail(f"{where}.capacity", "is required (connections, or requests per second)")
    capacity = _number(value["capacity"], f"{where}.capacity", 0)
    reserved = _number(value.get("reserved", default("dependencies.<name>.reserved")), f"{where}.reserved", 0)
    extra = {"start_burst": value["start_burst"]} if "start_burst" in value else {}
    try:
        return Dependency(name=name, capacity=capacity, reserved=reserved, **extra)
    except PolicyConfigError as exc:
        raise _fail(where, str(exc)) from None


def _probe(name: str, value: Any) -> ProbeConfig:
    """``dependencies.<name>.probe``: exactly one of postgresql, tcp, http, with its options."""
    where = f"dependencies.{name}.probe"
    value = _mapping(value, where)
    _known(value, PROBE_KEYS, where)
    kinds = [kind for kind in PROBE_KINDS if value.get(kind) is not None]
    if len(kinds) != 1:
        raise _fail(where, f"needs exactly one of {', '.join(PROBE_KINDS)}"
                           + (f", got {' and '.join(kinds)}" if kinds else ""))
    kind = kinds[0]
    target = value[kind]
    here = f"{where}.{kind}"
    if not isinstance(target, str) or not target.strip():
        raise _fail(here, f"must be a string, got {_show(target)}")
    if kind == "postgresql":
        if urlsplit(target).scheme not in ("postgresql", "postgres"):
            raise _fail(here, f"must be a postgresql:// URL, got {safe_url(target)!r}")
        try:
            check_url(target)
        except StoreUnavailable as exc:
            raise _fail(here, str(exc)) from None
    elif kind == "http":
        parts = urlsplit(target)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _fail(here, f"must be an http:// or https:// URL, got {safe_url(target)!r}")
    else:
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise _fail(here, f"must be host:port (a port 1-65535), got {target!r}")
    for key in ("statement",):
        if key in value and (not isinstance(value[key], str) or not value[key].strip()):
            raise _fail(f"{where}.{key}", f"must be an SQL statement, got {_show(value[key])}")
    if "statement" in value and kind != "postgresql":
        raise _fail(f"{where}.statement", f"is for a postgresql probe, not {kind}")
    timeout = _duration(value.get("timeout", default("dependencies.<name>.probe.timeout")), f"{where}.timeout")
    if timeout <= 0:
        raise _fail(f"{where}.timeout", "must be more than 0s")
    factor = value.get("factor", default("dependencies.<name>.probe.factor"))
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 1:
        raise _fail(f"{where}.factor", f"must be a number above 1, got {_show(factor)}")
    return ProbeConfig(dependency=name, kind=kind, target=target.strip(),
                       statement=value.get("statement", default("dependencies.<name>.probe.statement")),
                       timeout=timeout, factor=float(factor))


def _pressure(value: Any, where: str, fleet: str) -> tuple[tuple[str, float], ...]:
    """``pools.<pool>.pressure``: (resource, stalled percentage) per resource given."""
    if value is None:
        return ()
    value = _mapping(value, where)
    _known(value, PRESSURE_KEYS, where)
    if value and fleet != "systemd":
        raise _fail(where, "needs fleet: systemd (the pressure is read from each worker unit's cgroup)")
    found = []
    for resource in PRESSURE_KEYS:
        if value.get(resource) is None:
            continue
        level = value[resource]
        if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level <= 100:
            raise _fail(f"{where}.{resource}", f"must be a percentage above 0 and at most 100, got {_show(level)}")
        found.append((resource, float(level)))
    return tuple(found)


def _dependency_limit(name: str, value: Any) -> DependencyLimit:
    """``dependencies.<name>.limit``: what the workers enforce (see flexiqd.queue.limits)."""
    try:
        return limit_from_mapping(name, value)
    except LimitError as exc:
        raise _fail(f"dependencies.{name}.{exc.key}", exc.why) from None


def _tenant_caps(value: Any) -> TenantCaps:
    """``tenants``: the running jobs each tenant may have at once (see flexiqd.queue.limits)."""
    if value is None:
        return TenantCaps()
    if isinstance(value, Mapping):
        # A tenant named by a number (`42:`) is the tenant "42", as jobs name it.
        value = {str(key) if isinstance(key, int) and not isinstance(key, bool) else key: entry
                 for key, entry in value.items()}
    try:
        return tenant_caps_from_mapping(value)
    except LimitError as exc:
        raise _fail("tenants" if exc.key == "tenants" else f"tenants.{exc.key}", exc.why) from None


def _pool(name: str, value: Any, dependencies: Mapping[str, Dependency], fleet: str,
          limits: Mapping[str, DependencyLimit], policies: bool = True,
          probes: Mapping[str, ProbeConfig] | None = None) -> PoolConfig:
    where = f"pools.{name}"
    if not POOL_NAME.match(name):
        raise _fail(where, "a pool name may hold only a-z, 0-9 and _")
    value = _mapping(value if value is not None else {}, where)
    _known(value, POOL_KEYS, where)
    app = value.get("app", default("pools.<pool>.app"))
    if not isinstance(app, str) or app.count(":") != 1 or not all(app.split(":")):
        raise _fail(f"{where}.app", f"must be module:attribute, got {_show(app)}")
    python = _python(value.get("python"), f"{where}.python")
    queues = value.get("queues", list(default("pools.<pool>.queues")))
    if isinstance(queues, str):
        queues = [queues]
    if not isinstance(queues, list) or not queues or not all(isinstance(q, str) and q for q in queues):
        raise _fail(f"{where}.queues", f"must be a list of queue names, got {_show(queues)}")
    kind = _choice(value.get("policy", default("pools.<pool>.policy")), "pools.<pool>.policy", f"{where}.policy")
    environment = _mapping(value.get("environment") or {}, f"{where}.environment")
    for key, val in environment.items():
        if not isinstance(key, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise _fail(f"{where}.environment.{key}", "is not a valid variable name")
        if not isinstance(val, (str, int, float)) or isinstance(val, bool):
            raise _fail(f"{where}.environment.{key}", f"must be a string, got {_show(val)}")
        if "\0" in str(val):
            raise _fail(f"{where}.environment.{key}", "must not contain a NUL character")
    resources = _mapping(value.get("resources") or {}, f"{where}.resources")
    _known(resources, RESOURCE_KEYS, f"{where}.resources")
    memory_max = (_size(resources["memory_max"], f"{where}.resources.memory_max")
                  if resources.get("memory_max") is not None else None)
    cpu_weight = (_int(resources["cpu_weight"], f"{where}.resources.cpu_weight", 1, 10000)
                  if resources.get("cpu_weight") is not None else None)
    drain = _duration(value.get("drain_timeout", default("pools.<pool>.drain_timeout")), f"{where}.drain_timeout")
    lease = _duration(value.get("lease", default("pools.<pool>.lease")), f"{where}.lease")
    if lease <= 0:
        raise _fail(f"{where}.lease", "must be more than 0s")
    return PoolConfig(
        name=name, app=app, queues=tuple(queues),
        concurrency=_int(value.get("concurrency", default("pools.<pool>.concurrency")), f"{where}.concurrency",
                         1, 10000),
        drain_timeout=drain, lease=lease, policy_kind=kind,
        policy=(_with_evidence(_policy(value, where, dependencies, limits), probes or {},
                               _pressure(value.get("pressure"), f"{where}.pressure", fleet))
                if policies else None),
        flexiq=_flexiq(value.get("flexiq"), where) if policies else FlexiqOptions(),
        environment={str(k): str(v) for k, v in environment.items()},
        memory_max=memory_max, cpu_weight=cpu_weight,
        batch_size=(_int(value["batch_size"], f"{where}.batch_size", 1)
                    if value.get("batch_size") is not None else None),
        credentials=_credentials(value.get("credentials"), f"{where}.credentials", fleet),
        python=python, unit_settings=_unit_settings(value.get("unit_settings"), f"{where}.unit_settings"))


# The settings of a worker unit that flexiqd itself sets or relies on: a pool's
# unit_settings may not change them (its stop timeout, its user, how it is told to stop...).
FLEXIQD_OWNS = frozenset({
    "Type", "NotifyAccess", "ExecStart", "ExecStartPre", "ExecStartPost", "ExecStop", "ExecStopPost",
    "ExecReload", "User", "Group", "DynamicUser", "KillMode", "KillSignal", "TimeoutStopSec", "TimeoutSec",
    "TimeoutStartSec", "Restart", "RestartSec", "WatchdogSec", "Environment", "EnvironmentFile", "UnsetEnvironment",
    "LoadCredential", "LoadCredentialEncrypted", "SetCredential", "SetCredentialEncrypted", "MemoryMax",
    "CPUWeight", "WorkingDirectory", "RemainAfterExit", "PIDFile", "BusName"})


def _unit_settings(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    """``unit_settings``: systemd [Service] directives for the pool's workers, each written as
    ``Name=value`` (a list: one line per item), values verbatim (``%`` is not a specifier)."""
    if not value:
        return ()
    value = _mapping(value, where)
    lines = []
    for name, given in value.items():
        here = f"{where}.{name}"
        if not isinstance(name, str) or not re.match(r"^[A-Z][A-Za-z0-9]*$", name):
            raise _fail(here, "is not a systemd setting name (as systemd spells them: ReadWritePaths)")
        if name in FLEXIQD_OWNS:
            raise _fail(here, "is set by flexiqd itself (use the pool's own key where there is one: "
                              "environment, credentials, resources, drain_timeout, python)")
        for item in given if isinstance(given, list) else [given]:
            if isinstance(item, bool):
                item = "yes" if item else "no"
            if not isinstance(item, (str, int, float)):
                raise _fail(here, f"must be a value or a list of values, got {_show(item)}")
            text = str(item)
            if not text.isprintable() or "\\" in text:
                raise _fail(here, "must not contain control characters or backslashes")
            lines.append((name, text))
    return tuple(lines)


def _python(value: Any, where: str) -> str | None:
    """``pools.<pool>.python``: an absolute path that an ExecStart= line takes verbatim."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith("/"):
        raise _fail(where, f"must be an absolute path to a python interpreter, got {_show(value)}")
    if re.search(r"[\s\"'\\%;$`]", value) or not value.isprintable():
        raise _fail(where, "must not contain spaces, quotes, backslashes, %, ;, $ or control characters")
    return value


def _credentials(value: Any, where: str, fleet: str) -> tuple[Credential, ...]:
    """``name: /path`` (LoadCredential=) or ``name: {encrypted: /path}`` (LoadCredentialEncrypted=)."""
    if not value:
        return ()
    value = _mapping(value, where)
    if fleet != "systemd":
        raise _fail(where, "needs fleet: systemd (systemd hands each worker unit its credentials; "
                           "child processes of the process fleet have no private place for them)")
    credentials = []
    for name, source in value.items():
        here = f"{where}.{name}"
        if not isinstance(name, str) or not CREDENTIAL_NAME.match(name) or name in (".", ".."):
            raise _fail(here, "a credential name may hold only A-Z, a-z, 0-9, _, . and -")
        encrypted = isinstance(source, Mapping)
        if encrypted:
            _known(source, children("pools.<pool>.credentials.<name>"), here)
            if "encrypted" not in source:
                raise _fail(f"{here}.encrypted", "is required: the path of a file made by systemd-creds encrypt")
            source, here = source["encrypted"], f"{here}.encrypted"
        if not isinstance(source, str) or not source.startswith("/"):
            raise _fail(here, f"must be an absolute file path, got {_show(source)}")
        if _CONTROL.search(source):
            raise _fail(here, "must not contain control characters (a newline, a tab, ...)")
        credentials.append(Credential(name=name, path=source, encrypted=encrypted))
    return tuple(credentials)


def _policy(value: Mapping[str, Any], where: str, dependencies: Mapping[str, Dependency],
            limits: Mapping[str, DependencyLimit]):
    from ..policy.config import pool_policy_from_mapping
    from ..policy.errors import PolicyConfigError

    mapping: dict[str, Any] = {key: _with_durations(value[key], f"{where}.{key}")
                               for key in POLICY_KEYS if key in value}
    uses = value.get("uses")
    if uses is not None:
        uses = _mapping(uses, f"{where}.uses")
        mapping["dependencies"] = []
        for dep_name, use in uses.items():
            if dep_name not in dependencies:
                close = _close_match(str(dep_name), list(dependencies))
                hint = f"; did you mean {close[0]!r}?" if close else " (declare it under dependencies:)"
                raise _fail(f"{where}.uses.{dep_name}", f"no such dependency{hint}")
            use = dict(_with_durations(_mapping(use, f"{where}.uses.{dep_name}"), f"{where}.uses.{dep_name}"))
            if "max_latency" in use and dep_name not in limits:
                raise _fail(f"{where}.uses.{dep_name}.max_latency",
                            f"needs dependencies.{dep_name}.limit: the latency is measured as the time "
                            f"jobs hold a limited dependency, and {dep_name!r} has no limit")
            mapping["dependencies"].append({"dependency": dep_name, **use})
    try:
        return pool_policy_from_mapping(mapping)
    except PolicyConfigError as exc:
        raise _fail(f"{where}.{_policy_field(exc.field, mapping)}", exc.why) from None


def _with_evidence(policy, probes: Mapping[str, ProbeConfig], pressure: tuple[tuple[str, float], ...]):
    """The pool's policy heeding the probes of the dependencies it uses and its pressure thresholds."""
    from ..policy.config import EvidenceRule

    rules = tuple(EvidenceRule(source=f"probe:{use.dependency}", threshold=probes[use.dependency].factor)
                  for use in policy.dependencies if use.dependency in probes)
    rules += tuple(EvidenceRule(source=f"pressure:{resource}", threshold=level) for resource, level in pressure)
    return dataclasses.replace(policy, evidence=rules) if rules else policy


def _policy_field(field: str, mapping: Mapping[str, Any]) -> str:
    """The policy names its own fields: map ``dependencies[0].x`` back to ``uses.<name>.x``."""
    match = re.match(r"^dependencies\[(\d+)\]\.?(.*)$", field)
    if not match or "dependencies" not in mapping:
        return field
    dependency = mapping["dependencies"][int(match.group(1))]["dependency"]
    return f"uses.{dependency}.{match.group(2)}" if match.group(2) else f"uses.{dependency}"


def _with_durations(value: Any, where: str) -> Any:
    """Turn duration strings under known duration keys into seconds, recursively."""
    if isinstance(value, Mapping):
        return {key: (_duration(val, f"{where}.{key}") if key in DURATION_KEYS and isinstance(val, str)
                      else _with_durations(val, f"{where}.{key}")) for key, val in value.items()}
    return value


def _flexiq(value: Any, where: str) -> FlexiqOptions:
    if value is None:
        return FlexiqOptions()
    where = f"{where}.flexiq"
    value = _mapping(value, where)
    _known(value, FLEXIQ_KEYS, where)
    unset = FlexiqOptions()  # the schema's defaults
    options = FlexiqOptions(
        target_queue_depth_per_worker=value.get("target_queue_depth_per_worker",
                                                unset.target_queue_depth_per_worker),
        target_utilisation=value.get("target_utilisation", unset.target_utilisation),
        tolerance=value.get("tolerance", unset.tolerance),
        scale_up_window=_duration(value.get("scale_up_window", unset.scale_up_window), f"{where}.scale_up_window"),
        scale_down_window=_duration(value.get("scale_down_window", unset.scale_down_window),
                                    f"{where}.scale_down_window"))
    try:
        # The compatibility policy validates its own options; one idle call runs that check.
        from ..policy import compute_desired_workers

        compute_desired_workers(0, 0, 1, min_workers=0, max_workers=1,
                                target_queue_depth_per_worker=options.target_queue_depth_per_worker,
                                target_utilisation=options.target_utilisation,
                                tolerance=options.tolerance)
    except ValueError as exc:
        raise _fail(where, str(exc)) from None
    return options


def _size(value: Any, where: str) -> int:
    """Bytes from ``512M``, ``2G``, ``1073741824`` (1024-based, as systemd reads them)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = _SIZE.match(str(value).strip())
    if not match:
        raise _fail(where, f"must be a size such as 512M or 2G, got {_show(value)}")
    number, unit = float(match.group(1)), match.group(2).upper()
    size = int(number * 1024 ** " KMGT".index(unit or " "))
    if size <= 0:
        raise _fail(where, "must be more than 0")
    return size


def _schedules(value: Any) -> dict[str, ScheduleConfig]:
    """``schedules``: periodic jobs by name (see flexiqd.schedules)."""
    if value is None:
        return {}
    value = _mapping(value, "schedules")
    return {str(name): _schedule(str(name), entry) for name, entry in value.items()}


def _schedule(name: str, value: Any) -> ScheduleConfig:
    from ..schedules.calendar import CalendarError, parse_calendar
    from ..schedules.words import CatchUp

    where = f"schedules.{name}"
    if not SCHEDULE_NAME.match(name):
        raise _fail(where, "a schedule name may hold only A-Z, a-z, 0-9, _, . and - (at most 100)")
    value = _mapping(value if value is not None else {}, where)
    _known(value, SCHEDULE_KEYS, where)
    for key in ("task", "cron"):
        if key not in value:
            raise _fail(f"{where}.{key}", "is required" + (" (the task's name, as the application registers it)"
                                                           if key == "task" else " (such as '0 3 * * *')"))
    task = value["task"]
    if not isinstance(task, str) or not task.strip():
        raise _fail(f"{where}.task", f"must be a task name, got {_show(task)}")
    cron, zone = value["cron"], value.get("timezone", default("schedules.<name>.timezone"))
    if not isinstance(cron, str):
        raise _fail(f"{where}.cron", f"must be a cron expression such as '0 3 * * *' (quoted), got {_show(cron)}")
    try:
        calendar = parse_calendar(cron.strip(), zone)
    except CalendarError as exc:
        raise _fail(f"{where}.{exc.field}", str(exc)) from None
    args = value.get("args", list(default("schedules.<name>.args")))
    if not isinstance(args, list):
        raise _fail(f"{where}.args", f"must be a list of arguments, got {_show(args)}")
    kwargs = _mapping(value.get("kwargs") if value.get("kwargs") is not None else {}, f"{where}.kwargs")
    for key in kwargs:
        if not isinstance(key, str) or not key.isidentifier():
            raise _fail(f"{where}.kwargs.{key}", "is not a keyword argument's name")
    queue = value.get("queue", default("schedules.<name>.queue"))
    if not isinstance(queue, str) or not queue:
        raise _fail(f"{where}.queue", f"must be a queue name, got {_show(queue)}")
    tenant = value.get("tenant", default("schedules.<name>.tenant"))
    if isinstance(tenant, int) and not isinstance(tenant, bool):
        tenant = str(tenant)  # as tenants: a tenant named by a number is that number's text
    if tenant is not None and (not isinstance(tenant, str) or not tenant):
        raise _fail(f"{where}.tenant", f"must be a tenant name, got {_show(tenant)}")
    timeout = value.get("timeout", default("schedules.<name>.timeout"))
    if timeout is not None:
        timeout = _duration(timeout, f"{where}.timeout")
        if timeout <= 0:
            raise _fail(f"{where}.timeout", "must be more than 0s")
    max_delay = _duration(value.get("max_delay", default("schedules.<name>.max_delay")), f"{where}.max_delay")
    policy = CatchUp(
        catch_up=_choice(value.get("catch_up", default("schedules.<name>.catch_up")), "schedules.<name>.catch_up",
                         f"{where}.catch_up"),
        max_delay=max_delay,
        overlap=_choice(value.get("overlap", default("schedules.<name>.overlap")), "schedules.<name>.overlap",
                        f"{where}.overlap"))
    config = ScheduleConfig(
        name=name, task=task.strip(), cron=cron.strip(), timezone=zone, calendar=calendar, args=tuple(args),
        kwargs=dict(kwargs), queue=queue,
        priority=_int(value.get("priority", default("schedules.<name>.priority")), f"{where}.priority", -(2 ** 31),
                      2 ** 31 - 1),
        max_attempts=_int(value.get("max_attempts", default("schedules.<name>.max_attempts")),
                          f"{where}.max_attempts", 1),
        timeout=timeout, tenant=tenant, catch_up=policy)
    try:
        from ..queue.store.rows import new_row

        new_row(config.new_job(), 0.0)  # the arguments must be JSON, as an enqueue wants them
    except FlexiqdError as exc:
        raise _fail(f"{where}.args" if "payload" in str(exc) else where, str(exc)) from None
    return config
