"""Every cap name the policy can bind a pool with is listed where a user reads it.

The names reach users as the ``cap`` label of ``flexiqd_pool_binding_cap_workers``, the
journal's ``CAP`` field, the D-Bus status document's ``binding_cap`` and the metric's HELP
text.  The caps are made here from every input that yields one (``collect_caps`` and the
fleet's grants of global caps, through ``decide_fleet``), and each name, with what follows
its kind written ``<name>``, must be in every list; a kind the lists name must exist.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from flexiqd.http.metrics import render
from flexiqd.policy import DependencyUse, PoolInput, PoolPolicy, decide_fleet
from flexiqd.policy.caps import CAP_REASONS, collect_caps
from flexiqd.policy.evidence import evidence_caps
from flexiqd.policy.sharing import DependencyCap
from flexiqd.policy.types import DependencyObservation, EvidenceTrack

from test_http_metrics import snapshot
from test_policy_support import observe
from test_stopping_workers import flooded, policy

REPO = pathlib.Path(__file__).resolve().parents[2]


def _documented_lists() -> dict[str, str]:
    """Where each list of cap names is, and its text."""
    def row(page: str, starts: str) -> str:
        lines = [line for line in (REPO / page).read_text(encoding="utf-8").splitlines() if line.startswith(starts)]
        assert len(lines) == 1, f"{page}: no single row starting {starts!r}"
        return lines[0]

    return {
        "docs/metrics.md": row("docs/metrics.md", "| `flexiqd_pool_binding_cap_workers`"),
        "docs/journal.md": row("docs/journal.md", "| Another cap (or none)"),
        "docs/dbus-api.md": row("docs/dbus-api.md", "| `binding_cap`"),
        "the metric's HELP": _help_text(),
    }


def _help_text() -> str:
    text = render(snapshot()).decode()
    return next(line for line in text.splitlines() if line.startswith("# HELP flexiqd_pool_binding_cap_workers"))


def produced_cap_names() -> set[str]:
    """Every cap name the policy makes when every kind of cap applies."""
    use = DependencyUse(dependency="api", per_worker=1, max_latency=0.2)
    slow = observe(4, dependencies=(DependencyObservation(name="api", latency=0.9),))
    share = DependencyCap(pool="p", workers=3, dependency="api", per_dependency=(("api", 3),),
                          stopping=(("stopping", 5), ("stopping:api", 5)))
    # Direct evidence holding the pool: a dependency's probe and the workers' pressure.
    held = evidence_caps((EvidenceTrack(source="probe:api", held_at=3), EvidenceTrack(source="pressure:cpu", held_at=2)))
    caps = collect_caps(slow, PoolPolicy(max_workers=10, dependencies=(use,)), 6, share, (("api", 2),), held)
    names = {cap.cap for cap in caps}
    # A global max_workers is granted by the fleet, as a dependency of its own.
    granted = PoolInput(observation=flooded("p", 3, 2), policy=policy(10), fleet_grants={"max_workers:p": 6},
                        stopping=2)
    names.add(decide_fleet([granted], [], 100.0)["p"].binding_cap.cap)
    granted = PoolInput(observation=flooded("p", 3), policy=policy(10), fleet_grants={"max_workers:p": 4})
    names.add(decide_fleet([granted], [], 100.0)["p"].binding_cap.cap)
    return names


def documented_form(name: str) -> str:
    """``dependency:api`` -> ``dependency:<name>``; a global max_workers' name is a ``<name>`` too;
    ``pressure:cpu`` -> ``pressure:<resource>``."""
    kind, _, rest = name.partition(":")
    if not rest:
        return kind
    return f"{kind}:<resource>" if kind == "pressure" else f"{kind}:<name>"


def test_the_policy_makes_every_kind_of_cap_here():
    kinds = {name.partition(":")[0] for name in produced_cap_names()}
    assert kinds == set(CAP_REASONS), "a kind of cap this test does not make: add it to produced_cap_names"


@pytest.mark.parametrize("where", sorted(_documented_lists()))
def test_every_list_names_every_cap(where):
    text = _documented_lists()[where]
    forms = {documented_form(name) for name in produced_cap_names()}
    missing = sorted(form for form in forms if not re.search(rf"(?<![\w:<]){re.escape(form)}(?![\w:<])", text))
    assert not missing, f"{where} does not list {missing}"


@pytest.mark.parametrize("where", sorted(_documented_lists()))
def test_no_list_names_a_cap_that_does_not_exist(where):
    text = _documented_lists()[where]
    named = set(re.findall(r"\b([a-z]+):<name>", text))
    assert named <= set(CAP_REASONS), f"{where} names caps the policy never makes: {sorted(named - set(CAP_REASONS))}"
