"""Two flexiqd processes on one store fire an every-second schedule, while one or the other is
killed (SIGKILL) or restarted at random moments: every slot's job is in the store exactly once.

The jobs are counted per slot from the jobs themselves (their idempotency key names the
slot), never from the ledger.  On SQLite and on PostgreSQL.
"""

from __future__ import annotations

import collections
import math
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from flexiqd.config.model import slot_key
from flexiqd.queue import open_backend

from .conftest import APPS, REPO, wait_for

CONFIG = """
store: {store}
tick: 1s
fleet: process
pools:
  default: {{app: counting_app:queue, min_workers: 0, scale_to_zero: true, max_workers: 1}}
schedules:
  tick: {{task: tick, cron: "* * * * * *", queue: scheduled}}
"""
# Kills and restarts per store; FLEXIQD_SCHEDULE_ROUNDS=100 for a longer run by hand.
ROUNDS = int(os.environ.get("FLEXIQD_SCHEDULE_ROUNDS", "10"))


@pytest.fixture(params=["sqlite", "postgres"])
def shared_store(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'queue.db'}"
    return request.getfixturevalue("pg_server").fresh_url()


class Daemon:
    """One flexiqd process with a state folder of its own (two run on this machine)."""

    def __init__(self, tmp_path, index: int, config) -> None:
        self.state = tmp_path / f"state{index}"
        self.state.mkdir(exist_ok=True)
        self.config = config
        self.log_path = tmp_path / f"daemon{index}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = dict(os.environ, STATE_DIRECTORY=str(self.state), PYTHONPATH=os.pathsep.join([str(APPS), str(REPO)]))
        env.pop("NOTIFY_SOCKET", None)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "flexiqd.cli.daemon", "--config", str(self.config),
                                      "--no-api"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(self.state))

    def stop(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=60)


def jobs_per_slot(url: str) -> collections.Counter:
    backend = open_backend(url)
    try:
        return collections.Counter(job.idempotency_key for job in backend.list_jobs(task="tick", limit=100_000))
    finally:
        backend.close()


def test_two_daemons_killed_and_restarted_at_random_fire_each_slot_exactly_once(tmp_path, shared_store):
    config = tmp_path / "flexiqd.yaml"
    config.write_text(CONFIG.format(store=shared_store))
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    daemons = [Daemon(tmp_path, i, config) for i in range(2)]
    kills = restarts = 0
    try:
        for daemon in daemons:
            daemon.start()
        wait_for(lambda: jobs_per_slot(shared_store), 60, "the schedule's first job")
        for _ in range(ROUNDS):
            time.sleep(rng.uniform(0.1, 1.5))   # a random moment, not a deadline
            daemon = rng.choice(daemons)
            if rng.random() < 0.75:
                daemon.stop(signal.SIGKILL)
                kills += 1
            else:
                daemon.stop(signal.SIGTERM)
                restarts += 1
            if rng.random() < 0.5:
                time.sleep(rng.uniform(0.0, 2.0))   # both down at times, or one alone
            daemon.start()
        end = math.ceil(time.time()) + 1
        wait_for(lambda: slot_key("tick", end) in jobs_per_slot(shared_store), 60, "the slot after the last kill")
    finally:
        for daemon in daemons:
            daemon.stop(signal.SIGTERM)
    counts = jobs_per_slot(shared_store)
    slots = sorted(counts)
    first, last = _instant(slots[0]), _instant(slots[-1])
    # The daemons run on while they are stopped: slots after `end` may fire too, and count.
    expected = [slot_key("tick", t) for t in range(first, max(last, end) + 1)]
    duplicated = {key: n for key, n in counts.items() if n > 1}
    missing = sorted(set(expected) - set(counts))
    backend = open_backend(shared_store)
    try:
        deciders = collections.Counter(row.host for row in backend.schedule_ledger("tick", limit=100_000))
    finally:
        backend.close()
    print(f"\n{shared_store.split(':')[0]}: seed {seed}, {kills} kills -9 and {restarts} restarts over "
          f"{len(expected)} slots: {sum(counts.values())} jobs, {len(duplicated)} slots twice, "
          f"{len(missing)} missing; slots decided per daemon process: {len(deciders)} processes, "
          f"{sorted(deciders.values(), reverse=True)}")
    assert not duplicated, f"slots enqueued more than once: {duplicated}"
    assert not missing, f"slots never enqueued: {missing}"
    assert set(counts) == set(expected)


def _instant(key: str) -> int:
    from datetime import datetime, timezone

    stamp = key.rsplit(":", 3)[-3:]
    return int(datetime.strptime(":".join(stamp), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp())
