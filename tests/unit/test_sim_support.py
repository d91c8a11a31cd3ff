"""Small traces shared by the simulator tests (this module holds no tests itself)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from flexiqd.sim.trace import Trace, parse_trace

SMALL = {
    "name": "small",
    "seed": 11,
    "duration": 300,
    "tick_interval": 5,
    "target_age": 30,
    "workers": {"concurrency": 2, "cold_start": 3, "min": 1, "max": 12, "initial": 1, "stop_timeout": 20},
    "jobs": {"duration": {"kind": "lognormal", "median": 1.0, "p99": 5.0}},
    "arrivals": [
        {"kind": "steady", "rate": 2.0},
        {"kind": "burst", "at": 120, "jobs": 80, "spread": 5},
        {"kind": "steady", "rate": 0.2, "delay": 100, "label": "scheduled"},
    ],
    "dependency": {"name": "db", "capacity": 10, "per_job": 1, "share": 0.5, "request_load": 2,
                   "request_latency": 0.01},
}


def small_data(**changes) -> dict:
    """A copy of the small trace's JSON data with top-level ``changes``."""
    data = copy.deepcopy(SMALL)
    data.update(changes)
    return data


def small_trace(**changes) -> Trace:
    return parse_trace(small_data(**changes), source="small.json")


def write_trace(directory: Path, data: dict, name: str = "small.json") -> Path:
    path = directory / name
    path.write_text(json.dumps(data))
    return path
