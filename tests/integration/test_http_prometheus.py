"""The shipped alert rules and dashboard against promtool and a real scrape of the daemon."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

from .conftest import REPO, wait_for
from .test_http_daemon import Daemon

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
RULES = REPO / "docs" / "prometheus" / "flexiqd-rules.yml"
RULE_TESTS = REPO / "tests" / "promtool" / "flexiqd-rules.test.yml"
DASHBOARD = REPO / "docs" / "grafana" / "flexiqd-dashboard.json"

# Every family shows up once its pool has scaled, hit its max and finished work.
CONFIG = """
store: {store}
tick: 200ms
fleet: process
http: {{listen: "127.0.0.1:{port}", token_file: {token}}}
dependencies: {{db: {{capacity: 20, reserved: 4}}}}
pools:
  default:
    app: counting_app:queue
    concurrency: 2
    min_workers: 1
    max_workers: 2
    uses: {{db: {{per_worker: 2}}}}
    targets: {{age: 1s, lead_time: 500ms}}
"""


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="module")
def promtool():
    if not os.path.exists(PROMTOOL):
        if in_ci():
            pytest.fail("promtool is missing (apt install prometheus)")
        pytest.skip("promtool is missing (apt install prometheus)")
    return PROMTOOL


def run(*args, cwd=None):
    return subprocess.run(list(args), capture_output=True, text=True, cwd=cwd)


def test_the_rules_pass_promtool_check(promtool):
    result = run(promtool, "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 7 rules found" in result.stdout


def test_the_rules_pass_their_promtool_unit_tests(promtool):
    result = run(promtool, "test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    tested = {case["alertname"] for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              for case in test["alert_rule_test"]}
    rules = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    assert tested == rules  # every alert has a case


def dashboard_expressions():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return exprs


def names_in(expressions):
    return {name for expr in expressions for name in re.findall(r"\bflexiqd_[a-z_]+\b", expr)}


def test_the_dashboard_has_every_section_and_annotates_scale_events():
    titles = {panel["title"] for panel in json.loads(DASHBOARD.read_text())["panels"] if panel["type"] == "row"}
    assert titles == {"Queues", "Pools", "Dependencies", "Daemon"}
    assert "flexiqd_scale_events_total" in names_in(
        a["expr"] for a in json.loads(DASHBOARD.read_text())["annotations"]["list"] if "expr" in a)


def test_every_name_the_dashboard_and_rules_use_is_in_a_real_scrape(tmp_path, store, app, workers, promtool):
    daemon = Daemon(tmp_path, store, workers.marks, CONFIG)
    try:
        app.tasks["count"].map([(0.05,)] * 200)
        rules = [rule["expr"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
        wanted = names_in(dashboard_expressions()) | names_in(rules)
        seen: set[str] = set()
        last = b""

        def scrape():
            nonlocal last
            status, last = daemon.get("/metrics")
            assert status == 200
            seen.update(name.decode() for name in re.findall(rb"^(flexiqd_[a-z_]+)", last, re.MULTILINE))
            return wanted <= seen

        wait_for(scrape, 60, "every name the dashboard and the rules use", interval=0.2)
        assert {"flexiqd_pool_binding_cap_workers", "flexiqd_job_duration_seconds_bucket",
                "flexiqd_pool_start_cost_seconds", "flexiqd_dependency_use"} <= wanted
        # promtool's own lint of the exposition: names, units, counters' _total.
        lint = subprocess.run([promtool, "check", "metrics"], input=last, capture_output=True)
        assert lint.returncode == 0, (lint.stdout + lint.stderr).decode()
    finally:
        daemon.stop()
