"""``bench policies``: tables, JSON, plots, and one-line errors with exit code 2."""

from __future__ import annotations

import json

import pytest

from flexiqd.cli.bench import main

from test_sim_support import small_data, write_trace


@pytest.fixture
def small_file(tmp_path):
    return write_trace(tmp_path, small_data(duration=150))


def test_json_has_every_policy_cost_ratios_and_the_goal(small_file, capsys):
    assert main(["policies", "--trace", str(small_file), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (trace,) = report["traces"]
    assert trace["trace"] == "small" and trace["seed"] == 11
    policies = [result["policy"] for result in trace["results"]]
    assert policies == ["fixed-peak", "hpa-cpu", "keda-depth", "flexiq", "flexiqd", "oracle"]
    oracle = trace["results"][-1]
    assert oracle["cost_ratio"] == 1.0
    assert set(trace["goal"]) == {"met", "age", "dependency", "cost", "killed", "completion", "requests"}


def test_a_probe_adds_a_row_of_flexiqd_heeding_the_request_paths_latency(small_file, capsys):
    assert main(["policies", "--trace", str(small_file), "--json", "--probe", "3"]) == 0
    (trace,) = json.loads(capsys.readouterr().out)["traces"]
    assert [result["policy"] for result in trace["results"]][-2:] == ["flexiqd-probe3", "oracle"]


def test_the_table_names_each_trace_and_policy(small_file, capsys):
    assert main(["policies", "--trace", str(small_file)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("== small: age target 30s, seed 11, 150s simulated ==")
    assert "x oracle" in out and "flexiqd" in out and "goal:" in out


def test_plots_one_png_per_trace(small_file, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert main(["policies", "--trace", str(small_file), "--plots", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "small.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["policies", "--trace", "/nonexistent/trace.json"], "cannot read"),
        (["policies", "--colour"], "unrecognized arguments: --colour"),
        (["compare"], "invalid choice: 'compare'"),
        (["policies", "--probe", "1"], "argument --probe: must be a number above 1, got 1"),
        ([], "the following arguments are required"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("flexiq bench: error: ")
    assert message in err


def test_a_bad_trace_file_gives_one_line_and_exit_2(tmp_path, capsys):
    broken = tmp_path / "broken.json"
    broken.write_text('{"name": "x",')
    assert main(["policies", "--trace", str(broken)]) == 2
    invalid = write_trace(tmp_path, small_data(duration=-1), "invalid.json")
    assert main(["policies", "--trace", str(invalid)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("flexiq bench: error: broken.json: not valid JSON")
    assert lines[1] == "flexiq bench: error: invalid.json: duration: must be a number > 0, got -1"
    assert len(lines) == 2


def test_a_busy_worker_killed_fails_the_goal(small_file):
    from dataclasses import replace

    from flexiqd.sim.bench import bench_trace
    from flexiqd.sim.report import TraceReport, check_goal
    from flexiqd.sim.trace import load_trace

    report = bench_trace(load_trace(small_file))
    killed = TraceReport(trace=report.trace, results=tuple(
        replace(result, killed=1) if result.policy == "flexiqd" else result for result in report.results))
    goal = check_goal(killed)
    assert not goal.killed and not goal.met and "busy workers killed" in goal.shortfalls()
    assert check_goal(report).killed == (report.result("flexiqd").killed == 0)


def test_time_over_a_declared_capacity_is_judged_against_the_oracles(small_file):
    # A pool whose fewest workers' jobs already exceed the capacity: nobody can stay under it.
    from dataclasses import replace

    from flexiqd.sim.bench import bench_trace
    from flexiqd.sim.report import TraceReport, check_goal
    from flexiqd.sim.trace import load_trace

    report = bench_trace(load_trace(small_file))

    def over(flexiqd: float, oracle: float) -> TraceReport:
        seconds = {"flexiqd": flexiqd, "oracle": oracle}
        return TraceReport(trace=report.trace, results=tuple(
            replace(r, over_capacity_seconds=seconds.get(r.policy, r.over_capacity_seconds)) for r in report.results))

    assert report.trace.dependency.declared
    assert not check_goal(over(3.0, 0.0)).dependency
    assert check_goal(over(100.0, 100.0)).dependency
    assert not check_goal(over(101.0, 100.0)).dependency
