"""`make demo`'s picture (demo/plot.py) and its text views (demo/demo.py), from made-up samples."""

from __future__ import annotations

import math
import struct
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "demo"
if not (DEMO / "plot.py").is_file():
    # The package build runs the unit tests from a copy of the package and its tests only.
    pytest.skip("the demo is not in this tree (a package build)", allow_module_level=True)
sys.path.insert(0, str(DEMO))

import demo  # noqa: E402
from plot import HEIGHT, WIDTH, Sample, ScaleDecision, WorkerStart, draw  # noqa: E402


def burst(seconds: int = 90) -> tuple[list[Sample], list[ScaleDecision]]:
    samples = []
    for t in range(seconds):
        workers = 1 if t < 5 else 8 if t < 60 else 2
        runnable = max(0, 300 - 16 * max(0, t - 3))
        samples.append(Sample(at=float(t), workers=workers, runnable=runnable, running=min(32, runnable + 4 * workers),
                              oldest_age=12 * math.exp(-t / 20) if runnable else 0.0, completion_rate=16.0))
    return samples, [ScaleDecision(at=4.5, previous=1, desired=8, reason="ScaleUpAge"),
                     ScaleDecision(at=59.5, previous=8, desired=2, reason="ScaleDownIdle")]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_the_picture_is_a_png_of_the_promised_size(tmp_path):
    samples, decisions = burst()
    starts = [WorkerStart(f"default-{n}", 2.0 + n / 10, 2.4 + n / 10, 2.5 + n / 10) for n in range(2, 9)]
    path = draw(samples, decisions, tmp_path / "out" / "demo.png", target_age=10.0, title="a burst",
                starts=starts + [WorkerStart("default-9", None, None, 4.0)], chain="burst 0s → ...")
    assert path == tmp_path / "out" / "demo.png"
    assert png_size(path) == (WIDTH, HEIGHT)
    assert path.stat().st_size > 20_000  # four panels of lines and text, not an empty canvas


def test_a_run_without_decisions_still_draws(tmp_path):
    samples, _ = burst(10)
    assert png_size(draw(samples, [], tmp_path / "calm.png", target_age=10.0, title="calm")) == (WIDTH, HEIGHT)


def test_a_scale_decision_is_read_from_its_journal_fields():
    entry = {"__REALTIME_TIMESTAMP": "1700000012500000", "FROM": "1", "TO": "8", "REASON": "ScaleUpAge",
             "MESSAGE": "flexiqd.daemon.controller: default 1 -> 8: ScaleUpAge: oldest job waits 12s (age=8)"}
    decision = demo.decision_from(entry, origin=1_700_000_000.0)
    assert decision == ScaleDecision(at=12.5, previous=1, desired=8, reason="ScaleUpAge",
                                     rationale="oldest job waits 12s (age=8)")


def test_a_decision_before_the_burst_shows_its_own_negative_time():
    assert demo.decision_row(ScaleDecision(at=-0.24, previous=0, desired=1, reason="ScaleUpMin")) == (
        "  -0.2s  decision: 0 -> 1 ScaleUpMin")


def test_the_live_screen_shows_the_latest_lines_of_the_timeline_decisions_among_the_samples():
    samples, decisions = burst(40)
    text = demo.screen("title", samples, decisions, peak=8, rows=5).splitlines()
    assert text[0] == "title" and "peak 8 workers, now 8" in text
    assert text[-5:] == [*map(demo.sample_row, samples[-4:]), demo.decision_row(decisions[1])]
    text = demo.screen("title", samples[:7], decisions, peak=8, rows=5).splitlines()
    # The decision at 4.5 s between the rows at 4 s and 5 s; the one at 59.5 s after the last row.
    assert text[-5:] == [demo.sample_row(samples[4]), demo.decision_row(decisions[0]), demo.sample_row(samples[5]),
                         demo.sample_row(samples[6]), demo.decision_row(decisions[1])]
