"""A pool's scaling policy: targets, smoothing behaviour, knee discovery, dependencies.

Every class validates itself when built and raises ``PolicyConfigError`` naming
the option (``targets.utilisation: must be in (0, 1], got 1.5``), so a bad
config is refused whole before the first decision.  ``pool_policy_from_mapping``
builds one from a parsed YAML/JSON mapping and names unknown keys the same way.
The defaults are the config file's, read from ``flexiqd.settings_schema`` (data only).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..settings_schema import default
from .errors import PolicyConfigError
from .validation import require_bool, require_int, require_number


@dataclass(frozen=True, kw_only=True)
class Targets:
    """What the pool aims for; each target feeds one signal.

    ``age``: seconds the oldest runnable job may wait (the user-facing goal).
    ``drain_time``: seconds the runnable backlog should take to drain; None
    means the age target.  ``depth_per_worker``: runnable jobs per worker
    (KEDA-style); None turns that signal off, since depth alone ignores how long
    jobs take.  ``utilisation``: busy slots / slots.  ``cpu``: mean CPU of the
    active workers, used only for ``cpu_bound`` pools.  ``lead_time``: how long
    a newly requested worker takes to claim its first job (unit start plus a
    tick); the age signal acts that much before a job would reach ``age``.
    None (the default) follows the other figures: the start cost (measured, or
    ``behavior.start_cost``) plus one tick, never more than half the age
    target (``economics.lead_time``), so ``targets: {age: 5s}`` alone works.
    """

    age: float = default("pools.<pool>.targets.age")
    drain_time: float | None = default("pools.<pool>.targets.drain_time")
    depth_per_worker: float | None = default("pools.<pool>.targets.depth_per_worker")
    utilisation: float = default("pools.<pool>.targets.utilisation")
    cpu: float = default("pools.<pool>.targets.cpu")
    lead_time: float | None = default("pools.<pool>.targets.lead_time")

    def __post_init__(self) -> None:
        require_number("targets.age", self.age, low=0, low_open=True)
        if self.drain_time is not None:
            require_number("targets.drain_time", self.drain_time, low=0, low_open=True)
        if self.depth_per_worker is not None:
            require_number("targets.depth_per_worker", self.depth_per_worker, low=0, low_open=True)
        require_number("targets.utilisation", self.utilisation, low=0, high=1, low_open=True)
        require_number("targets.cpu", self.cpu, low=0, high=1, low_open=True)
        if self.lead_time is None:
            return
        require_number("targets.lead_time", self.lead_time, low=0)
        if self.lead_time >= self.age:
            raise PolicyConfigError(
                "targets.lead_time", f"must be below targets.age ({self.age}), got {self.lead_time}"
            )

    @property
    def effective_drain_time(self) -> float:
        return self.age if self.drain_time is None else self.drain_time


@dataclass(frozen=True, kw_only=True)
class RateLimit:
    """At most ``workers`` or ``percent`` % change per ``period`` seconds, whichever is larger.

    Like the HPA's behaviour policies with ``selectPolicy: Max``.
    """

    workers: int
    percent: float
    period: float

    def validate(self, prefix: str) -> None:
        require_int(f"{prefix}.workers", self.workers, minimum=0)
        require_number(f"{prefix}.percent", self.percent, low=0)
        require_number(f"{prefix}.period", self.period, low=0, low_open=True)
        if self.workers == 0 and self.percent == 0:
            raise PolicyConfigError(prefix, "allows no change at all (workers and percent are both 0)")


# Both the HPA's defaults.  Up: +100% or +4 pods per 15 s.  Down: -100% per
# 15 s, i.e. the down window alone decides how far the pool falls.  A slower
# fall (it was -50% or -1 per minute) stretches one scale-down into steps over
# minutes, and the last step lands close enough to the next burst for the pool
# to reverse within two minutes; a failed metrics read holds the pool anyway.
DEFAULT_UP_LIMIT = RateLimit(**default("pools.<pool>.behavior.up_limit"))
DEFAULT_DOWN_LIMIT = RateLimit(**default("pools.<pool>.behavior.down_limit"))


@dataclass(frozen=True, kw_only=True)
class Behavior:
    """How fast the worker count may follow the signals (the HPA's ``behavior``).

    Windows: a scale-up happens only when every recommendation of the last
    ``up_window`` seconds wants it; a scale-down only to the highest
    recommendation of the last ``down_window`` seconds.  ``tolerance``: no
    change while ``|recommended / current - 1| <= tolerance`` (unless the
    pool is overloaded).  Rate limits: None means unlimited; the up limit
    applies to the signals that can be noise (utilisation, CPU, saturation),
    never to a backlog's age or drain, which start what they need at once.

    ``down_window`` None (the default): an idle worker is held only while
    holding it is cheaper than starting one again later -- for the break-even
    time of the start cost (rent or buy, ``economics.break_even_hold``).  A
    number is an operator's override: the HPA's fixed window of that many
    seconds.  ``start_cost``: seconds a start costs while none is measured yet
    (``Observation.start_cost`` takes precedence).
    """

    up_window: float = default("pools.<pool>.behavior.up_window")
    down_window: float | None = default("pools.<pool>.behavior.down_window")
    tolerance: float = default("pools.<pool>.behavior.tolerance")
    up_limit: RateLimit | None = DEFAULT_UP_LIMIT
    down_limit: RateLimit | None = DEFAULT_DOWN_LIMIT
    start_cost: float = default("pools.<pool>.behavior.start_cost")

    def __post_init__(self) -> None:
        require_number("behavior.up_window", self.up_window, low=0)
        if self.down_window is not None:
            require_number("behavior.down_window", self.down_window, low=0)
        require_number("behavior.start_cost", self.start_cost, low=0)
        require_number("behavior.tolerance", self.tolerance, low=0, high=1, high_open=True)
        for name in ("up_limit", "down_limit"):
            limit = getattr(self, name)
            if limit is not None:
                if not isinstance(limit, RateLimit):
                    raise PolicyConfigError(f"behavior.{name}", f"must be a RateLimit or None, got {limit!r}")
                limit.validate(f"behavior.{name}")


@dataclass(frozen=True, kw_only=True)
class KneeConfig:
    """Ceiling discovery: stop adding workers that no longer add throughput (see ``knee``).

    While jobs wait, the pool grows in steps judged on the completions the
    store counts; a step whose workers add less than half their share holds
    the pool at the count of the best throughput measured, then a worker
    fewer at a time while the fewer complete as much (half as many where no smaller
    count was measured); a pool late at ``max_workers`` with no smaller count is compared
    with half its workers.  Counts that
    differ by less than ``min_throughput_gain`` are equally good (the fewer
    workers win).  The knee is re-probed a quarter higher after
    ``reprobe_interval`` (after ``2 x settle_time``, at most the age target,
    while the oldest job is late); one that pays moves it up there when a count of
    more workers within ``settle_time`` showed the ceiling over it, else forgets it.
    It is forgotten after ``sample_max_age`` without a sample.
    ``max_duration_rise`` is not used: durations stretch at a ceiling, so a
    rise of durations alone decides nothing.
    """

    enabled: bool = default("pools.<pool>.knee.enabled")
    min_throughput_gain: float = default("pools.<pool>.knee.min_throughput_gain")
    max_duration_rise: float = default("pools.<pool>.knee.max_duration_rise")
    settle_time: float = default("pools.<pool>.knee.settle_time")
    reprobe_interval: float = default("pools.<pool>.knee.reprobe_interval")
    sample_max_age: float = default("pools.<pool>.knee.sample_max_age")

    def __post_init__(self) -> None:
        require_bool("knee.enabled", self.enabled)
        require_number("knee.min_throughput_gain", self.min_throughput_gain, low=0)
        require_number("knee.max_duration_rise", self.max_duration_rise, low=0)
        require_number("knee.settle_time", self.settle_time, low=0)
        require_number("knee.reprobe_interval", self.reprobe_interval, low=0, low_open=True)
        require_number("knee.sample_max_age", self.sample_max_age, low=0, low_open=True)


@dataclass(frozen=True, kw_only=True)
class DependencyUse:
    """How much of a shared dependency one worker of this pool uses.

    ``per_worker`` is in the dependency's own unit (connections, requests/s).
    ``weight`` is the pool's share when pools compete for the dependency.
    ``max_latency``: when the observed latency of the dependency exceeds it,
    the pool does not grow (None: no such limit).
    """

    dependency: str
    per_worker: float
    weight: float = default("pools.<pool>.uses.<name>.weight")
    max_latency: float | None = default("pools.<pool>.uses.<name>.max_latency")

    def validate(self, prefix: str) -> None:
        if not isinstance(self.dependency, str) or not self.dependency:
            raise PolicyConfigError(f"{prefix}.dependency", f"must be a non-empty name, got {self.dependency!r}")
        require_number(f"{prefix}.per_worker", self.per_worker, low=0, low_open=True)
        require_number(f"{prefix}.weight", self.weight, low=0, low_open=True)
        if self.max_latency is not None:
            require_number(f"{prefix}.max_latency", self.max_latency, low=0, low_open=True)


@dataclass(frozen=True, kw_only=True)
class Dependency:
    """A shared dependency: ``capacity`` units, ``reserved`` of them kept for other users.

    The reserve is what the request path (or anything outside the pools)
    needs; pools share ``capacity - reserved``.  ``start_burst``: at most this
    many workers of the dependency's users start at once (they all connect
    as they start); more are started as the first ones come up.
    """

    name: str
    capacity: float
    reserved: float = default("dependencies.<name>.reserved")
    start_burst: int = default("dependencies.<name>.start_burst")

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise PolicyConfigError("dependency.name", f"must be a non-empty name, got {self.name!r}")
        require_number(f"dependencies.{self.name}.capacity", self.capacity, low=0, low_open=True)
        require_number(f"dependencies.{self.name}.reserved", self.reserved, low=0)
        require_int(f"dependencies.{self.name}.start_burst", self.start_burst, minimum=1)
        if self.reserved >= self.capacity:
            raise PolicyConfigError(
                f"dependencies.{self.name}.reserved",
                f"must be below the capacity ({self.capacity}), got {self.reserved}",
            )

    @property
    def available(self) -> float:
        return self.capacity - self.reserved


@dataclass(frozen=True, kw_only=True)
class EvidenceRule:
    """Direct evidence the pool heeds (see ``evidence``): ``source`` ``probe:<dependency>`` with
    ``threshold`` the factor over the probe's baseline, or ``pressure:<resource>`` (cpu, io,
    memory) with ``threshold`` the share of time stalled (percent) that holds the pool."""

    source: str
    threshold: float

    def validate(self, prefix: str) -> None:
        kind, _, name = self.source.partition(":")
        if kind not in ("probe", "pressure") or not name:
            raise PolicyConfigError(f"{prefix}.source", f"must be probe:<dependency> or pressure:<resource>, "
                                                        f"got {self.source!r}")
        if kind == "pressure":
            if name not in ("cpu", "io", "memory"):
                raise PolicyConfigError(f"{prefix}.source", f"a pressure is of cpu, io or memory, got {name!r}")
            require_number(f"{prefix}.threshold", self.threshold, low=0, high=100, low_open=True)
        else:
            require_number(f"{prefix}.threshold", self.threshold, low=1, low_open=True)


@dataclass(frozen=True, kw_only=True)
class PoolPolicy:
    """Everything that decides one pool's worker count; the defaults are flexiqd's.

    ``min_workers``/``max_workers`` bound the result.  Unless
    ``scale_to_zero`` is set, at least one worker always runs (an idle pool
    answers its first job without a cold start).  ``cpu_bound`` enables the
    CPU signal.
    """

    min_workers: int = default("pools.<pool>.min_workers")
    max_workers: int = default("pools.<pool>.max_workers")
    scale_to_zero: bool = default("pools.<pool>.scale_to_zero")
    cpu_bound: bool = default("pools.<pool>.cpu_bound")
    targets: Targets = field(default_factory=Targets)
    behavior: Behavior = field(default_factory=Behavior)
    knee: KneeConfig = field(default_factory=KneeConfig)
    dependencies: tuple[DependencyUse, ...] = ()
    evidence: tuple[EvidenceRule, ...] = ()

    def __post_init__(self) -> None:
        require_int("min_workers", self.min_workers, minimum=0)
        require_int("max_workers", self.max_workers, minimum=1)
        if self.max_workers < self.min_workers:
            raise PolicyConfigError(
                "max_workers", f"must be >= min_workers ({self.min_workers}), got {self.max_workers}"
            )
        require_bool("scale_to_zero", self.scale_to_zero)
        require_bool("cpu_bound", self.cpu_bound)
        for name, kind in (("targets", Targets), ("behavior", Behavior), ("knee", KneeConfig)):
            if not isinstance(getattr(self, name), kind):
                raise PolicyConfigError(name, f"must be a {kind.__name__}, got {getattr(self, name)!r}")
        if not isinstance(self.dependencies, tuple):
            raise PolicyConfigError("dependencies", "must be a tuple of DependencyUse")
        seen: set[str] = set()
        for index, use in enumerate(self.dependencies):
            if not isinstance(use, DependencyUse):
                raise PolicyConfigError(f"dependencies[{index}]", f"must be a DependencyUse, got {use!r}")
            use.validate(f"dependencies[{index}]")
            if use.dependency in seen:
                raise PolicyConfigError(f"dependencies[{index}].dependency", f"{use.dependency!r} is declared twice")
            seen.add(use.dependency)
        for index, rule in enumerate(self.evidence):
            if not isinstance(rule, EvidenceRule):
                raise PolicyConfigError(f"evidence[{index}]", f"must be an EvidenceRule, got {rule!r}")
            rule.validate(f"evidence[{index}]")

    @property
    def floor(self) -> int:
        """The fewest workers the pool may run when it is idle."""
        return self.min_workers if self.scale_to_zero else max(self.min_workers, 1)


def pool_policy_from_mapping(data: Mapping[str, Any]) -> PoolPolicy:
    """Build a ``PoolPolicy`` from a parsed config mapping (e.g. one pool's YAML).

    Keys mirror the dataclass fields; nested sections are mappings
    (``behavior: {down_window: 600, down_limit: {workers: 2, percent: 10, period: 60}}``,
    ``dependencies: [{dependency: db, per_worker: 4}]``).  Unknown keys and
    wrong shapes raise ``PolicyConfigError`` naming the dotted key.
    """
    sections = {
        "targets": lambda v: _build(Targets, v, "targets"),
        "behavior": _behavior_from_mapping,
        "knee": lambda v: _build(KneeConfig, v, "knee"),
        "dependencies": _dependencies_from_list,
    }
    fields = {}
    for key, value in _require_mapping(data, "policy").items():
        fields[key] = sections[key](value) if key in sections else value
    return _build(PoolPolicy, fields, "")


def _behavior_from_mapping(value: Any) -> Behavior:
    mapping = dict(_require_mapping(value, "behavior"))
    for name in ("up_limit", "down_limit"):
        if mapping.get(name) is not None:
            mapping[name] = _build(RateLimit, mapping[name], f"behavior.{name}")
    return _build(Behavior, mapping, "behavior")


def _dependencies_from_list(value: Any) -> tuple[DependencyUse, ...]:
    if not isinstance(value, (list, tuple)):
        raise PolicyConfigError("dependencies", f"must be a list, got {value!r}")
    return tuple(_build(DependencyUse, item, f"dependencies[{i}]") for i, item in enumerate(value))


def _build(kind: type, value: Any, prefix: str) -> Any:
    mapping = _require_mapping(value, prefix or "policy")
    known = {f.name for f in dataclasses.fields(kind)}
    for key in mapping:
        if key not in known:
            where = f"{prefix}.{key}" if prefix else str(key)
            raise PolicyConfigError(where, f"unknown option (known: {', '.join(sorted(known))})")
    required = [f.name for f in dataclasses.fields(kind)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    for name in required:
        if name not in mapping:
            raise PolicyConfigError(prefix or "policy", f"missing required option {name!r}")
    return kind(**mapping)


def _require_mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise PolicyConfigError(where, f"must be a mapping, got {value!r}")
    return value
