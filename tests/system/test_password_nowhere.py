"""A password written into the store URL appears in nothing flexiqd shows, under the real
systemd on the sandbox's PostgreSQL: every D-Bus property, method reply and signal, the
HTTP endpoints, the journal (every field), STATUS=, the units' properties and command
lines, and the CLI's output and error messages -- including a reload refused because the
store changed, whose message names both URLs."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from .flexiqd_install import BIN, CONFIG, DAEMON, STORE, install, workers
from .sandbox import Sandbox
from .sandbox_postgres import DATABASE, start_postgres
from .test_metrics_systemd import fetch, free_port

PASSWORD = "pw-in-the-url-s3cret"
URL = f"postgresql://flexiq:{PASSWORD}@127.0.0.1:5432/{DATABASE}"
MOVED = f"postgresql://flexiq:{PASSWORD}@localhost:5432/{DATABASE}"  # the refused reload's store
WRONG = f"postgresql://flexiq:{PASSWORD}-wrong@127.0.0.1:5432/{DATABASE}"
BUS = ["org.flexiq.flexiqd1", "/org/flexiq/flexiqd1"]
MANAGER = "org.flexiq.flexiqd1.Manager"
NOBODY = ["runuser", "-u", "nobody", "--"]


@pytest.fixture
def daemon(sandbox: Sandbox):
    start_postgres(sandbox, PASSWORD)
    port = free_port()
    config = (CONFIG.replace(f"store: {STORE}", f"store: '{URL}'")
              + f"http: {{listen: '127.0.0.1:{port}'}}\n")
    install(sandbox, config)
    sandbox.wait_for(lambda: workers(sandbox), 30, what="the minimum worker")
    yield sandbox, config, port
    sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*' 2>/dev/null; true", timeout=120)


def busctl(sbx: Sandbox, *args: str, user: list[str] | None = None) -> str:
    done = sbx.run([*(user or []), "busctl", "--json=short", *args], check=False)
    return done.stdout + done.stderr


def test_a_password_in_the_store_url_is_shown_nowhere(daemon):
    sbx, config, port = daemon
    seen: dict[str, str] = {}

    def look(face: str, command, **kwargs) -> str:
        done = sbx.run(command, check=False, **kwargs)
        seen[face] = done.stdout + done.stderr
        return seen[face]

    # The CLI, on its happy path and with a password that is wrong.
    look("flexiq enqueue", [str(BIN / "flexiq"), "--url", URL, "enqueue", "count", "0.2", "--count", "20"])
    look("flexiq stats", [str(BIN / "flexiq"), "--url", URL, "stats"])
    failed = look("flexiq with a wrong password", [str(BIN / "flexiq"), "--url", WRONG, "stats"])
    assert "password authentication failed" in failed
    look("flexiqd --check-config", [str(BIN / "flexiqd"), "--check-config"])
    sbx.wait_for(lambda: "done" in sbx.run([str(BIN / "flexiq"), "--url", URL, "jobs", "list",
                                           "--state", "done"]).stdout, 60, what="a job done")

    # Every signal the daemon sends while a reload that changes the store is refused.
    monitor = subprocess.Popen(
        ["nsenter", "-t", str(sbx.leader), "-a", "--", "timeout", "8", "busctl", "monitor", "--json=short",
         "--match", "type='signal',sender='org.flexiq.flexiqd1'"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(1.0)  # the monitor is subscribed
        sbx.write_file("/etc/flexiqd/flexiqd.yaml", config.replace(URL, MOVED))
        look("flexiqctl reload", [str(BIN / "flexiqctl"), "reload"])
        refusal = sbx.wait_for(lambda: json.loads(sbx.run(
            [str(BIN / "flexiqctl"), "status", "--json"]).stdout).get("config_error"), 30,
            what="the refused reload in Status")
        assert "'store' changed" in refusal and "flexiq:***@localhost" in refusal
    finally:
        seen["D-Bus signals"] = monitor.communicate(timeout=30)[0]  # ends after its 8 s
    assert "ConfigReloaded" in seen["D-Bus signals"] and "PropertiesChanged" in seen["D-Bus signals"]

    # D-Bus: every property of every object, every read-only method, as anyone; the jobs' own
    # methods as root.
    managed = look("D-Bus GetManagedObjects", ["busctl", "--json=short", "call", *BUS,
                                               "org.freedesktop.DBus.ObjectManager", "GetManagedObjects"])
    assert "ActiveWorkers" in managed
    for user, who in ((None, "root"), (NOBODY, "nobody")):
        seen[f"D-Bus manager properties ({who})"] = busctl(
            sbx, "call", *BUS, "org.freedesktop.DBus.Properties", "GetAll", "s", MANAGER, user=user)
        seen[f"D-Bus Status ({who})"] = busctl(sbx, "call", *BUS, MANAGER, "Status", user=user)
        seen[f"D-Bus Events ({who})"] = busctl(sbx, "call", *BUS, MANAGER, "Events", "t", "0", user=user)
        seen[f"D-Bus History ({who})"] = busctl(sbx, "call", *BUS, MANAGER, "History", "sd", "default", "0",
                                                user=user)
        seen[f"D-Bus Introspect ({who})"] = busctl(sbx, "introspect", *BUS, user=user)
        seen[f"D-Bus pool properties ({who})"] = busctl(
            sbx, "call", "org.flexiq.flexiqd1", "/org/flexiq/flexiqd1/pool/default",
            "org.freedesktop.DBus.Properties", "GetAll", "s", "org.flexiq.flexiqd1.Pool", user=user)
    page = busctl(sbx, "call", *BUS, MANAGER, "Jobs", "s", "{}")
    seen["D-Bus Jobs"] = page
    first = json.loads(json.loads(page)["data"][0])["jobs"][0]["id"]
    seen["D-Bus Job"] = busctl(sbx, "call", *BUS, MANAGER, "Job", "t", str(first))
    seen["D-Bus bad call"] = busctl(sbx, "call", *BUS, MANAGER, "Scale", "sud", "nosuchpool", "3", "0")
    assert "InvalidArgs" in seen["D-Bus bad call"] or "nosuchpool" in seen["D-Bus bad call"]

    # The command-line faces of the daemon.
    for user, who in ((None, "root"), (NOBODY, "nobody")):
        for args in (["status"], ["status", "--json"], ["events"]):
            look(f"flexiqctl {' '.join(args)} ({who})", [*(user or []), str(BIN / "flexiqctl"), *args])
    look("flexiqctl bad argument", [str(BIN / "flexiqctl"), "scale", "nosuchpool", "3"])

    # HTTP.
    for path in ("/metrics", "/api/scaler?queue=default", "/health"):
        seen[f"HTTP {path}"] = " ".join(map(str, fetch(sbx, port, path, token=False)))
    assert "flexiq" in seen["HTTP /metrics"]

    # systemd: STATUS=, the units' every property, every process's command line, the journal.
    look("systemctl status", ["systemctl", "status", "--no-pager", "-l", DAEMON])
    assert "'store' changed" in seen["systemctl status"]  # STATUS= says the reload was refused
    look("systemctl show", ["systemctl", "show", DAEMON, *workers(sbx)])
    look("command lines", ["ps", "-eo", "args"])
    look("journal", ["journalctl", "--no-pager", "-o", "verbose", "-u", DAEMON, "-u", "flexiq-worker@*"])
    assert "'store' changed" in seen["journal"]

    assert all(seen.values()), [face for face, text in seen.items() if not text]
    shown = [face for face, text in seen.items() if PASSWORD in text]
    assert not shown, f"the password appears in: {', '.join(shown)}"
