"""The KEDA answer (/api/scaler): flexiq's fields, running jobs counted, drain time."""

from __future__ import annotations

import asyncio
import json

import pytest

from flexiqd.http.routes import store_routes
from flexiqd.http.scaler import scaler_answer, scaler_selection
from flexiqd.http.server import HttpError, Request
from flexiqd.queue import ClaimRequest, NewJob

from test_http_metrics import stats

T0 = 1_700_000_000.0


def test_pending_only_counts_the_runnable_jobs_and_drains_at_the_completion_rate():
    answer = scaler_answer([stats(runnable=30, completion_rate=3.0, oldest_runnable_age=4.0)],
                           target=15, name="default")
    assert answer["metricValue"] == 30 and answer["targetValue"] == 15 and answer["queueName"] == "default"
    assert answer["timeToDrainSeconds"] == 10.0 and answer["timeToDrainKnown"] is True
    assert answer["oldestRunnableAgeSeconds"] == 4.0


def test_running_only_keeps_the_metric_above_zero_so_keda_never_scales_to_zero_under_work():
    answer = scaler_answer([stats(running=2)], target=15, name="default")
    assert answer["metricValue"] == 2 and answer["runnable"] == 0
    assert answer["timeToDrainSeconds"] == 0.0


def test_delayed_only_asks_for_nothing_yet_but_says_they_are_there():
    answer = scaler_answer([stats(delayed=40)], target=15, name="default")
    assert answer["metricValue"] == 0 and answer["delayed"] == 40


def test_empty():
    answer = scaler_answer([stats()], target=15, name="*")
    assert (answer["metricValue"], answer["queueName"], answer["timeToDrainSeconds"]) == (0, "*", 0.0)


def test_nothing_completing_reports_the_growing_age_as_the_drain_time():
    answer = scaler_answer([stats(runnable=5, oldest_runnable_age=42.0)], target=15, name="q")
    assert answer["timeToDrainSeconds"] == 42.0 and answer["timeToDrainKnown"] is False


def test_several_queues_add_up():
    answer = scaler_answer([stats("a", runnable=4, running=1, completion_rate=1.0, oldest_runnable_age=3.0),
                            stats("b", runnable=6, running=2, completion_rate=1.0, oldest_runnable_age=9.0)],
                           target=5, name="a,b", pool="p")
    assert answer["metricValue"] == 13 and answer["timeToDrainSeconds"] == 5.0
    assert answer["oldestRunnableAgeSeconds"] == 9.0 and answer["poolName"] == "p"


def select(query):
    return scaler_selection(query, pool_queues={"web": ("a", "b")}.get, all_queues=["a", "b", "c"],
                            known_queue={"a", "b", "c"}.__contains__)


def test_selection():
    assert select({}) == (["a", "b", "c"], "*", None)
    assert select({"queue": "c"}) == (["c"], "c", None)
    assert select({"pool": "web"}) == (["a", "b"], "a,b", "web")


@pytest.mark.parametrize("query, status", [
    ({"queue": "zzz"}, 404), ({"pool": "zzz"}, 404), ({"queue": ""}, 404),
    ({"queue": "a", "pool": "web"}, 400), ({"queues": "a"}, 400)])
def test_bad_selections(query, status):
    with pytest.raises(HttpError) as caught:
        select(query)
    assert caught.value.status == status


def ask(routes, **query):
    try:
        response = asyncio.run(routes["/api/scaler"].handler(Request("GET", "/api/scaler", query, {})))
    except HttpError as exc:
        return exc.status, {"error": exc.message}
    return response.status, json.loads(response.body)


def test_the_store_endpoint_answers_from_the_store(backend):
    backend.enqueue([NewJob(task="t", queue="mail")] * 3 + [NewJob(task="t", queue="mail", delay=600)],
                    now=T0)
    backend.enqueue([NewJob(task="t", queue="other")] * 2, now=T0)
    backend.claim(ClaimRequest(owner="w", queues=("other",), limit=1), now=T0)
    routes = store_routes(backend, 15, None, clock=lambda: T0 + 5)
    status, answer = ask(routes, queue="mail")
    assert status == 200 and (answer["metricValue"], answer["delayed"]) == (3, 1)
    assert answer["oldestRunnableAgeSeconds"] == 5.0
    status, answer = ask(routes)
    assert answer["metricValue"] == 5 and answer["running"] == 1 and answer["queueName"] == "*"
    assert ask(routes, queue="unknown")[1]["metricValue"] == 0  # any queue: an empty one is 0


def test_the_store_endpoint_limited_to_some_queues_refuses_others(backend):
    routes = store_routes(backend, 15, ("mail",), clock=lambda: T0)
    assert ask(routes, queue="other")[0] == 404
    assert ask(routes)[1]["queueName"] == "*"
