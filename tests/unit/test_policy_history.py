"""A decision history survives a daemon restart, and changes made by others enter it."""

import json

from flexiqd.policy import History, Observation, PoolMetrics, decide, pool_policy_from_mapping
from flexiqd.policy.history import history_from_dict, history_to_dict, with_external_change


def test_a_history_comes_back_equal_from_json():
    policy = pool_policy_from_mapping({"max_workers": 10})
    history = None
    for step in range(5):
        obs = Observation(pool="p", active=2, concurrency=2,
                          metrics=PoolMetrics(runnable_depth=40 * step, running=4, oldest_runnable_age=3.0 * step,
                                              completion_rate=2.0, arrival_rate=3.0, rate_window=60.0))
        history = decide(obs, policy, history, 1000.0 + step).history
    assert history_from_dict(json.loads(json.dumps(history_to_dict(history)))) == history


def test_an_unreadable_history_starts_afresh():
    assert history_from_dict(None) == History()
    assert history_from_dict({"recommendations": [["not", "a", "count", "at all"]]}) == History()


def test_a_knee_saved_by_an_older_version_with_more_fields_is_read():
    # Versions before 0.1.1 kept the jobs in flight's ages with each throughput sample.
    saved = {"seeded": True, "recommendations": [[10.0, 2, None]],
             "knee": {"samples": [[2, 80.0, 0.05, 10.0, 160, None, 0.2, 4.0, 1]], "held_at": 2, "held_since": 10.0}}
    history = history_from_dict(saved)
    assert history.seeded and history.knee.held_at == 2
    assert [(s.workers, s.completion_rate, s.completions) for s in history.knee.samples] == [(2, 80.0, 160)]


def test_an_operators_change_enters_the_history_like_a_decision():
    policy = pool_policy_from_mapping({"max_workers": 10})
    history = with_external_change(None, policy, 50.0, 1, 6)
    assert history.seeded and history.recommendations[-1].workers == 6
    assert history.changes[-1].change == 5
    assert with_external_change(history, policy, 51.0, 6, 6) is history  # no change, nothing recorded
