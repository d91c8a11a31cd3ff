"""An application installed as docs/applications.md says, under the real systemd.

The app lives in /opt/myapp with a virtual environment made with --system-site-packages,
which the pool names with ``python:``; one task writes to a folder that only the pool's
``unit_settings`` grant.  ``flexiqd --check-config`` imports the app as the
workers' user, fails on a typo and on code in a place the sandbox hides, then passes.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from .flexiqd_install import BIN, DAEMON, REPO, STORE, install, workers
from .sandbox import Sandbox

VENV = "/opt/myapp/venv"
APP = textwrap.dedent("""
    import os
    import sys

    from flexiqd import Queue

    queue = Queue()


    @queue.task(queue="reports")
    def where() -> dict:
        return {"prefix": sys.prefix, "executable": sys.executable, "user": os.getuid()}


    @queue.task(queue="reports")
    def write_report(name: str) -> str:
        path = os.path.join("/srv/reports", name)
        with open(path, "w") as out:
            out.write("done\\n")
        return path
""")

CONFIG = f"""
store: {STORE}
tick: 500ms
pools:
  reports:
    app: myapp.tasks:queue
    python: {VENV}/bin/python
    queues: [reports]
    concurrency: 1
    min_workers: 1
    max_workers: 2
"""


def setup_application(sbx: Sandbox) -> None:
    """/opt/myapp: root's, with its own virtual environment.  flexiqd is not a Debian package in
    the sandbox: a .pth file in the environment stands for the system's dist-packages, where the
    package puts it (--system-site-packages finds the system's /usr/lib/python3/dist-packages)."""
    sbx.run(f"rm -rf /opt/myapp /srv/reports; install -d -m 0755 /opt/myapp /srv/reports; "
            f"/usr/bin/python3 -m venv --without-pip --system-site-packages {VENV}")
    site = sbx.run([f"{VENV}/bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    sbx.write_file(f"{site}/flexiqd-checkout.pth", f"{REPO}\n")
    sbx.run(f"install -d -m 0755 {site}/myapp")
    sbx.write_file(f"{site}/myapp/__init__.py", "")
    sbx.write_file(f"{site}/myapp/tasks.py", APP)


def check_config(sbx: Sandbox, text: str):
    sbx.write_file("/etc/flexiqd/check.yaml", text)
    return sbx.run([str(BIN / "flexiqd"), "--check-config", "/etc/flexiqd/check.yaml"], check=False)


def job_result(sbx: Sandbox, job: int):
    shown = json.loads(sbx.run([str(BIN / "flexiq"), "--url", STORE, "jobs", "show", str(job), "--json"]).stdout)
    return shown.get("state"), shown.get("result")


@pytest.fixture
def application(sandbox: Sandbox) -> Sandbox:
    setup_application(sandbox)
    yield sandbox
    sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*'; true", timeout=120)


def test_check_config_imports_the_app_as_the_workers_user_and_names_what_is_wrong(application):
    sbx = application
    install(sbx, CONFIG)   # the flexiq user, the units
    good = check_config(sbx, CONFIG)
    assert good.returncode == 0, good.stderr
    assert f"pool reports: app myapp.tasks:queue imports as flexiq with {VENV}/bin/python" in good.stdout
    assert "myapp.tasks.where" in good.stdout and "myapp.tasks.write_report" in good.stdout

    typo = check_config(sbx, CONFIG.replace("myapp.tasks:queue", "myapp.taks:queue"))
    assert typo.returncode == 1 and "no module named 'myapp.taks'" in typo.stderr, typo.stderr
    assert "Traceback" not in typo.stderr

    # Code in root's home: the workers' ProtectHome= hides it (and the workers' user cannot read it).
    sbx.run("install -d -m 0755 /root/code && printf 'from flexiqd import Queue\\nqueue = Queue()\\n' "
            "> /root/code/homeapp.py")
    home = check_config(sbx, CONFIG.replace("myapp.tasks:queue", "homeapp:queue")
                        + "    environment: {PYTHONPATH: /root/code}\n")
    assert home.returncode == 1 and "homeapp" in home.stderr, home.stderr

    # Code the workers' group can change: a warning, not a failure.
    sbx.run("chgrp flexiq /opt/myapp && chmod g+w /opt/myapp")
    try:
        shared = check_config(sbx, CONFIG + "    environment: {PYTHONPATH: /opt/myapp}\n")
        sbx.write_file("/opt/myapp/shared_app.py", "from flexiqd import Queue\nqueue = Queue()\n")
        shared = check_config(sbx, CONFIG.replace("myapp.tasks:queue", "shared_app:queue")
                              + "    environment: {PYTHONPATH: /opt/myapp}\n")
        assert shared.returncode == 0, shared.stderr
        assert "warning: pool reports" in shared.stderr and "/opt/myapp" in shared.stderr, shared.stderr
    finally:
        sbx.run("chgrp root /opt/myapp && chmod g-w /opt/myapp")


def test_a_pool_runs_its_virtual_environment_and_its_unit_settings_grant_it_a_folder(application):
    sbx = application
    install(sbx, CONFIG)
    sbx.run("chown flexiq:flexiq /srv/reports")   # the workers' data folder: theirs to write
    sbx.wait_for(lambda: len(workers(sbx)) == 1, 30, what="the pool's first worker")
    unit = workers(sbx)[0]
    assert f"{VENV}/bin/python" in sbx.run(["systemctl", "show", unit, "-p", "ExecStart"]).stdout
    job = int(sbx.run([str(BIN / "flexiq"), "--url", STORE, "enqueue", "myapp.tasks.where", "--queue",
                       "reports"]).stdout.split()[-1])
    sbx.wait_for(lambda: job_result(sbx, job)[0] == "done", 30, what="the where job")
    assert job_result(sbx, job)[1]["prefix"] == VENV

    # Without the grant the sandbox refuses the write (ProtectSystem=strict): the job fails.
    refused = int(sbx.run([str(BIN / "flexiq"), "--url", STORE, "enqueue", "myapp.tasks.write_report", '"a"',
                           "--queue", "reports", "--max-attempts", "1"]).stdout.split()[-1])
    sbx.wait_for(lambda: job_result(sbx, refused)[0] == "dead", 30, what="the refused write to fail")
    assert sbx.run("test -e /srv/reports/a", check=False).returncode != 0

    # The grant, for this pool alone: its unit_settings, applied by a reload to the workers
    # started after it (a running process keeps its namespace).
    sbx.write_file("/etc/flexiqd/flexiqd.yaml", CONFIG + "    unit_settings: {ReadWritePaths: /srv/reports}\n")
    sbx.systemctl("reload", DAEMON)
    sbx.wait_for(lambda: "ReadWritePaths=/srv/reports" in sbx.run(["systemctl", "cat", unit]).stdout, 30,
                 what="the grant in the pool's drop-in")
    sbx.run(["systemctl", "restart", unit])
    sbx.wait_for(lambda: sbx.unit_property(unit, "ActiveState") == "active", 30, what="the restarted worker")
    granted = int(sbx.run([str(BIN / "flexiq"), "--url", STORE, "enqueue", "myapp.tasks.write_report", '"b"',
                           "--queue", "reports"]).stdout.split()[-1])
    sbx.wait_for(lambda: job_result(sbx, granted)[0] == "done", 30, what="the granted write")
    assert sbx.run("cat /srv/reports/b").stdout == "done\n"
    assert "/srv/reports" in sbx.unit_property(unit, "ReadWritePaths")
