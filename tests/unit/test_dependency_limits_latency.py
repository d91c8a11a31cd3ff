"""``uses.<name>.max_latency``: the daemon holds a pool whose limited dependency is slow, the
latency being the p95 time jobs held it, as the store measured it.  A real SQLite store, a fake
fleet, the real controller."""

from __future__ import annotations

import pytest

from flexiqd.queue.limits import DependencyLimit
from flexiqd.queue.types import ClaimRequest, NewJob, Outcome

from test_controller import make

CONFIG = """\
dependencies:
  partner_api:
    capacity: 100
    limit: {concurrency: 50}
pools:
  default:
    max_workers: 8
    concurrency: 2
    uses:
      partner_api: {per_worker: 2, max_latency: 2s}
"""


def _held(backend, now, seconds):
    """Five jobs that each held partner_api for ``seconds``, ending just now."""
    limit = DependencyLimit("partner_api", concurrency=50)
    backend.enqueue([NewJob(task="t") for _ in range(5)], now=now - seconds - 1)
    jobs = backend.claim(ClaimRequest("w", ("default",), 5), now=now - seconds)
    for job in jobs:
        assert backend.admit("w", job.id, [limit], now=now - seconds) is None
    backend.settle("w", [Outcome.ack(job.id) for job in jobs], now=now - 1)


@pytest.mark.parametrize("hold, capped", [(5.0, True), (0.5, False)])
def test_a_dependency_held_longer_than_max_latency_holds_the_pool(backend, hold, capped):
    controller, fleet, clock = make(backend, CONFIG)
    fleet.add("default", 1, started_at=clock.now - 100)
    _held(backend, clock.now, hold + 1)  # a hold from admission to settle: hold + 1 s
    backend.enqueue([NewJob(task="t")] * 200, now=clock.now - 60)  # a backlog a minute old
    decision = controller.tick()["default"]
    if capped:
        assert (decision.desired, decision.reason) == (1, "CappedByLatency")
    else:
        assert decision.desired > 1


def test_max_latency_on_a_dependency_without_a_limit_is_refused():
    from flexiqd.config.load import parse_config
    from flexiqd.errors import ConfigError

    text = CONFIG.replace("    limit: {concurrency: 50}\n", "")
    with pytest.raises(ConfigError, match="pools.default.uses.partner_api.max_latency: needs "
                                          "dependencies.partner_api.limit"):
        parse_config(text, "flexiqd.yaml")
