"""`make demo`'s timeline and start chain (demo/chain.py): order by time, each new worker's first job."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "demo"
if not (DEMO / "chain.py").is_file():
    # The package build runs the unit tests from a copy of the package and its tests only.
    pytest.skip("the demo is not in this tree (a package build)", allow_module_level=True)
sys.path.insert(0, str(DEMO))

from chain import Unit, chain_summary, new_worker_starts, parse_units, release, timeline  # noqa: E402
from plot import Sample, ScaleDecision, WorkerStart  # noqa: E402

from flexiqd.queue import ClaimRequest, NewJob, Outcome, open_backend  # noqa: E402

BURST = 1_700_000_000.0


def sample(at: float, workers: int = 1) -> Sample:
    return Sample(at=at, workers=workers, runnable=300, running=4, oldest_age=at, completion_rate=2.0)


def decision(at: float, previous: int = 1, desired: int = 16) -> ScaleDecision:
    return ScaleDecision(at=at, previous=previous, desired=desired, reason="ScaleUpAge")


def test_a_decision_between_two_rows_comes_between_them():
    rows = [sample(0.1), sample(1.7), sample(2.8, 16)]
    up, first_worker = decision(0.25), decision(-0.2, 0, 1)
    assert timeline(rows, [up, first_worker]) == [first_worker, rows[0], up, rows[1], rows[2]]


def test_a_decision_at_a_rows_time_comes_before_the_row_that_shows_its_effect():
    assert timeline([sample(2.0)], [decision(2.0)]) == [decision(2.0), sample(2.0)]


def test_a_pipe_prints_up_to_the_latest_sample_and_holds_back_what_may_still_be_preceded():
    # The decision at 3.2 s was read after the sample at 3.0 s: it waits for the next row.
    pending = [sample(3.0), decision(0.25), decision(3.2, 16, 13)]
    due, held = release(pending, horizon=3.0)
    assert due == [decision(0.25), sample(3.0)]
    assert held == [decision(3.2, 16, 13)]
    due, held = release(held + [sample(4.1, 13)], horizon=4.1)
    assert due == [decision(3.2, 16, 13), sample(4.1, 13)] and held == []


SYSTEMCTL_SHOW = """\
MainPID=118
Id=flexiq-worker@default-1.service
ActiveState=active
InactiveExitTimestamp=Tue 2023-11-14 22:13:10.000000 UTC
ActiveEnterTimestamp=Tue 2023-11-14 22:13:10.400000 UTC

MainPID=0
Id=flexiq-worker@default-2.service
ActiveState=inactive
InactiveExitTimestamp=
ActiveEnterTimestamp=

MainPID=131
Id=flexiq-worker@default-3.service
ActiveState=activating
InactiveExitTimestamp=Tue 2023-11-14 22:13:20.300000 UTC
ActiveEnterTimestamp=Tue 2023-11-14 22:13:10.500000 UTC
"""


def test_worker_units_are_read_from_systemctl_show():
    one, two, three = parse_units(SYSTEMCTL_SHOW)
    assert one == Unit(instance="default-1", pid=118, active=True, started_at=BURST - 10.0, ready_at=BURST - 9.6)
    assert two == Unit(instance="default-2", pid=0, active=False, started_at=None, ready_at=None)
    # Restarted and not ready yet: the ready time left from its previous run is not this start's.
    assert three == Unit(instance="default-3", pid=131, active=False, started_at=BURST + 0.3, ready_at=None)


@pytest.fixture
def store(tmp_path):
    backend = open_backend(f"sqlite:///{tmp_path / 'queue.db'}")
    yield backend
    backend.close()


def run_jobs(store, owner: str, *claims_at: float) -> None:
    """``owner`` claims one job at each time and finishes it: one attempt each in the store."""
    for at in claims_at:
        [job] = store.claim(ClaimRequest(owner=owner, queues=("default",), limit=1), now=at)
        store.settle(owner, [Outcome.ack(job.id)], now=at + 2.0)


def test_each_new_worker_s_first_job_is_found_in_the_store(store):
    store.enqueue([NewJob(task="flexiqd.demo.sleep")] * 10, now=BURST - 200)
    run_jobs(store, "vm:default-2:90", BURST - 100)        # an earlier run's worker
    run_jobs(store, "vm:default-1:100", BURST + 0.01)      # there before the burst: not one it brought
    run_jobs(store, "vm:default-3:201", BURST + 1.4, BURST + 1.0)
    run_jobs(store, "vm:default-2:200", BURST + 0.7, BURST + 2.0)
    run_jobs(store, "vm:default-4:202", BURST + 1.5)        # never seen by a snapshot
    units = [Unit("default-1", 100, True, BURST - 50, BURST - 49.5),
             Unit("default-2", 200, True, BURST + 0.3, BURST + 0.6),
             Unit("default-3", 201, True, BURST + 0.35, BURST + 0.9)]

    starts = new_worker_starts(store.executions(), units, BURST)

    assert [s.worker for s in starts] == ["default-2", "default-3", "default-4"]
    two, three, four = starts
    assert two == WorkerStart("default-2", pytest.approx(0.3), pytest.approx(0.6), pytest.approx(0.7))
    assert three.first_job_at == pytest.approx(1.0)  # its first job, not the last one it ran
    assert four == WorkerStart("default-4", None, None, pytest.approx(1.5))


def test_the_chain_is_summed_up_from_the_burst_to_the_new_workers_first_jobs():
    starts = [WorkerStart("default-2", 0.3, 0.6, 0.7), WorkerStart("default-3", 0.35, 0.9, 1.0),
              WorkerStart("default-4", None, None, 1.5)]
    line = chain_summary([decision(-0.2, 0, 1), decision(0.25)], starts)
    assert line == ("burst 0s \u2192 decision 1\u219216 0.25s \u2192 first unit ready 0.60s \u2192 "
                    "first job on a new worker 0.70s (median 1.00s, last 1.50s of 3)")
    assert chain_summary([], []) == "burst 0s; no new worker ran a job"
