"""The application's view: ``Queue``, ``@queue.task`` and the retry backoff."""

from __future__ import annotations

import random

import pytest

from flexiqd.errors import PayloadError, TaskError
from flexiqd.queue import ClaimRequest, JobState, Queue
from flexiqd.queue.store.backoff import retry_delay

T0 = 1_700_000_000.0


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def app(tmp_path):
    queue = Queue(f"sqlite:///{tmp_path}/queue.db?synchronous=normal", clock=Clock())
    yield queue
    queue.close()


def test_the_store_opens_on_first_use_only(tmp_path):
    queue = Queue(f"sqlite:///{tmp_path}/missing/queue.db")
    queue.task(lambda: None)  # registering tasks needs no store
    assert not (tmp_path / "missing").exists()
    queue.close()


def test_tasks_register_under_their_module_path_or_a_given_name(app):
    @app.task
    def plain(x):
        return x * 2

    @app.task("mail.send", queue="mail", priority=5, max_attempts=7, timeout=3.0)
    def send(to):
        return to

    assert plain.name == f"{__name__}.test_tasks_register_under_their_module_path_or_a_given_name.<locals>.plain"
    assert plain(21) == 42  # calling runs it here
    assert set(app.tasks) == {plain.name, "mail.send"}
    with pytest.raises(TaskError, match="registered twice"):
        app.task("mail.send")(lambda to: to)


def test_enqueue_stores_the_arguments_and_the_tasks_defaults(app):
    @app.task("mail.send", queue="mail", priority=5, max_attempts=7, timeout=3.0)
    def send(to, subject=""):
        return to

    job_id = send.enqueue("a@b", subject="hi")
    job = app.get(job_id)
    assert (job.task, job.payload) == ("mail.send", {"args": ["a@b"], "kwargs": {"subject": "hi"}})
    assert (job.queue, job.priority, job.max_attempts, job.timeout, job.run_at) == ("mail", 5, 7, 3.0, T0)
    later = app.get(send.schedule(("c@d",), delay=30, priority=9, tenant="acme"))
    assert (later.run_at, later.priority, later.tenant, later.queue) == (T0 + 30, 9, "acme", "mail")
    by_name = app.get(app.enqueue("mail.send", ["e@f"], {"subject": "x"}, queue="urgent"))
    assert (by_name.queue, by_name.max_attempts, by_name.payload["args"]) == ("urgent", 7, ["e@f"])


def test_a_producer_may_enqueue_tasks_it_does_not_know(app):
    job = app.get(app.enqueue("elsewhere.task", [1], max_attempts=2))
    assert (job.task, job.queue, job.max_attempts, job.payload) == (
        "elsewhere.task", "default", 2, {"args": [1], "kwargs": {}})


def test_map_adds_one_job_per_item_all_or_none(app):
    @app.task("t")
    def t(*args):
        return args

    ids = t.map([1, (2, 3), [4]])
    assert [app.get(i).payload["args"] for i in ids] == [[1], [2, 3], [4]]
    with pytest.raises(PayloadError):
        t.map([5, object(), 6])
    assert app.stats().runnable == 3


def test_stats_and_claims_use_the_queues_clock(app):
    app.clock.now = T0 + 10
    job_id = app.enqueue("t", delay=5)
    assert (app.stats().runnable, app.stats().delayed) == (0, 1)
    assert (app.stats(horizon=4).coming_due, app.stats(horizon=5).coming_due) == (0, 1)
    app.clock.now = T0 + 15
    assert app.stats().runnable == 1
    [job] = app.backend.claim(ClaimRequest("w1", ("default",), 5), now=app.clock())
    assert job.id == job_id and job.state is JobState.RUNNING


def test_use_points_the_queue_at_another_store(app, tmp_path):
    app.enqueue("t")
    app.use(f"sqlite:///{tmp_path}/other.db")
    assert app.stats().runnable == 0
    assert app.url.endswith("other.db")


@pytest.mark.parametrize("attempt, ceiling", [(0, 1), (1, 1), (2, 2), (3, 4), (9, 256), (10, 300), (60, 300)])
def test_retry_delay_is_jittered_within_its_exponential_ceiling(attempt, ceiling):
    rng = random.Random(attempt)
    delays = [retry_delay(attempt, rng=rng) for _ in range(200)]
    assert all(0 <= d <= ceiling for d in delays)
    assert max(delays) > ceiling * 0.8 and min(delays) < ceiling * 0.2  # spread, not fixed
