"""An enqueue by name keeps the task's declaration, on every store (conftest.BACKENDS).

The workers write what their tasks declare (queue, priority, attempts, timeout) to the
store; a producer without their code -- ``queue.enqueue("name")``, ``flexiq enqueue`` --
gets it for the options it does not give, and the defaults where no worker declared.
"""

from __future__ import annotations

import logging

from flexiqd.cli.flexiq import main as flexiq_main
from flexiqd.queue import ClaimRequest, NewJob, Queue
from flexiqd.queue.declarations import TaskDeclaration, by_name, declarations_of
from flexiqd.worker.main import publish_declarations

T0 = 1_700_000_000.0
MAIL = TaskDeclaration(task="mail.send", queue="mail", priority=5, max_attempts=7, timeout=30.0)


def workers_app() -> Queue:
    """The workers' application: the code a producer does not have."""
    app = Queue("sqlite:///unused.db")

    @app.task("mail.send", queue="mail", priority=5, max_attempts=7, timeout=30.0)
    def send(to):
        return to

    @app.task("report.build", queue="reports")
    def build():
        return None

    return app


def producer(backend) -> Queue:
    """A producer's Queue on the same store, with no task registered."""
    queue = Queue(backend.url, clock=lambda: T0)
    queue.use(backend.url, backend=backend)
    return queue


def only_job(backend):
    jobs = backend.list_jobs(limit=10)
    assert len(jobs) == 1
    return jobs[0]


def test_a_worker_publishes_its_tasks_declarations(backend):
    publish_declarations(workers_app(), backend, "default-1")
    known = backend.task_declarations()
    assert set(known) == {"mail.send", "report.build"}
    mail = known["mail.send"]
    assert (mail.queue, mail.priority, mail.max_attempts, mail.timeout) == ("mail", 5, 7, 30.0)
    assert mail.declared_by == "default-1" and mail.declared_at is not None
    assert known["report.build"].options() == {"queue": "reports", "priority": 0, "max_attempts": 3,
                                               "timeout": None}
    assert backend.task_declarations(["mail.send", "nobody.declared"]).keys() == {"mail.send"}


def test_enqueue_by_name_takes_the_declared_options(backend):
    publish_declarations(workers_app(), backend, "default-1")
    job_id = producer(backend).enqueue("mail.send", ["a@example.org"])
    job = backend.get(job_id)
    assert (job.queue, job.priority, job.max_attempts, job.timeout) == ("mail", 5, 7, 30.0)
    assert job.payload == {"args": ["a@example.org"], "kwargs": {}}
    # Counted in the declared queue, where a worker claims it.
    assert backend.stats("mail", now=T0).runnable == 1
    assert backend.stats("default", now=T0).runnable == 0
    claimed = backend.claim(ClaimRequest(owner="w1", queues=("mail",), limit=5, lease_seconds=30), now=T0)
    assert [j.id for j in claimed] == [job_id]


def test_explicit_options_override_the_declaration(backend):
    publish_declarations(workers_app(), backend, "default-1")
    job_id = producer(backend).enqueue("mail.send", ["b"], queue="urgent", priority=9, timeout=None)
    job = backend.get(job_id)
    assert (job.queue, job.priority, job.max_attempts, job.timeout) == ("urgent", 9, 7, None)


def test_a_task_nobody_declared_gets_the_defaults(backend):
    job = backend.get(producer(backend).enqueue("never.declared", [1]))
    assert (job.queue, job.priority, job.max_attempts, job.timeout) == ("default", 0, 3, None)


def test_a_registered_task_keeps_its_own_options_whatever_the_store_says(backend):
    backend.declare_tasks([TaskDeclaration("mail.send", "elsewhere", 1, 1, 1.0)], by="old-1", now=T0)
    app = workers_app()
    app.use(backend.url, backend=backend)
    job = backend.get(app.tasks["mail.send"].enqueue("c"))
    assert (job.queue, job.priority, job.max_attempts, job.timeout) == ("mail", 5, 7, 30.0)


def test_the_declaration_written_last_wins_and_an_unchanged_one_is_left_alone(backend):
    assert backend.declare_tasks([MAIL], by="v1-1", now=T0) == 1
    assert backend.declare_tasks([MAIL], by="v1-2", now=T0 + 5) == 0  # unchanged: not rewritten
    stored = backend.task_declarations(["mail.send"])["mail.send"]
    assert (stored.declared_by, stored.declared_at) == ("v1-1", T0)
    v2 = TaskDeclaration(task="mail.send", queue="mail2", priority=1, max_attempts=2, timeout=None)
    assert backend.declare_tasks([v2], by="v2-1", now=T0 + 10) == 1
    stored = backend.task_declarations()["mail.send"]
    assert stored.options() == v2.options() and stored.declared_by == "v2-1"
    assert backend.get(producer(backend).enqueue("mail.send")).queue == "mail2"


def test_a_batch_mixes_declared_given_and_undeclared_jobs(backend):
    backend.declare_tasks([MAIL], by="w", now=T0)
    ids = backend.enqueue([by_name("mail.send", None, {}), by_name("mail.send", None, {"priority": 2}),
                           by_name("other", None, {}), NewJob(task="mail.send")], now=T0)
    jobs = [backend.get(job_id) for job_id in ids]
    assert [(j.queue, j.priority, j.max_attempts) for j in jobs] == [
        ("mail", 5, 7), ("mail", 2, 7), ("default", 0, 3),
        ("default", 0, 3)]  # a NewJob of its own says every option: nothing is taken
    assert backend.stats("mail", now=T0).runnable == 2 and backend.stats("default", now=T0).runnable == 2


def test_declarations_of_an_app_are_its_registered_tasks():
    names = [(d.task, d.queue, d.priority, d.max_attempts, d.timeout) for d in declarations_of(workers_app().tasks)]
    assert names == [("mail.send", "mail", 5, 7, 30.0), ("report.build", "reports", 0, 3, None)]


def test_a_worker_that_cannot_write_declarations_logs_and_goes_on(caplog):
    class ReadOnly:
        url = "sqlite:///ro.db"

        def declare_tasks(self, declared, *, by, now):
            from flexiqd.errors import StoreUnavailable
            raise StoreUnavailable("the queue database ro.db is read-only")

    with caplog.at_level(logging.WARNING):
        publish_declarations(workers_app(), ReadOnly(), "default-1")
    assert "could not write its tasks' declarations" in caplog.text and "read-only" in caplog.text


# -- flexiq enqueue ----------------------------------------------------------------------------

def test_flexiq_enqueue_takes_the_declaration(backend, capsys, monkeypatch):
    url = cli_url(backend, monkeypatch)
    backend.declare_tasks([MAIL], by="w", now=T0)
    assert flexiq_main(["--url", url, "enqueue", "mail.send", '"x"']) == 0
    out, err = capsys.readouterr()
    job = backend.get(int(out.strip()))
    assert (job.queue, job.priority, job.max_attempts, job.timeout) == ("mail", 5, 7, 30.0)
    assert "declared" not in err
    assert flexiq_main(["--url", url, "enqueue", "mail.send", "--queue", "q2", "--max-attempts", "1"]) == 0
    job = backend.get(int(capsys.readouterr().out.strip()))
    assert (job.queue, job.priority, job.max_attempts) == ("q2", 5, 1)


def test_flexiq_enqueue_says_when_the_defaults_apply(backend, capsys, monkeypatch):
    url = cli_url(backend, monkeypatch)
    assert flexiq_main(["--url", url, "enqueue", "nobody.knows", "--priority", "4"]) == 0
    out, err = capsys.readouterr()
    job = backend.get(int(out.strip()))
    assert (job.queue, job.priority, job.max_attempts) == ("default", 4, 3)
    assert "no worker has declared task nobody.knows" in err
    assert "queue default, max_attempts 3, timeout none (the defaults)" in err
    assert "priority" not in err  # given, so no default applied to it


def cli_url(backend, monkeypatch) -> str:
    """The store's URL for the CLI (the test server's own, password-free)."""
    monkeypatch.delenv("FLEXIQ_URL", raising=False)
    return backend.url


# -- the daemon writes what its pools' apps declare (before any worker starts) ---------------

def test_the_daemons_app_check_writes_the_declarations_a_worker_would(backend, tmp_path):
    import os
    import textwrap

    from flexiqd.apps.check import WorkerIdentity, probe_pool
    from flexiqd.config import load_config
    from flexiqd.daemon.declarations import publish_declarations as daemon_publishes

    code = tmp_path / "code"
    code.mkdir()
    (code / "shop.py").write_text(textwrap.dedent("""
        from flexiqd import Queue
        queue = Queue()
        @queue.task("mail.send", queue="mail", priority=5, max_attempts=7, timeout=30)
        def send(to): pass
    """))
    (code / "broken.py").write_text("raise RuntimeError('no settings')\n")
    path = tmp_path / "flexiqd.yaml"
    path.write_text(f"store: sqlite:///{tmp_path}/q.db\nfleet: process\npools:\n"
                    f"  shop:\n    app: shop:queue\n    queues: [mail]\n    environment: {{PYTHONPATH: {code}}}\n"
                    f"  broken:\n    app: broken:queue\n    environment: {{PYTHONPATH: {code}}}\n")
    config = load_config(str(path))
    me = WorkerIdentity("me", os.getuid(), (os.getgid(),), False)
    probes = [probe_pool(config.pools[name], fleet="process", identity=me) for name in ("broken", "shop")]
    assert probes[0].error and probes[1].declared == (MAIL,)
    assert daemon_publishes(backend, probes, now=T0) == 1
    stored = backend.task_declarations()
    assert list(stored) == ["mail.send"] and stored["mail.send"].options() == MAIL.options()
    assert stored["mail.send"].declared_by == "flexiqd (pool shop)"
    assert daemon_publishes(backend, probes, now=T0 + 1) == 0  # unchanged: not written again
    assert backend.get(producer(backend).enqueue("mail.send", ["x"])).queue == "mail"


def test_flexiq_tasks_lists_the_declarations_and_names_the_undeclared(backend, capsys, monkeypatch):
    import json

    url = cli_url(backend, monkeypatch)
    assert flexiq_main(["--url", url, "tasks"]) == 0
    assert capsys.readouterr().out == ""  # none yet, and none asked for by name
    publish_declarations(workers_app(), backend, "default-1")
    assert flexiq_main(["--url", url, "tasks"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["TASK", "QUEUE", "PRIORITY", "ATTEMPTS", "TIMEOUT", "DECLARED", "BY", "SINCE"]
    assert lines[1].split()[:6] == ["mail.send", "mail", "5", "7", "30.0s", "default-1"]
    assert lines[2].split()[:6] == ["report.build", "reports", "0", "3", "none", "default-1"]
    assert flexiq_main(["--url", url, "tasks", "mail.send", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert list(document) == ["mail.send"] and document["mail.send"]["max_attempts"] == 7
    assert flexiq_main(["--url", url, "tasks", "mail.send", "nobody.knows"]) == 1
    out, err = capsys.readouterr()
    assert "mail.send" in out and "no worker has declared task nobody.knows" in err
