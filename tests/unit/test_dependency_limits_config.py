"""``dependencies.<name>.limit`` in the daemon's config, and how it reaches a worker and a task."""

from __future__ import annotations

import pytest

from flexiqd.config.load import parse_config
from flexiqd.worker.settings_reader import worker_setup
from flexiqd.errors import ConfigError, TaskError
from flexiqd.queue import Queue
from flexiqd.queue.limits import DependencyLimit

FILE = """\
dependencies:
  partner_api:
    capacity: 30
    limit: {concurrency: 20, rate: 50}
  sms:
    capacity: 10
    limit: {rate: 2.5, burst: 5}
  db:
    capacity: 40
pools:
  default:
    app: shop.tasks:queue
"""


def test_limits_are_read_per_dependency_and_the_ones_without_are_left_out():
    config = parse_config(FILE)
    assert config.dependency_limits == {
        "partner_api": DependencyLimit("partner_api", concurrency=20, rate=50.0),
        "sms": DependencyLimit("sms", rate=2.5, burst=5)}
    assert set(config.dependencies) == {"partner_api", "sms", "db"}  # the policy's view is unchanged


@pytest.mark.parametrize("limit, where", [
    ("{concurrency: 0}", "dependencies.partner_api.limit.concurrency: must be a whole number of at least 1"),
    ("{rate: 0}", "dependencies.partner_api.limit.rate: must be a number of starts per second above 0"),
    ("{rate: 5, burst: -1}", "dependencies.partner_api.limit.burst: must be a whole number of at least 1"),
    ("{burst: 3}", "dependencies.partner_api.limit.burst: needs limit.rate"),
    ("{concurrency: 2, rates: 3}", "dependencies.partner_api.limit.rates: unknown key"),
    ("20", "dependencies.partner_api.limit: must be a mapping"),
    ("{}", "dependencies.partner_api.limit: must set concurrency, rate or both"),
])
def test_a_bad_limit_is_named_by_its_key(limit, where):
    text = FILE.replace("limit: {concurrency: 20, rate: 50}", f"limit: {limit}")
    with pytest.raises(ConfigError) as raised:
        parse_config(text, "/etc/flexiqd/flexiqd.yaml")
    assert str(raised.value).startswith(f"/etc/flexiqd/flexiqd.yaml: {where}")


def test_a_worker_of_a_pool_gets_every_limit_of_the_config(tmp_path):
    path = tmp_path / "flexiqd.yaml"
    path.write_text(FILE)
    setup = worker_setup(app=None, url=None, instance="default-1", config=str(path), overrides={})
    assert set(setup.config.dependency_limits) == {"partner_api", "sms"}
    alone = worker_setup(app="shop.tasks:queue", url=None, instance=None, config=None, overrides={})
    assert alone.config.dependency_limits == {}


def test_a_worker_by_hand_with_a_config_file_gets_its_limits(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEXIQD_CONFIG", raising=False)
    path = tmp_path / "flexiqd.yaml"
    path.write_text(FILE)
    by_hand = worker_setup(app="shop.tasks:queue", url=None, instance=None, config=str(path), overrides={})
    assert set(by_hand.config.dependency_limits) == {"partner_api", "sms"}
    assert by_hand.limits_path == str(path) and by_hand.config_path is None  # no pool's drain budget
    monkeypatch.setenv("FLEXIQD_CONFIG", str(path))
    from_env = worker_setup(app="shop.tasks:queue", url=None, instance=None, config=None, overrides={})
    assert set(from_env.config.dependency_limits) == {"partner_api", "sms"}


def test_a_task_declares_the_dependencies_it_uses():
    queue = Queue("sqlite:////nonexistent/never-opened.db")

    @queue.task("sync", uses=["partner_api", "db", "partner_api"])
    def sync(order_id):
        return order_id

    @queue.task("ping", uses="sms")
    def ping():
        return None

    assert sync.options.uses == ("partner_api", "db")
    assert ping.options.uses == ("sms",)
    assert sync.new_job((1,)).task == "sync"  # uses is the task's, not a job option
    with pytest.raises(TaskError, match="uses= must be dependency names"):
        queue.task("bad", uses=["", "db"])


def test_a_running_worker_reads_the_limits_again_when_the_file_changes(tmp_path):
    import os

    from flexiqd.worker.settings_reader import LimitsReader

    path = tmp_path / "flexiqd.yaml"
    path.write_text(FILE)
    setup = worker_setup(app=None, url=None, instance="default-1", config=str(path),
                         overrides={"drain_timeout": 5.0})  # a fixed budget: the limits still follow
    reader = LimitsReader(setup)
    assert reader()["partner_api"].concurrency == 20

    def rewrite(text, tick):
        path.write_text(text)
        os.utime(path, ns=(tick * 10**9, tick * 10**9))  # a new mtime, however fast the rewrite

    rewrite(FILE.replace("concurrency: 20", "concurrency: 5"), 1)
    assert reader()["partner_api"].concurrency == 5
    rewrite("dependencies: [broken\n", 2)
    assert reader()["partner_api"].concurrency == 5  # a bad edit lifts no limit
    rewrite(FILE.replace("    limit: {concurrency: 20, rate: 50}\n", ""), 3)
    assert set(reader()) == {"sms"}
