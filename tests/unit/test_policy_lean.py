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


def trickle(active: int, *, running: int, depth: int = 0, age: float = 0.0, arrivals: float = TRICKLE,
            **fields):
    fields = dict(dict(duration_p50=1.0, duration_p95=1.5), **fields)
    return observe(active, running=running, runnable_depth=depth, oldest_runnable_age=age,
                   arrival_rate=arrivals, completion_rate=min(running, arrivals), **fields)


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
    assert decide(trickle(2, running=8, running_age_mean=20.0), LEAN, steady_history(), 0.0).desired == 2
    assert decide(trickle(2, running=4), LEAN, steady_history(), 0.0).desired == 1
    # Jobs that have run less than a tick end before the next one: a worker stopped now frees
    # its slots at once.
    assert decide(trickle(2, running=8, running_age_mean=0.3), LEAN, steady_history(), 0.0).desired == 1


def test_a_worker_is_given_back_only_while_the_fewer_hold_a_lead_time_longer():
    # 30 jobs waiting, the oldest 40 s, short jobs (no slots to wait for): one worker would still
    # start every job within the target, but not once the backlog had grown for another lead
    # time.  Given back at this tick, the worker would be asked for again at the next: two hold.
    quick = dict(running_age_mean=0.3)
    assert decide(trickle(2, running=8, depth=30, age=40.0, **quick), LEAN, steady_history(), 0.0).desired == 2
    # The same backlog 20 s younger holds a lead time longer: one is enough.
    assert decide(trickle(2, running=8, depth=30, age=20.0, **quick), LEAN, steady_history(), 0.0).desired == 1


def test_not_while_arrivals_rise_above_the_base_rate():
    # The last minute's rate a third above the five minutes' median: a crowd may be arriving,
    # and the count it needs is not known yet.
    rising = decide(trickle(2, running=4, arrivals=1.35 * TRICKLE), LEAN, steady_history(), 0.0)
    assert rising.desired == 2
    assert "keeps every job within the age target" not in rising.message


def test_a_step_of_the_load_is_a_rise_only_until_the_last_minute_has_settled():
    # Five minutes of a low rate, then 5.4 jobs/s: the five minutes' median is still the low rate.
    # 90 s after the step the rate half a minute ago was the new one too: the load is level again,
    # and the pool runs lean on it.  20 s after the step it is still rising.
    def stepped(since_step: float) -> History:
        return History(load=tuple(LoadSample(float(at), 1 if at < -since_step else 2,
                                             1 if at < -since_step else 5,
                                             1.0 if at < -since_step else TRICKLE,
                                             1.0 if at < -since_step else TRICKLE)
                                  for at in range(-300, 0, 10)))

    settled = decide(trickle(2, running=4), LEAN, stepped(90.0), 0.0)
    assert settled.desired == 1 and "1 worker keeps every job" in settled.message
    rising = decide(trickle(2, running=4), LEAN, stepped(20.0), 0.0)
    assert rising.desired == 2 and "keeps every job" not in rising.message


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
    flood = observe(12, running=40, runnable_depth=5, oldest_runnable_age=1.0, arrival_rate=40.0,
                    completion_rate=36.0, duration_p50=1.0, duration_p95=1.0)
    history = steady_history(40.0)
    inputs = signal_inputs(flood, LEAN, history.load + (LoadSample(0.0, 12, 40, 36.0, 40.0, 5),))
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


# A pool that may go down to no worker, on a trickle of a tenth of a worker's slots.
TO_ZERO = PoolPolicy(min_workers=0, scale_to_zero=True, max_workers=20, targets=Targets(age=60, lead_time=5),
                     behavior=UNSMOOTHED)


def quiet_history() -> History:
    """Five minutes of 0.5 jobs/s of 2 s jobs on one 4-slot worker (a slot busy)."""
    return History(load=tuple(LoadSample(float(at), 1, 1, 0.5, 0.5) for at in range(-300, 0, 10)))


def test_a_pool_that_may_scale_to_zero_pauses_while_a_worker_started_later_keeps_the_target():
    sparse = dict(arrivals=0.5, duration_p50=2.0, running_age_mean=0.5)
    # One job running, two young ones waiting: a worker asked for a lead time from now would
    # still start them all in time, and for long enough to be worth a start -- the last worker
    # is given back.
    paused = decide(trickle(1, running=1, depth=2, age=3.0, **sparse), TO_ZERO, quiet_history(), 0.0)
    assert paused.desired == 0
    assert "0 workers keep every job within the age target" in paused.message
    # With no worker, the young backlog waits...
    waiting = decide(trickle(0, running=0, depth=5, age=10.0, **sparse), TO_ZERO, quiet_history(), 0.0)
    assert waiting.desired == 0
    # A pause shorter than a lead time saves less than a start costs: a worker running keeps
    # running, where no worker running waits on.
    assert decide(trickle(1, running=1, depth=15, age=33.0, **sparse), TO_ZERO, quiet_history(), 0.0).desired == 1
    assert decide(trickle(0, running=0, depth=15, age=33.0, **sparse), TO_ZERO, quiet_history(), 0.0).desired == 0
    # ...until the oldest job would not start in time with a worker asked for any later.
    due = decide(trickle(0, running=0, depth=25, age=48.0, **sparse), TO_ZERO, quiet_history(), 0.0)
    assert due.desired == 1 and due.reason == "ScaleFromZero"
    # Without scale_to_zero a busy pool keeps its worker, and the lean count says so.
    kept = decide(trickle(1, running=1, depth=2, age=3.0, **sparse), LEAN, quiet_history(), 0.0)
    assert kept.desired == 1 and kept.reason != "RaisedToMinimum"
