"""The charts' samples (flexiqd.daemon.samples): steps of ticks, a bounded ring, kept across restarts."""

from __future__ import annotations

import json
import tracemalloc
from types import SimpleNamespace

from flexiqd.daemon.samples import CAPACITY, FIELDS, STEP, PoolSamples, Samples

T0 = 1_700_000_000.0  # a multiple of STEP: a step starts here


def values(**given):
    base = dict(active=2, starting=0, draining=0, desired=2, runnable=0, running=0, delayed=0, oldest_age=0.0)
    base.update(given)
    return base


def test_ticks_within_a_step_make_one_sample_with_its_peaks_and_its_last_counts():
    ring = PoolSamples()
    ring.record(values(runnable=40, oldest_age=3.0, active=2), T0)
    ring.record(values(runnable=10, oldest_age=1.0, active=4, desired=6), T0 + 1)
    ring.record(values(runnable=None, oldest_age=None, active=5, desired=6), T0 + 2)  # stats not read
    ring.record(values(runnable=7), T0 + STEP)
    first, second = ring.since(0)
    assert (first["runnable"], first["oldest_age"]) == (40, 3.0)       # the burst's peak stays visible
    assert (first["active"], first["desired"], first["t"]) == (5, 6, T0 + 2)
    assert (second["runnable"], second["t"]) == (7, T0 + STEP)
    assert [s["t"] for s in ring.since(T0 + 3)] == [T0 + STEP]


def test_the_ring_keeps_the_last_hour_only():
    ring = PoolSamples()
    for i in range(2 * CAPACITY + 3):
        ring.record(values(runnable=i), T0 + i * STEP)
    kept = ring.since(0)
    assert len(kept) == CAPACITY
    assert [s["runnable"] for s in kept] == list(range(CAPACITY + 3, 2 * CAPACITY + 3))


def test_a_ring_at_its_limit_takes_a_few_dozen_kibibytes_whatever_the_tick():
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    ring = PoolSamples()
    for i in range(10 * CAPACITY):
        ring.record(values(runnable=i, oldest_age=i / 3), T0 + i * STEP / 5)  # five ticks a step
    grown = sum(stat.size_diff for stat in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    assert len(ring.since(0)) == CAPACITY
    assert grown < 64 * 1024, grown  # len(FIELDS) arrays of CAPACITY doubles: ~52 KiB


def test_samples_outlive_a_restart_through_their_document_and_drop_removed_pools():
    samples = Samples()
    view = SimpleNamespace(active=3, starting=1, draining=0, decision=SimpleNamespace(desired=4),
                           metrics=SimpleNamespace(runnable_depth=12, running=6, oldest_runnable_age=2.5),
                           stats=[SimpleNamespace(delayed=2)])
    samples.record({"default": view, "old": view}, T0)
    document = json.loads(json.dumps(samples.to_document()))
    again = Samples.from_document(document, ["default"])
    assert list(again.pools) == ["default"]
    assert again.since("default", 0) == [dict(t=T0, active=3, starting=1, draining=0, desired=4, runnable=12,
                                              running=6, delayed=2, oldest_age=2.5)]
    assert Samples.from_document({"fields": ["t"], "pools": {}}, ["default"]).pools == {}  # another version
    assert Samples.from_document("damaged", ["default"]).pools == {}
    assert list(FIELDS)[0] == "t"
