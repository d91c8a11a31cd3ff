"""The expand-then-contract rule of schema steps (flexiqd.queue.store.schema_steps), pure."""

from __future__ import annotations

import pytest

from flexiqd.daemon.hosts import runs_only_own_code
from flexiqd.queue.postgres import schema as postgres_schema
from flexiqd.queue.sqlite import schema as sqlite_schema
from flexiqd.queue.store.schema_steps import (Kind, Step, describe_schema, fresh_level, host_is_older, plan, steps_of,
                                        too_new)

STEPS = (Step(1, Kind.BREAKING, ()), Step(2, Kind.BREAKING, ("b2",)), Step(3, Kind.EXPAND, ("e3",)),
         Step(4, Kind.CONTRACT, ("c4",)), Step(5, Kind.EXPAND, ("e5",)))
NOBODY_OLDER = lambda step: False  # noqa: E731
SOMEONE_OLDER = lambda step: True  # noqa: E731


def numbers(steps) -> list[int]:
    return [step.number for step in steps]


def test_expand_steps_run_at_once_and_leave_the_level():
    work = plan(STEPS[:3], 2, frozenset({1, 2}), SOMEONE_OLDER)
    assert (numbers(work.run), work.level, work.record) == ([3], 2, True)


def test_a_contract_step_waits_while_an_older_host_lives_and_the_expand_steps_after_it_do_not():
    work = plan(STEPS, 2, frozenset({1, 2}), SOMEONE_OLDER)
    assert (numbers(work.run), numbers(work.waiting), work.level) == ([3, 5], [4], 2)
    later = plan(STEPS, 2, frozenset({1, 2, 3, 5}), NOBODY_OLDER)
    assert (numbers(later.run), later.waiting, later.level) == ([4], (), 4)


def test_the_older_hosts_are_asked_about_the_contract_step_alone():
    asked = []
    plan(STEPS, 2, frozenset({1, 2}), lambda step: asked.append(step) or False)
    assert asked == [4]


def test_a_store_up_to_date_needs_nothing_written():
    assert not plan(STEPS, 4, frozenset({1, 2, 3, 4, 5}), SOMEONE_OLDER).record


def test_a_store_from_before_the_steps_were_recorded_counts_every_step_to_its_level_and_keeps_it():
    # Its level counted the expand step 3 too, but the code that wrote it reads it exactly.
    work = plan(STEPS, 3, None, SOMEONE_OLDER)
    assert (numbers(work.run), numbers(work.earlier), work.level, work.record) == ([5], [1, 2, 3], 3, True)
    assert numbers(work.waiting) == [4]


def test_a_level_a_newer_host_raised_is_kept():
    work = plan(STEPS, 6, frozenset({1, 2, 3, 4}), SOMEONE_OLDER)
    assert (numbers(work.run), work.level) == ([5], 6)


def test_a_contract_step_this_code_does_not_know_is_too_new():
    assert too_new(STEPS, 6) and not too_new(STEPS, 5)


def test_a_fresh_store_is_at_its_last_contract_step():
    assert fresh_level(STEPS) == 4


@pytest.mark.parametrize(("report", "older"), [
    ({}, True),                                   # a host of a release that reports no schema
    ({"schema": {"postgresql": 3}}, True),
    ({"schema": {"postgresql": 4}}, False),
    ({"schema": {"sqlite": 9}}, True),            # another dialect's figure says nothing
    ({"schema": "4"}, True),
])
def test_a_host_is_older_unless_its_report_knows_the_step(report, older):
    assert host_is_older(report, 4, "postgresql") is older


def test_a_migration_without_a_kind_is_refused():
    with pytest.raises(ValueError, match=r"schema steps \[3\] declare no kind"):
        steps_of({2: ("x",), 3: ("y",)}, {1: Kind.BREAKING, 2: Kind.EXPAND})


@pytest.mark.parametrize(("module", "first_under_the_rule"), [(postgres_schema, 5), (sqlite_schema, 10)])
def test_no_step_since_the_rule_breaks_the_version_before(module, first_under_the_rule):
    """A step the previous release cannot live with is an expand step now, its contract later."""
    assert [step.number for step in module.STEPS if step.kind is Kind.BREAKING] == \
        list(range(1, first_under_the_rule))


def test_the_schema_is_described_with_the_level_older_code_reads():
    assert describe_schema(4, frozenset({1, 2, 3, 4, 5})).startswith("schema version 5 (level 4")
    assert describe_schema(4, None) == "schema version 4"
    assert describe_schema(0, None).startswith("schema not created yet")


def test_a_host_reports_its_schema_once_no_worker_predates_its_daemon():
    assert not runs_only_own_code({"pools": {}}, started=100.0)  # before the first tick
    assert runs_only_own_code({"pools": {}, "workers_since": None}, started=100.0)
    assert not runs_only_own_code({"pools": {}, "workers_since": 99.0}, started=100.0)
    assert runs_only_own_code({"pools": {}, "workers_since": 100.5}, started=100.0)
