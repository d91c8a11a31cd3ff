"""The app check: a pool's app imported in a child process as its workers would, and what is found."""

from __future__ import annotations

import os
import stat
import sys
import textwrap
import types

from flexiqd.apps.check import WorkerIdentity, probe_pool
from flexiqd.apps.findings import ScheduleNeed, app_findings, hidden_files, writable_findings
from flexiqd.cli import daemon as flexiqd_cli
from flexiqd.config import load_config
from flexiqd.fleet.base import WorkerSpec
from flexiqd.fleet.dropin import dropin_text

ME = WorkerIdentity("me", os.getuid(), (os.getgid(),), False)


def _config(tmp_path, app: str, extra: str = ""):
    path = tmp_path / "flexiqd.yaml"
    # The process fleet: no sandbox hides tmp_path (under /tmp) from its workers.
    path.write_text(f"store: sqlite:///{tmp_path}/q.db\nfleet: process\n{extra}pools:\n  default:\n    app: {app}\n"
                    f"    queues: [mail]\n    environment: {{PYTHONPATH: {tmp_path}/code}}\n")
    return path


def _module(tmp_path, name: str, text: str) -> None:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / f"{name}.py").write_text(textwrap.dedent(text))


def test_an_app_that_imports_reports_its_tasks_and_files(tmp_path):
    _module(tmp_path, "goodapp", """
        from flexiqd import Queue
        queue = Queue()
        @queue.task(queue="mail")
        def send(to): pass
    """)
    config = load_config(str(_config(tmp_path, "goodapp:queue")))
    probe = probe_pool(config.pools["default"], fleet="process", identity=ME)
    assert probe.error is None
    assert probe.tasks == {"goodapp.send": "mail"}
    assert str(tmp_path / "code" / "goodapp.py") in probe.files


def test_each_way_an_app_fails_to_load_is_named(tmp_path):
    _module(tmp_path, "raising", "raise RuntimeError('no settings file')\n")
    _module(tmp_path, "notaqueue", "queue = 42\n")
    _module(tmp_path, "needsmissing", "import requests_not_installed\n")
    cases = {"nosuchmodule:queue": "no module named 'nosuchmodule'",
             "raising:queue": "RuntimeError: no settings file",
             "notaqueue:queue": "queue is a int, not a flexiqd.Queue",
             "notaqueue:other": "has no attribute 'other'",
             "needsmissing:queue": "requests_not_installed"}
    for app, expected in cases.items():
        config = load_config(str(_config(tmp_path, app)))
        probe = probe_pool(config.pools["default"], fleet="process", identity=ME)
        assert probe.error is not None and expected in probe.error, (app, probe.error)
        assert "Traceback" not in probe.error


def test_a_python_that_cannot_import_flexiqd_says_how_to_make_the_environment(tmp_path):
    import venv

    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(tmp_path / "venv")
    _module(tmp_path, "goodapp", "from flexiqd import Queue\nqueue = Queue()\n")
    config = load_config(str(_config(tmp_path, "goodapp:queue").parent / "flexiqd.yaml"))
    pool = config.pools["default"]
    import dataclasses

    pool = dataclasses.replace(pool, python=str(tmp_path / "venv" / "bin" / "python"))
    env_without_path = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    old = os.environ.copy()
    try:
        os.environ.clear()
        os.environ.update(env_without_path)
        probe = probe_pool(pool, fleet="systemd", identity=ME)
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert probe.error is not None and "--system-site-packages" in probe.error, probe.error


def test_check_config_fails_naming_the_pool_and_the_missing_module(tmp_path, capsys):
    path = _config(tmp_path, "typoapp:queue")
    assert flexiqd_cli.main(["--check-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "pool default: app typoapp:queue: no module named 'typoapp'" in err and "Traceback" not in err


def test_check_config_passes_once_the_app_and_the_schedule_task_are_there(tmp_path, capsys):
    schedules = "schedules: {nightly: {task: reports.nightly, cron: '0 2 * * *', queue: mail}}\n"
    _module(tmp_path, "reports", """
        from flexiqd import Queue
        queue = Queue()
    """)
    path = _config(tmp_path, "reports:queue", schedules)
    assert flexiqd_cli.main(["--check-config", str(path)]) == 1
    assert "schedule nightly enqueues task reports.nightly to queue mail" in capsys.readouterr().err
    _module(tmp_path, "reports", """
        from flexiqd import Queue
        queue = Queue()
        @queue.task(queue="mail")
        def nightly(): pass
    """)
    assert flexiqd_cli.main(["--check-config", str(path)]) == 0
    assert "tasks: reports.nightly" in capsys.readouterr().out


def test_code_the_sandbox_hides_is_an_error_naming_the_directive():
    found = hidden_files(["/home/alice/app/tasks.py", "/opt/app/tasks.py", "/tmp/x.py", "/root/a.py"])
    assert found == [("/home/alice/app/tasks.py", "ProtectHome="), ("/tmp/x.py", "PrivateTmp="),
                     ("/root/a.py", "ProtectHome=")]
    findings = app_findings("web", "app:queue", None, {}, ["/home/alice/app/tasks.py"], ("default",), [])
    assert [f.severity for f in findings] == ["error"] and "ProtectHome=" in findings[0].text


def test_a_schedule_on_a_queue_the_pool_does_not_serve_needs_nothing_of_it():
    need = ScheduleNeed("nightly", "reports.nightly", "reports")
    assert app_findings("web", "app:queue", None, {}, [], ("default",), [need]) == []
    assert len(app_findings("web", "app:queue", None, {}, [], ("default", "reports"), [need])) == 1


def _stat(modes: dict):
    def stat_of(path):
        uid, gid, mode = modes.get(path, (0, 0, stat.S_IFDIR | 0o755))
        return types.SimpleNamespace(st_uid=uid, st_gid=gid, st_mode=mode)
    return stat_of


def test_code_the_workers_group_can_change_is_a_warning_naming_the_topmost_place():
    worker_uid, group = 999, 998
    modes = {"/opt/app": (0, group, stat.S_IFDIR | 0o775),                 # group-writable directory
             "/opt/app/pkg/tasks.py": (0, group, stat.S_IFREG | 0o664)}     # and a file under it
    found = writable_findings("web", ["/opt/app/pkg/tasks.py"], worker_uid, (group,), "group flexiq",
                              stat_of=_stat(modes))
    assert len(found) == 1 and found[0].severity == "warning"
    assert "/opt/app," in found[0].text and "/opt/app/pkg/tasks.py" not in found[0].text


def test_root_owned_code_and_sticky_directories_raise_no_warning():
    modes = {"/srv/shared": (0, 0, stat.S_IFDIR | stat.S_ISVTX | 0o777),
             "/srv/shared/tasks.py": (0, 0, stat.S_IFREG | 0o644)}
    assert writable_findings("web", ["/srv/shared/tasks.py", "/usr/lib/python3/dist-packages/x.py"], 999, (998,),
                             "group flexiq", stat_of=_stat(modes)) == []


def test_code_owned_by_the_workers_user_is_a_warning_whatever_its_mode():
    modes = {"/opt/app/tasks.py": (999, 0, stat.S_IFREG | 0o444)}
    assert len(writable_findings("web", ["/opt/app/tasks.py"], 999, (998,), "flexiq", stat_of=_stat(modes))) == 1


def test_a_pools_python_replaces_the_workers_command_line():
    spec = WorkerSpec(pool="web", app="app:queue", queues=("default",), concurrency=1, drain_timeout=5,
                      lease_seconds=30, store_url="sqlite:///q.db", python="/opt/app/venv/bin/python")
    lines = dropin_text(spec).splitlines()
    at = lines.index("ExecStart=")
    assert lines[at + 1] == "ExecStart=/opt/app/venv/bin/python -m flexiqd.cli.flexiq worker --instance %i"
    plain = dropin_text(WorkerSpec(pool="web", app="app:queue", queues=("default",), concurrency=1,
                                   drain_timeout=5, lease_seconds=30, store_url="sqlite:///q.db"))
    assert "ExecStart" not in plain


def test_a_python_that_is_not_a_plain_absolute_path_is_refused(tmp_path):
    import pytest

    from flexiqd.errors import ConfigError

    for bad in ("venv/bin/python", "/opt/my app/python", "/opt/%n/python", 3):
        path = tmp_path / "c.yaml"
        path.write_text(f"pools: {{web: {{python: {bad!r}}}}}\n" if isinstance(bad, str)
                        else f"pools: {{web: {{python: {bad}}}}}\n")
        with pytest.raises(ConfigError, match=r"pools\.web\.python"):
            load_config(str(path))


def test_a_pools_unit_settings_reach_its_drop_in_and_flexiqds_own_are_refused(tmp_path):
    import pytest

    from flexiqd.errors import ConfigError

    path = tmp_path / "c.yaml"
    path.write_text("pools: {reports: {unit_settings: {ReadWritePaths: [/srv/reports, /srv/100%], "
                    "PrivateNetwork: true, LimitNOFILE: 65536}}}\n")
    pool = load_config(str(path)).pools["reports"]
    lines = dropin_text(pool.worker_spec("sqlite:///q.db")).splitlines()
    assert "ReadWritePaths=/srv/reports" in lines and "ReadWritePaths=/srv/100%%" in lines
    assert "PrivateNetwork=yes" in lines and "LimitNOFILE=65536" in lines
    for bad, why in (("{User: root}", "set by flexiqd itself"), ("{TimeoutStopSec: 1}", "set by flexiqd itself"),
                     ("{readwritepaths: /x}", "not a systemd setting name"),
                     ("{ReadWritePaths: {a: 1}}", "a value or a list of values"),
                     ('{ReadWritePaths: "/x\\nUser=root"}', "control characters")):
        path.write_text(f"pools: {{reports: {{unit_settings: {bad}}}}}\n")
        with pytest.raises(ConfigError, match=why) as raised:
            load_config(str(path))
        assert "pools.reports.unit_settings." in str(raised.value)
