"""``flexiq dependencies`` and ``flexiq stats`` show a limited dependency's use and its waiting jobs."""

from __future__ import annotations

import json
import time

from flexiqd.cli.flexiq import main
from flexiqd.queue import ClaimRequest, NewJob, Outcome, open_backend
from flexiqd.queue.limits import DependencyLimit


def _store_with_a_full_dependency(tmp_path):
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    config = tmp_path / "flexiqd.yaml"
    config.write_text(f"store: {url}\ndependencies:\n  partner_api:\n    capacity: 30\n"
                      f"    limit: {{concurrency: 2, rate: 50}}\n  db:\n    capacity: 5\n")
    backend = open_backend(url)
    now = time.time()
    backend.enqueue([NewJob(task="t") for _ in range(3)], now=now)
    jobs = backend.claim(ClaimRequest("w1", ("default",), 3), now=now)
    limit = DependencyLimit("partner_api", concurrency=2, rate=50.0)
    refusals = [backend.admit("w1", job.id, [limit], now=now) for job in jobs]
    backend.settle("w1", [Outcome.defer(job.id, r) for job, r in zip(jobs, refusals) if r], now=now)
    backend.close()
    return url, str(config)


def test_dependencies_shows_use_against_the_limit(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FLEXIQ_URL", raising=False)
    _, config = _store_with_a_full_dependency(tmp_path)
    assert main(["dependencies", "--config", config]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["DEPENDENCY", "IN", "USE"]
    assert lines[1].split()[:6] == ["partner_api", "2/2", "50/s", "burst", "50", "1"]
    assert len(lines) == 2  # db has no limit: not listed

    assert main(["dependencies", "--config", config, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["partner_api"]["limit"] == {"concurrency": 2, "rate": 50.0, "burst": 50}
    assert (shown["partner_api"]["in_use"], shown["partner_api"]["waiting"]) == (2, 1)


def test_stats_shows_the_jobs_waiting_for_a_dependency(tmp_path, capsys):
    url, _ = _store_with_a_full_dependency(tmp_path)
    assert main(["--url", url, "stats"]) == 0
    header, row = capsys.readouterr().out.splitlines()[:2]
    columns = dict(zip(header.split(), row.split()))
    assert (columns["RUNNABLE"], columns["WAITING"], columns["RUNNING"]) == ("0", "1", "2")
    assert main(["--url", url, "stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["default"]["waiting_for_dependency"] == 1


def test_dependencies_names_a_bad_limit_in_one_line(tmp_path, capsys):
    config = tmp_path / "flexiqd.yaml"
    config.write_text("dependencies:\n  api:\n    capacity: 3\n    limit: {concurrency: 0}\n")
    assert main(["dependencies", "--config", str(config)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"flexiq: {config}: dependencies.api.limit.concurrency: must be a whole number "
                   f"of at least 1, got 0")
