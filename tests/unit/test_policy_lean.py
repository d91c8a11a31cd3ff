"""Running lean: no more workers than the age target needs (``flexiqd/policy/lean.py``)."""

from __future__ import annotations

import math

from flexiqd.policy import Behavior, History, PoolPolicy, Targets, decide
from flexiqd.policy.lean import cap_to_lean, lean_count
from flexiqd.policy.signals import signal_inputs
from flexiqd.policy.types import LoadSample, SignalRecommendation

from test_policy_support import observe

UNSMOOTHED = Behavior(down_window=0.0, up_limit=None, down_limit=None, tolerance=0.0)
LEAN = PoolPolicy(max_workers=20, targets=Targets(age=60, lead_time=5), behavior=UNSMOOTHED)
# The same pool with its drain time set (to the age target, the default it stands for).
DRAINING = PoolPolicy(max_workers=20, targets=Targets(age=60, lead_time=5, drain_time=60), behavior=UNSMOOTHED)

# 1 s jobs on 4-slot workers: 4 jobs/s a worker.  5.4 jobs/s arrive: 1.35 workers' worth.
TRICKLE = 5.4


def trickle(active: int, *, running: int, depth: int = 0, age: float = 0.0, arrivals: float = TRICKLE):
    return observe(active, running=running, runnable_depth=depth, oldest_runnable_age=age,
                   arrival_rate=arrivals, completion_rate=min(running, arrivals), duration_p50=1.0,
                   duration_p95=1.5)


def steady_history(rate: float = TRICKLE) -> History:
    """Five minutes of ``rate`` jobs/s of 1 s jobs, kept up with: the base rate the lean count is
    judged against, and the jobs' duration (Little's law)."""
    running = round(rate)
    return History(load=tuple(LoadSample(float(at), math.ceil(running / 4), running, rate, rate)
                              for at in range(-300, 0, 10)))


def test_a_trickle_between_two_counts_runs_on_the_fewer_while_every_job_keeps_the_age_target():
    # Two workers, four jobs running at this instant and none waiting: the utilisation signal
    # wants 2 (4 / (4 slots x 0.9)); one worker falls behind the trickle by about a job a second,
    # which leaves every job well within 60 s for the next two lead times.
    lean = decide(trickle(2, running=4), LEAN, steady_history(), 0.0)
    assert lean.desired == 1
    assert lean.reason == "ScaleDownUtilisation"
    assert "1 worker keeps every job within the age target" in lean.message
    # The drain time set: every backlog drains within it, so none is kept on purpose.
    assert decide(trickle(2, running=4), DRAINING, steady_history(), 0.0).desired == 2


def test_a_kept_backlog_calls_the_worker_back_before_its_jobs_would_be_late():
    # On one worker the backlog has grown for minutes: its oldest job waited 40 s and 150 more
    # wait.  Another second of it would not start them all within the target, so the signals'
    # own count (two or more) stands, and nothing is said of a lean count.
    late = decide(trickle(1, running=4, depth=150, age=40.0), LEAN, steady_history(), 0.0)
    assert late.desired >= 2
    assert "keeps every job within the age target" not in late.message
    # A young backlog of the same trickle on one worker is kept.
    young = decide(trickle(1, running=4, depth=8, age=2.0), LEAN, steady_history(), 0.0)
    assert young.desired == 1
    assert "1 worker keeps every job within the age target" in young.message


def test_never_fewer_workers_than_hold_the_jobs_running_now():
    # Eight jobs running fill two workers: stopping one would keep its slots busy until its jobs
    # end, and start none of the waiting ones sooner.
    assert decide(trickle(2, running=8), LEAN, steady_history(), 0.0).desired == 2
    assert decide(trickle(2, running=4), LEAN, steady_history(), 0.0).desired == 1


def test_not_while_arrivals_rise_above_the_base_rate():
    # The last minute's rate a third above the five minutes' median: a crowd may be arriving,
    # and the count it needs is not known yet.
    rising = decide(trickle(2, running=4, arrivals=1.35 * TRICKLE), LEAN, steady_history(), 0.0)
    assert rising.desired == 2
    assert "keeps every job within the age target" not in rising.message


def test_the_lean_count_caps_the_age_drain_and_utilisation_signals_never_the_safety_net():
    wanted = (SignalRecommendation("age", 10, "oldest job"), SignalRecommendation("util", 6, "utilisation"),
              SignalRecommendation("drain", 3, "time to drain"), SignalRecommendation("safety", 12, "late"),
              SignalRecommendation("due", 9, "coming due"))
    capped = cap_to_lean(wanted, 4)
    assert {rec.signal: rec.workers for rec in capped} == {"age": 4, "util": 4, "drain": 3, "safety": 12, "due": 9}
    assert capped[0].detail == "oldest job; 4 workers keep every job within the age target"
    assert cap_to_lean(wanted, None) == wanted


def test_never_more_than_one_worker_short_of_what_the_arrivals_need():
    # 40 jobs/s of 1 s jobs and a young backlog: over the horizon alone, a pool several workers
    # short would still start every job in time; the lean count stops one short of the arrivals'
    # need (a pool further short could not catch up once the horizon had passed).
    flood = observe(12, running=36, runnable_depth=5, oldest_runnable_age=1.0, arrival_rate=40.0,
                    completion_rate=36.0, duration_p50=1.0, duration_p95=1.0)
    history = steady_history(40.0)
    inputs = signal_inputs(flood, LEAN, history.load + (LoadSample(0.0, 12, 36, 36.0, 40.0, 5),))
    need = math.ceil(inputs.arrivals / inputs.throughput)
    assert need >= 10 and lean_count(inputs) == need - 1
    decision = decide(flood, LEAN, history, 0.0)
    assert decision.desired == need - 1
    assert f"{need - 1} workers keep every job within the age target" in decision.message


def test_a_backlog_kept_on_purpose_is_not_counted_as_a_ceilings_evidence():
    # One worker kept lean on the trickle for a minute, its slots busy and a young backlog
    # waiting: the knee takes no count (it would measure what the pool chose to run).
    history = steady_history()
    series: dict[int, int] = {}
    for second in range(60):
        series[second] = 4
        obs = observe(1, running=4, runnable_depth=8, oldest_runnable_age=2.0, arrival_rate=TRICKLE,
                      completion_rate=4.0, duration_p50=1.0, duration_p95=1.5, recent_completions=60,
                      recent_window=15.0, completion_series=tuple(sorted(series.items()))[-15:],
                      series_reported=True)
        decision = decide(obs, LEAN, history, float(second))
        history = decision.history
        assert decision.desired == 1
    assert history.knee.samples == () and history.knee.lean_at == 59.0
    # The same pool with its drain time set is counted (and grows).
    counted = decide(obs, DRAINING, decision.history, 60.0)
    assert [kept.workers for kept in counted.history.knee.samples] == [1]
