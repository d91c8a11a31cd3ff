"""Two machines, one PostgreSQL, one schedule firing every second: each machine's flexiqd
(a systemd sandbox of its own) fires every slot, and either daemon is SIGKILLed at random
moments and restarted by its systemd.  Every slot's job is in the store exactly once.

Jobs are counted in the store by their slot (the job's key names it), not read from the
ledger that decides them.
"""

from __future__ import annotations

import collections
import math
import random
import signal
import time
from datetime import datetime, timezone

import pytest

from flexiqd.config.model import slot_key

from .flexiqd_install import DAEMON, REPO
from .test_fleet_hosts_systemd import machines, start_flexiqd

KILLS = 8

CONFIG = """
store: '{url}'
tick: 1s
heartbeat: 2s
pools:
  default:
    app: fleet_app:queue
    concurrency: 2
    min_workers: 1
    max_workers: 2
    environment:
      PYTHONPATH: {apps}
      FLEXIQ_TEST_MARKS: {marks}
schedules:
  tick: {{task: work, args: [0], cron: "* * * * * *"}}
"""


@pytest.fixture
def two_machines():
    yield from machines(2)


def jobs_per_slot(queue) -> collections.Counter:
    return collections.Counter(job.idempotency_key for job in queue.backend.list_jobs(state=None, limit=1_000_000)
                               if job.idempotency_key and job.idempotency_key.startswith("schedule:tick:"))


def slot_of(key: str) -> int:
    stamp = key.split(":", 2)[2]
    return int(datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp())


def test_two_machines_fire_each_slot_once_through_random_daemon_kills(two_machines):
    server, marks, sandboxes = two_machines
    server.admin("CREATE DATABASE flexiq_test")
    config = CONFIG.format(url=server.store_url(), apps=REPO / "tests" / "apps", marks=marks)
    for sbx in sandboxes:
        start_flexiqd(sbx, config, marks)
    from flexiqd import Queue

    queue = Queue(server.store_url())
    rng = random.Random()
    deadline = time.monotonic() + 60
    while len(jobs_per_slot(queue)) < 3:
        assert time.monotonic() < deadline, "no slot fired"
        time.sleep(0.2)
    killed = collections.Counter()
    deadline = time.monotonic() + 120
    while sum(killed.values()) < KILLS and time.monotonic() < deadline:
        # A moment of the test's choosing, inside a second or across one, on either machine
        # (one still starting after the last kill is left to start).
        time.sleep(rng.uniform(0.0, 2.5))
        victim = rng.randrange(len(sandboxes))
        sbx = sandboxes[victim]
        if sbx.unit_property(DAEMON, "MainPID") not in ("", "0"):
            sbx.run(["systemctl", "kill", "--kill-who=main", f"--signal={signal.SIGKILL.value}", DAEMON])
            killed[victim] += 1
    assert sum(killed.values()) == KILLS
    for sbx in sandboxes:
        sbx.wait_for(lambda sbx=sbx: sbx.unit_property(DAEMON, "ActiveState") == "active"
                     and sbx.unit_property(DAEMON, "MainPID") not in ("", "0"), 60,
                     what="systemd to restart the killed flexiqd")
    end = math.ceil(time.time()) + 2
    deadline = time.monotonic() + 60
    while slot_key("tick", end) not in jobs_per_slot(queue):
        assert time.monotonic() < deadline, "the slot after the kills never fired"
        time.sleep(0.2)
    for sbx in sandboxes:
        sbx.run(f"systemctl stop {DAEMON} 'flexiq-worker@*'; true", timeout=120)
    counts = jobs_per_slot(queue)
    queue.close()
    first = min(map(slot_of, counts))
    expected = {slot_key("tick", t) for t in range(first, end + 1)}
    twice = {key: n for key, n in counts.items() if n > 1}
    missing = expected - set(counts)
    print(f"\n{sum(killed.values())} SIGKILLs ({dict(killed)}) over {len(expected)} slots on two machines: "
          f"{sum(counts[k] for k in expected)} jobs, {len(twice)} slots twice, {len(missing)} missing")
    assert not twice, twice
    assert not missing, sorted(missing)
