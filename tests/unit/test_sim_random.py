"""Workloads drawn at random (``sim.families``) and ``bench policies --random``."""

from __future__ import annotations

import json

import pytest

from flexiqd.cli.bench import main
from flexiqd.sim.families import FAMILIES, draw, sample
from flexiqd.sim.trace import realise


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_draws_a_valid_workload_the_same_way_twice(family):
    first, again = draw(family, 7), draw(family, 7)
    assert first == again
    assert first.name == f"{family}-7"
    workload = realise(first)
    assert len(workload) > 0
    assert first.workers.min <= first.workers.initial <= first.workers.max
    assert draw(family, 8) != first


def test_a_sample_takes_the_families_in_turn_and_is_fixed_by_its_seed():
    drawn = sample(len(FAMILIES) + 1, seed=3)
    assert [t.name.rsplit("-", 1)[0] for t in drawn] == list(FAMILIES) + [next(iter(FAMILIES))]
    assert sample(4, seed=3) == drawn[:4]
    assert sample(4, seed=4) != drawn[:4]
    assert {t.name.rsplit("-", 1)[0] for t in sample(3, 1, ("quota",))} == {"quota"}


def test_random_json_counts_every_policy_on_every_workload(capsys):
    argv = ["policies", "--random", "2", "--seed", "1", "--family", "two_class", "--jobs", "1", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["workloads"] == 2 and report["families"] == ["two_class"]
    names = [p["policy"] for p in report["policies"]]
    assert names == ["fixed-peak", "hpa-cpu", "keda-depth", "flexiq", "flexiqd"]
    for policy in report["policies"]:
        assert set(policy["met"]) == {"age", "dependency", "cost", "killed", "completion", "requests"}
        assert 0 <= policy["whole_goal"] <= 2
    assert [case["trace"].startswith("two_class-") for case in report["flexiqd"]] == [True, True]
    per_family = report["per_family"]["two_class"]
    assert per_family["workloads"] == 2
    assert per_family["whole_goal"]["flexiqd"] == sum(case["goal"]["met"] for case in report["flexiqd"])


def test_random_table_names_the_goal_and_the_worst_cases(capsys):
    assert main(["policies", "--random", "1", "--family", "two_class", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("== 1 workloads drawn at random (seed 0; families: two_class) ==")
    assert "whole goal" in out and "flexiqd's worst cases:" in out


@pytest.mark.parametrize("argv, message", [
    (["policies", "--random", "0"], "--random: must be at least 1, got 0"),
    (["policies", "--random", "x"], "--random: must be a whole number, got 'x'"),
    (["policies", "--random", "2", "--family", "lunar"], "--family: invalid choice: 'lunar'"),
    (["policies", "--random", "2", "--trace", "t.json"], "--random and --trace do not go together"),
])
def test_bad_random_arguments_give_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
