"""A rolling upgrade's schema: the previous release's own code (from git) on a store this
release made or upgraded, on both stores; and a contract step that waits for older hosts.

The previous release is run as it is (tests/previous_release.py): its reader opens the
store with its own version check, claims what this release enqueued and enqueues for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
import time
from typing import Callable

import pytest

import previous_release
from flexiqd.queue import ClaimRequest, NewJob, Outcome, open_backend
from flexiqd.queue.postgres import database as postgres_module
from flexiqd.queue.sqlite import database as sqlite_module
from flexiqd.queue.postgres.schema import SCHEMA_LEVEL as PG_LEVEL, SCHEMA_VERSION as PG_VERSION
from flexiqd.queue.store.schema_steps import Kind, Step
from flexiqd.queue.sqlite.schema import SCHEMA_LEVEL as SQLITE_LEVEL, SCHEMA_VERSION as SQLITE_VERSION
from pg_server import in_ci

# The previous release's reader: opens the store (its version check), claims every due job,
# acknowledges them, enqueues one for the other release; prints what it did, as JSON.
OLD_READER = """
import json, sys, time
import flexiqd
from flexiqd.queue import ClaimRequest, NewJob, Outcome, open_backend
assert flexiqd.__file__.startswith(sys.argv[2]), flexiqd.__file__
store = open_backend(sys.argv[1])
now = time.time()
claimed = [job.id for job in store.claim(ClaimRequest("old-host:w", ("default",), 100), now=now)]
store.settle("old-host:w", [Outcome.ack(i) for i in claimed], now=now)
enqueued = store.enqueue([NewJob(task="from-old")], now=now)
store.close()
print(json.dumps({"claimed": claimed, "enqueued": enqueued}))
"""

OLD_CREATOR = """
import sys, time
from flexiqd.queue import NewJob, open_backend
store = open_backend(sys.argv[1])
print(store.enqueue([NewJob(task="made-by-old")], now=time.time())[0])
store.close()
"""


@pytest.fixture(scope="module")
def previous(tmp_path_factory):
    reason = previous_release.unavailable_reason()
    if reason is not None:
        if in_ci():
            pytest.fail(f"the rolling-upgrade tests must run in CI, but {reason}", pytrace=False)
        pytest.skip(reason)
    return previous_release.export(tmp_path_factory.mktemp("previous-release"))


@dataclasses.dataclass
class Store:
    dialect: str
    url: str
    state: Callable[[], tuple[int, int | None]]   # (the level older code reads, the newest step)
    set_level: Callable[[int], None]


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path) -> Store:
    """A store not created yet, of each dialect."""
    if request.param == "sqlite":
        path = tmp_path / "queue.db"

        def sql(statement: str):
            with contextlib.closing(sqlite3.connect(path)) as conn:
                return conn.execute(statement).fetchone()
        def steps() -> int | None:
            if sql("SELECT 1 FROM sqlite_master WHERE name = 'schema_steps'") is None:
                return None
            return sql("SELECT max(step) FROM schema_steps")[0]
        return Store("sqlite", f"sqlite:///{path}", lambda: (sql("PRAGMA user_version")[0], steps()),
                     lambda level: sql(f"PRAGMA user_version = {level}"))
    server = request.getfixturevalue("pg_server")
    url = server.fresh_url()
    schema = url.rsplit("search_path%3D", 1)[1]

    def pg(statement: str):
        return server.admin(statement, database="flexiq")
    def pg_steps() -> int | None:
        if pg(f"SELECT to_regclass('{schema}.flexiq_schema_steps')")[0][0] is None:
            return None
        return pg(f"SELECT max(step) FROM {schema}.flexiq_schema_steps")[0][0]
    return Store("postgresql", url,
                 lambda: (pg(f"SELECT max(version) FROM {schema}.flexiq_schema")[0][0], pg_steps()),
                 lambda level: pg(f"UPDATE {schema}.flexiq_schema SET version = {level}"))


def old(previous, script: str, url: str) -> str:
    """Run ``script`` of the previous release on the store; its output."""
    done = previous_release.run(previous, script, url, str(previous))
    assert done.returncode == 0, f"the previous release failed on the store:\n{done.stderr}"
    return done.stdout


def expected(dialect: str) -> tuple[int, int]:
    return (PG_LEVEL, PG_VERSION) if dialect == "postgresql" else (SQLITE_LEVEL, SQLITE_VERSION)


def previous_schema(dialect: str) -> int:
    return (previous_release.PREVIOUS_POSTGRES_SCHEMA if dialect == "postgresql"
            else previous_release.PREVIOUS_SQLITE_SCHEMA)


def test_the_previous_release_works_on_a_store_this_release_made(previous, store):
    dialect, url, state = store.dialect, store.url, store.state
    current = open_backend(url)
    mine = current.enqueue([NewJob(task="from-new")], now=time.time())
    # The level older code reads is the previous release's own: only expand steps since.
    assert state() == expected(dialect)
    assert expected(dialect)[0] == previous_schema(dialect) < expected(dialect)[1]

    done = json.loads(old(previous, OLD_READER, url))
    assert done["claimed"] == mine
    now = time.time()
    assert [job.id for job in current.claim(ClaimRequest("new-host:w", ("default",), 100), now=now)] == \
        done["enqueued"]
    current.settle("new-host:w", [Outcome.ack(i) for i in done["enqueued"]], now=now)
    assert current.get(mine[0]).state.value == "done"
    current.close()


def test_a_store_of_the_previous_release_upgraded_by_this_one_still_serves_the_previous(previous, store):
    dialect, url, state = store.dialect, store.url, store.state
    made = int(old(previous, OLD_CREATOR, url))
    assert state() == (previous_schema(dialect), None)
    current = open_backend(url)  # applies this release's expand steps
    assert state() == expected(dialect)
    mine = current.enqueue([NewJob(task="from-new")], now=time.time())
    done = json.loads(old(previous, OLD_READER, url))
    assert sorted(done["claimed"]) == sorted([made, *mine])
    current.close()


def test_a_level_past_the_previous_release_turns_it_away(previous, store):
    """The reader can fail: a store that took a contract step it does not know is refused."""
    open_backend(store.url).close()
    store.set_level(expected(store.dialect)[1] + 1)
    refused = previous_release.run(previous, OLD_READER, store.url, str(previous))
    assert refused.returncode != 0
    assert "newer than this flexiqd understands" in refused.stderr


def test_a_store_made_before_the_steps_were_recorded_keeps_the_level_its_code_checks(previous, store, tmp_path_factory):
    """That code compares the level with its own newest step exactly: lowered to the last
    contract step, it would run its migrations again over tables that exist."""
    dialect, url = store.dialect, store.url
    earlier = previous_release.export(tmp_path_factory.mktemp("before-steps"), previous_release.before_schema_steps())
    made = int(old(earlier, OLD_CREATOR, url))
    level = store.state()[0]
    assert level > previous_schema(dialect)  # it counted its expand step too
    current = open_backend(url)
    assert store.state() == (level, expected(dialect)[1])
    mine = current.enqueue([NewJob(task="from-new")], now=time.time())
    done = json.loads(old(earlier, OLD_READER, url))
    assert sorted(done["claimed"]) == sorted([made, *mine])
    current.close()


# -- a contract step waits for the hosts of older code ------------------------------------

def test_a_contract_step_waits_while_a_host_of_older_code_beats(store, monkeypatch):
    dialect, url, state = store.dialect, store.url, store.state
    module = postgres_module if dialect == "postgresql" else sqlite_module
    open_backend(url).close()
    level, newest = expected(dialect)
    table = "flexiq_upgrade_probe" if dialect == "postgresql" else "upgrade_probe"
    expand = Step(newest + 1, Kind.EXPAND, (f"CREATE TABLE {table} (n integer)",))
    contract = Step(newest + 2, Kind.CONTRACT, (f"DROP TABLE {table}",))
    # A host of the previous release beats: its report says nothing of a schema.
    beating = open_backend(url)
    beating.heartbeat("old-host", now=time.time(), interval=60.0, report={"pools": {}})
    monkeypatch.setattr(module, "STEPS", (*module.STEPS, expand, contract))
    monkeypatch.setattr(module, "SCHEMA_VERSION", newest + 2)

    first = open_backend(url)
    assert state() == (level, newest + 1)  # the expand step at once, the contract held back
    first.close()
    # The host upgraded: its beat reports the newer schema; the next process to open applies it.
    beating.heartbeat("old-host", now=time.time(), interval=60.0,
                      report={"pools": {}, "schema": {dialect: newest + 2}})
    open_backend(url).close()
    assert state() == (newest + 2, newest + 2)
    beating.close()
