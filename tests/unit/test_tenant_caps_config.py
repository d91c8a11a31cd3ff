"""``tenants.<name>.max_running`` in the daemon's config, and how it reaches a worker's claims."""

from __future__ import annotations

import os

import pytest

from flexiqd.config.load import parse_config
from flexiqd.worker.settings_reader import TenantCapsReader, worker_setup
from flexiqd.errors import ConfigError
from flexiqd.queue import NewJob, open_backend
from flexiqd.queue.limits import TenantCaps

FILE = """\
tenants:
  acme: {max_running: 10}
  "*": {max_running: 50}
pools:
  default:
    app: shop.tasks:queue
"""


def test_caps_are_read_per_tenant_with_the_star_for_every_other():
    caps = parse_config(FILE).tenant_caps
    assert caps == TenantCaps({"acme": 10, "*": 50})
    assert (caps.cap_of("acme"), caps.cap_of("globex"), caps.cap_of(None)) == (10, 50, None)
    assert parse_config("pools: {default: {app: 'a:b'}}").tenant_caps == TenantCaps()


def test_a_tenant_named_by_a_number_is_that_tenant():
    assert parse_config("tenants: {42: {max_running: 3}}").tenant_caps.cap_of("42") == 3


@pytest.mark.parametrize("tenants, where", [
    ("{acme: {max_running: -1}}", "tenants.acme.max_running: must be a whole number of at least 0, got -1"),
    ("{acme: {max_running: 2.5}}", "tenants.acme.max_running: must be a whole number of at least 0"),
    ("{acme: {max_running: yes}}", "tenants.acme.max_running: must be a whole number of at least 0"),
    ("{acme: {}}", "tenants.acme.max_running: is required"),
    ("{acme: {max_runing: 3}}", "tenants.acme.max_runing: unknown key (known: max_running)"),
    ("{acme: 10}", "tenants.acme: must be a mapping such as {max_running: 10}"),
    ("[acme]", "tenants: must be a mapping such as {acme: {max_running: 10}}"),
])
def test_a_bad_cap_is_named_by_its_key(tenants, where):
    with pytest.raises(ConfigError) as raised:
        parse_config(f"tenants: {tenants}\n", "/etc/flexiqd/flexiqd.yaml")
    assert str(raised.value).startswith(f"/etc/flexiqd/flexiqd.yaml: {where}")


def test_a_worker_of_a_pool_gets_the_caps_and_one_without_a_config_none(tmp_path):
    path = tmp_path / "flexiqd.yaml"
    path.write_text(FILE)
    setup = worker_setup(app=None, url=None, instance="default-1", config=str(path), overrides={})
    assert setup.config.tenant_caps == TenantCaps({"acme": 10, "*": 50})
    alone = worker_setup(app="shop.tasks:queue", url=None, instance=None, config=None, overrides={})
    assert alone.config.tenant_caps is None


def test_a_running_worker_reads_the_caps_again_when_the_file_changes(tmp_path):
    path = tmp_path / "flexiqd.yaml"
    path.write_text(FILE)
    reader = TenantCapsReader(worker_setup(app=None, url=None, instance="default-1", config=str(path),
                                           overrides={}))
    assert reader().cap_of("acme") == 10

    def rewrite(text, tick):
        path.write_text(text)
        os.utime(path, ns=(tick * 10**9, tick * 10**9))  # a new mtime, however fast the rewrite

    rewrite(FILE.replace("max_running: 10", "max_running: 4"), 1)
    assert reader().cap_of("acme") == 4
    rewrite("tenants: [broken\n", 2)
    assert reader().cap_of("acme") == 4  # a bad edit lifts no cap
    rewrite(FILE.replace("max_running: 10", "max_running: 4").replace('  "*": {max_running: 50}\n', ""), 3)
    assert (reader().cap_of("acme"), reader().cap_of("globex")) == (4, None)


def test_a_worker_claims_with_the_caps_of_its_config(tmp_path):
    from flexiqd.queue import Queue
    from flexiqd.queue.types import ClaimRequest
    from flexiqd.worker.runtime import Worker
    from flexiqd.worker.settings import WorkerConfig

    store = open_backend(f"sqlite:///{tmp_path}/queue.db?synchronous=normal")
    store.enqueue([NewJob(task="t", tenant="acme") for _ in range(5)], now=0.0)
    worker = Worker(Queue(store.url), store, WorkerConfig(concurrency=4, tenant_caps=TenantCaps({"acme": 1})),
                    clock=lambda: 1.0)
    done = worker._exchange([], ClaimRequest(worker.config.name, ("default",), 4), [])
    assert len(done.claimed) == 1
    assert store.stats("default", now=1.0).held_by_tenant_cap == 4
    store.close()
