"""The policy benchmark's runs: every policy on a trace (``flexiq bench policies``, cli/bench.py).

The standard traces are shipped in ``flexiqd/sim/traces/``; ``bench_trace`` runs every
policy on one trace, the same realised jobs for each, the oracle last.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .engine import Policy, run
from .oracle import Oracle
from .policies import FixedPeak, Flexiq, Flexiqd, HpaCpu, KedaDepth
from .report import TraceReport
from .trace import Trace, Workload, realise

TRACES_DIR = Path(__file__).resolve().parent / "traces"


def standard_traces() -> list[Path]:
    """The shipped traces, in name order."""
    return sorted(TRACES_DIR.glob("*.json"))


def policies_for(workload: Workload, down_windows: Sequence[float] = (),
                 probe_factors: Sequence[float] = ()) -> list[Policy]:
    """Every policy compared, in table order (the oracle last)."""
    variants: list[Policy] = [Flexiqd(down_window=window) for window in down_windows]
    variants += [Flexiqd(probe_factor=factor) for factor in probe_factors]
    return [
        FixedPeak(workload.runnable_at, workload.base_duration),
        HpaCpu(),
        KedaDepth(),
        Flexiq(),
        Flexiqd(),
        *variants,
        Oracle(),
    ]


def bench_trace(trace: Trace, down_windows: Sequence[float] = (), probe_factors: Sequence[float] = ()) -> TraceReport:
    """Run every policy on ``trace`` (the same realised jobs for each)."""
    workload = realise(trace)
    policies = policies_for(workload, down_windows, probe_factors)
    return TraceReport(trace=trace, results=tuple(run(trace, workload, policy) for policy in policies))
