"""Each signal on its own, scale from zero, scale to zero, and what counts as capacity."""

from __future__ import annotations

import pytest

from flexiqd.policy import Behavior, Dependency, DependencyUse, History, PoolPolicy, Targets, decide, decide_fleet
from flexiqd.policy.fleet import PoolInput
from flexiqd.policy.signals import per_worker_throughput
from flexiqd.policy.types import LoadSample

from test_policy_support import busy, metrics, observe, run

# Rate limits and windows off, so each test sees the signals' own answer.
UNSMOOTHED = Behavior(down_window=0.0, up_limit=None, down_limit=None)


def policy(**fields) -> PoolPolicy:
    fields.setdefault("max_workers", 100)
    fields.setdefault("behavior", UNSMOOTHED)
    return PoolPolicy(**fields)


def recommendation(decision, signal):
    return {rec.signal: rec.workers for rec in decision.recommendations}.get(signal)


def test_age_signal_sizes_the_backlog_plus_arrivals_from_measured_throughput():
    # 8 jobs/s complete on 8 running jobs: one 4-slot worker does 4 jobs/s.
    obs = observe(2, runnable_depth=200, oldest_runnable_age=25.0, **busy(2))
    before = History(load=(LoadSample(90.0, 2, 8, 8.0, 8.0),))  # the same a tick earlier: Little's law
    decision = decide(obs, policy(targets=Targets(age=30, lead_time=10)), before, 100.0)
    # slack = max(30 - 25 - 10, 30/4) = 7.5 s; jobs of 1 s (4 slots / 4 jobs/s): each worker
    # starts 4 at once and 4 x 7.5 more; 200 waiting + 8 x 7.5 arriving + 8 running hold
    # slots: 268 / 34 = 7.9 -> 8 (the throughput alone, (8 + 200 / 7.5) / 4, says 9)
    assert recommendation(decision, "age") == 8
    assert decision.desired == 8
    assert decision.reason == "ScaleUpAge"
    assert decision.winner == "age"
    assert "oldest job 25.0s <= target 30.0s" in decision.message


def test_age_signal_says_when_the_oldest_job_is_past_its_target():
    obs = observe(2, runnable_depth=50, oldest_runnable_age=42.0, **busy(2))
    decision = decide(obs, policy(targets=Targets(age=10, lead_time=3)), None, 0.0)
    assert decision.reason == "ScaleUpAge"
    assert decision.message.startswith("oldest job 42.0s > target 10.0s")


def test_age_signal_has_no_opinion_without_a_backlog():
    decision = decide(observe(3, **busy(3, fraction=0.5)), policy(), None, 0.0)
    assert recommendation(decision, "age") is None
    assert recommendation(decision, "drain") is None


def test_drain_signal_uses_littles_law_not_a_ratio():
    obs = observe(2, runnable_depth=120, oldest_runnable_age=1.0, **busy(1))  # 4 jobs/s per worker
    before = History(load=(LoadSample(-10.0, 2, 4, 4.0, 4.0),))
    decision = decide(obs, policy(targets=Targets(age=30, drain_time=5)), before, 0.0)
    # jobs of 1 s; (120 waiting + 4 x 5 arriving + 4 running) / (4 x (1 + 5 / 1)) = 6
    # (the throughput alone, (4 + 120 / 5) / 4, says 7: it forgets each new worker's free slots)
    assert recommendation(decision, "drain") == 6
    assert decision.reason == "ScaleUpDrain"
    assert "time to drain 30.0s, target 5.0s" in decision.message


def test_a_backlog_of_slow_jobs_needs_a_slot_each_not_their_throughput():
    # 30 s jobs (4 slots, 2 busy workers: 8 running, 0.27 jobs/s each), 200 waiting that
    # must start within 7.5 s: a worker's completions in that time are one job, its free slots
    # four.  (200 + 8) / (4 x (1 + 7.5 / 30)) = 41.6 -> 42; by throughput alone 200 / 7.5 /
    # (4 / 30) = 200.
    slow = dict(running=8, completion_rate=8 / 30, arrival_rate=0.0, duration_p50=30.0, duration_p95=33.0)
    obs = observe(2, runnable_depth=200, oldest_runnable_age=25.0, **slow)
    before = History(load=tuple(LoadSample(at, 2, 8, 8 / 30, 0.0) for at in range(-300, 100, 10)))
    decision = decide(obs, policy(targets=Targets(age=30, lead_time=10)), before, 100.0)
    assert recommendation(decision, "age") == 42


def test_quick_arrivals_after_a_burst_of_slow_jobs_are_not_sized_on_the_bursts_mean():
    # The last minute held a burst of slow jobs: 40 slots busy while 12 jobs/s completed, a
    # mean of over 3 s by Little's law.  The burst is done: 8 quick jobs run, 3 wait, 10
    # arrive a second.  10 jobs/s x 3 s would hold 31 slots; no more than the 11 jobs
    # running and waiting can use one now.
    before = History(load=tuple(LoadSample(at, 40, 40, 12.0, 10.0) for at in range(-50, 0, 5)))
    obs = observe(40, concurrency=1, runnable_depth=3, oldest_runnable_age=0.5, running=8,
                  completion_rate=12.0, arrival_rate=10.0, duration_p50=0.5, duration_p95=0.8)
    decision = decide(obs, policy(targets=Targets(age=60, lead_time=10)), before, 0.0)
    assert recommendation(decision, "age") == 11


def test_a_saturated_pool_completing_far_less_than_its_estimate_is_sized_on_its_jobs_in_flight():
    # The estimate says 1 s jobs (4 jobs/s per worker, from the quick jobs of the last minutes);
    # a burst of slow jobs now fills every slot: 8 running for 8 s on average, and the store's
    # last 15 s saw 3 completions where the estimate expects 120.  Sized on 8 s jobs, before
    # the oldest waiting job is anywhere near late.
    quick = [LoadSample(at, 2, 8, 8.0, 8.0) for at in range(-300, 90, 10)]
    burst = dict(running=8, completion_rate=8.0, arrival_rate=8.0, running_age_mean=8.0,
                 recent_completions=3, recent_window=15.0)
    obs = observe(2, runnable_depth=150, oldest_runnable_age=5.0, **burst)
    # (An explicit drain time: the signal's own count, not the lean one.)
    targets = Targets(age=60, lead_time=10, drain_time=60)
    decision = decide(obs, policy(targets=targets), History(load=tuple(quick)), 100.0)
    slow = recommendation(decision, "age")
    # The same pool whose recent completions agree with the estimate: sized on 1 s jobs.
    agreeing = observe(2, runnable_depth=150, oldest_runnable_age=5.0, **{**burst, "recent_completions": 120})
    fast = recommendation(decide(agreeing, policy(targets=targets), History(load=tuple(quick)), 100.0), "age")
    # The arrivals (8/s of 1 s jobs) keep 8 slots busy: 2 workers.  The 150 waiting start within
    # 60 - 5 / 2 - 10 = 47.5 s: as 1 s jobs 150 / (4 x 48.5) = 0.8 more workers (3 in all); as
    # 8 s jobs 150 / (4 x 6.9) = 5.4 more (8 in all).
    assert (fast, slow) == (3, 8)


def test_throughput_falls_back_to_concurrency_over_p50_before_anything_completes():
    obs = observe(1, runnable_depth=40, running=4, completion_rate=0.0, arrival_rate=0.0, duration_p50=2.0)
    decision = decide(obs, policy(targets=Targets(age=30, drain_time=10)), None, 0.0)
    # 4 slots / 2 s = 2 jobs/s per worker; 40 / 10 s = 4 jobs/s -> 2 workers
    assert recommendation(decision, "drain") == 2


def test_depth_signal_is_off_by_default_and_keda_like_when_set():
    obs = observe(2, runnable_depth=95, oldest_runnable_age=0.5, **busy(1, fraction=0.25))
    assert recommendation(decide(obs, policy(), None, 0.0), "depth") is None
    decision = decide(obs, policy(targets=Targets(depth_per_worker=10)), None, 0.0)
    assert recommendation(decision, "depth") == 10
    assert decision.reason == "ScaleUpDepth"


def test_utilisation_signal_against_its_target():
    # An explicit drain time: the pool does not run lean (see test_policy_lean).
    decision = decide(observe(4, **busy(4)), policy(targets=Targets(utilisation=0.8, drain_time=30)), None, 0.0)
    assert recommendation(decision, "util") == 5  # 16 running / (4 slots x 0.8)
    assert decision.reason == "ScaleUpUtilisation"


def test_utilisation_signal_averages_running_jobs_over_time():
    ticks = [(float(t), observe(4, running=16 if t == 100 else 4, completion_rate=4.0)) for t in range(0, 101, 5)]
    last = run(policy(), ticks)[-1]
    # One tick at 16 among five at 4: the mean over the last 30 s is 6, not 16.
    assert recommendation(last, "util") == 2


def test_workers_already_draining_their_jobs_are_not_replaced_by_the_utilisation_signal():
    # 10 workers draining their jobs out beside 4 active ones: the running jobs are mostly theirs.
    ticks = [(float(t), observe(4, draining=10, concurrency=1, running=14, completion_rate=0.1))
             for t in range(0, 40, 2)]
    last = run(policy(), ticks)[-1]
    assert recommendation(last, "util") <= 5


def test_cpu_signal_only_for_cpu_bound_pools():
    obs = observe(4, cpu_utilisation=0.9, **busy(4, fraction=0.25))
    assert recommendation(decide(obs, policy(), None, 0.0), "cpu") is None
    decision = decide(obs, policy(cpu_bound=True, targets=Targets(cpu=0.6)), None, 0.0)
    assert recommendation(decision, "cpu") == 6  # 4 workers x 0.9 / 0.6
    assert decision.reason == "ScaleUpCPU"


@pytest.mark.parametrize("up_window", [0.0, 60.0])
def test_a_pool_with_no_workers_and_runnable_jobs_always_gets_one(up_window):
    cautious = policy(min_workers=0, scale_to_zero=True, behavior=Behavior(up_window=up_window))
    decision = decide(observe(0, runnable_depth=3, oldest_runnable_age=1.0), cautious, None, 0.0)
    assert decision.desired >= 1
    assert decision.reason == "ScaleFromZero"


def test_idle_pool_keeps_one_worker_unless_scale_to_zero_is_set():
    idle = observe(3)
    kept = decide(idle, policy(min_workers=0), None, 0.0)
    assert kept.desired == 1
    assert (kept.reason, kept.message) == ("ScaleDownIdle", "no runnable or running jobs; the floor is 1 workers")
    emptied = decide(idle, policy(min_workers=0, scale_to_zero=True), None, 0.0)
    assert emptied.desired == 0
    assert emptied.reason == "ScaleDownIdle"


def test_scale_to_zero_never_stops_the_last_worker_while_jobs_run():
    decision = decide(observe(2, running=1, completion_rate=0.1), policy(min_workers=0, scale_to_zero=True), None, 0.0)
    assert decision.desired == 1


def test_starting_workers_count_as_capacity_so_a_boot_is_not_answered_with_more_boots():
    # (8 arrivals/s + 120 runnable / 15 s slack) / 4 jobs/s per worker = 4 workers
    backlog = dict(runnable_depth=120, oldest_runnable_age=5.0, **busy(2))
    sized = policy(targets=Targets(drain_time=30))  # not lean: the signals' own count
    assert decide(observe(2, **backlog), sized, None, 0.0).desired == 4
    booting = decide(observe(2, starting=2, **backlog), sized, None, 0.0)
    assert booting.current == 4
    assert booting.desired == 4
    assert booting.reason == "DesiredWithinRange"


def test_draining_workers_do_not_count_as_capacity():
    decision = decide(observe(2, draining=3, **busy(2, fraction=0.9)), policy(), None, 0.0)
    assert decision.current == 2
    assert decision.desired == 2


def test_per_worker_throughput_from_littles_law_over_the_history():
    load = (LoadSample(0.0, 2, 8, 4.0, 4.0), LoadSample(10.0, 4, 16, 8.0, 8.0))
    # The 8 jobs running at 0 s stand for the 10 s until the next tick, whose rate (8 jobs/s,
    # counted up to then) is of the same span: 1 s per job; one 4-slot worker does 4 jobs/s.
    # This tick's 16 stand for nothing yet: they have not had the time to complete.
    assert per_worker_throughput(metrics(duration_p50=None, duration_p95=None), 4, load) == pytest.approx(4.0)


def test_a_saturated_pool_doubles_at_once_when_nothing_has_completed_yet():
    # A cold start: a burst fills every slot and nothing has finished, so no throughput is known.
    cold = observe(2, runnable_depth=30, running=8, oldest_runnable_age=0.5, completion_rate=0.0,
                   duration_p50=None)
    decision = decide(cold, policy(), None, 0.0)
    assert recommendation(decision, "saturation") == 4
    assert decision.desired == 4 and decision.reason == "ScaleUpSaturation"


def test_saturation_has_no_opinion_once_throughput_is_known_or_free_slots_take_every_waiting_job():
    known = observe(2, runnable_depth=30, running=8, oldest_runnable_age=0.5, **{"completion_rate": 8.0})
    assert recommendation(decide(known, policy(), None, 0.0), "saturation") is None
    free = observe(2, runnable_depth=3, running=5, completion_rate=0.0, duration_p50=None)
    assert recommendation(decide(free, policy(), None, 0.0), "saturation") is None


def test_the_draining_workers_jobs_take_no_free_slot_of_the_active_ones():
    # 2 active 4-slot workers run 2 jobs; 6 draining workers run their last 6 out.  The 6 free
    # slots take the 5 waiting jobs: nothing is saturated.
    draining = observe(2, draining=6, runnable_depth=5, running=8, completion_rate=0.0, duration_p50=None)
    assert recommendation(decide(draining, policy(), None, 0.0), "saturation") is None


def test_a_backlog_is_not_sized_on_the_slots_draining_workers_hold():
    # A burst of slow jobs given back: 20 draining workers (1 slot each) run them out; 4 active
    # workers run 4 quick jobs, 8 quick ones wait.  The draining workers' jobs need no slot of the
    # pool: the age signal sizes the 4 running and 8 waiting.
    ticks = [(float(t), observe(4, draining=20, concurrency=1, runnable_depth=8, running=24,
                                oldest_runnable_age=2.0, completion_rate=8.0, arrival_rate=8.0,
                                duration_p50=0.5, duration_p95=1.0)) for t in range(0, 20, 2)]
    last = run(policy(targets=Targets(age=30.0)), ticks)[-1]
    assert recommendation(last, "age") <= 12


def test_a_burst_is_saturation_at_its_commit_before_any_worker_claimed():
    # 30 jobs just committed, 8 free slots, nothing running yet: once claimed, 22 still wait.
    burst = observe(2, runnable_depth=30, running=0, completion_rate=0.0, duration_p50=None)
    assert recommendation(decide(burst, policy(), None, 0.0), "saturation") == 4


def test_saturation_doubles_the_busy_workers_not_the_ones_still_starting():
    booting = observe(2, starting=2, runnable_depth=30, running=8, completion_rate=0.0, duration_p50=None)
    decision = decide(booting, policy(), None, 0.0)
    assert recommendation(decision, "saturation") == 4   # 2 busy x 2: the 2 starting are that growth
    assert decision.desired == 4


def test_a_cold_backlog_keeps_the_workers_still_starting_for_it():
    # 8 workers asked for a burst, 1 up and busy, 7 still starting, nothing completed yet:
    # stopping the 7 would throw their starts away while 399 jobs wait for them.
    booting = observe(1, starting=7, concurrency=1, runnable_depth=399, running=1, oldest_runnable_age=1.0,
                      completion_rate=0.0, duration_p50=None)
    decision = decide(booting, policy(), None, 0.0)
    assert recommendation(decision, "saturation") == 8
    assert decision.desired == 8
    # None up yet: the pool is held as it is, not given back to its floor.
    nobody_up = observe(0, starting=8, concurrency=1, runnable_depth=400, oldest_runnable_age=1.0,
                        completion_rate=0.0, duration_p50=None)
    decision = decide(nobody_up, policy(), None, 0.0)
    assert recommendation(decision, "saturation") == 8
    assert decision.desired == 8
    assert "8 workers starting, 400 runnable" in decision.message


def test_staggered_starts_for_work_coming_due_are_not_given_back_while_they_boot():
    # The daemon's 0 -> 40 on a dependency with start_burst 8, its workers slow to start: the
    # due signal asks for 40, 8 start; the jobs become runnable before any worker is up.
    db = Dependency(name="db", capacity=100, start_burst=8)
    pool = policy(max_workers=40, min_workers=0, scale_to_zero=True, targets=Targets(age=10),
                  behavior=Behavior(), dependencies=(DependencyUse(dependency="db", per_worker=2),))

    def ticks():
        due = dict(coming_due=400, coming_due_within=1.5)
        yield 0.0, 0, 0, dict(due)
        for now in (0.5, 1.0):
            yield now, 0, 8, dict(due)
        for now in (1.5, 2.0, 2.5, 3.0, 3.5, 4.0):  # runnable now; the 8 still boot
            yield now, 0, 8, dict(runnable_depth=400, oldest_runnable_age=now - 1.5)
        yield 4.5, 1, 7, dict(runnable_depth=399, running=1, oldest_runnable_age=3.0)

    history, decisions = None, []
    for now, active, starting, fields in ticks():
        obs = observe(active, starting=starting, concurrency=1, completion_rate=0.0, duration_p50=None,
                      duration_p95=None, duration_p99=None, **fields)
        decision = decide_fleet([PoolInput(observation=obs, policy=pool, history=history)], [db], now)["default"]
        history = decision.history
        decisions.append(decision)
    assert (decisions[0].desired, decisions[0].reason) == (8, "StartStaggered")
    assert [d.desired for d in decisions[1:]] == [8] * (len(decisions) - 1)


def test_time_to_drain_of_the_metrics():
    assert metrics(runnable_depth=0, completion_rate=0.0).time_to_drain == 0.0
    assert metrics(runnable_depth=30, completion_rate=0.0).time_to_drain is None
    assert metrics(runnable_depth=30, completion_rate=10.0).time_to_drain == 3.0
