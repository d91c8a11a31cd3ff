"""Fault: the disk under the SQLite store fills up, then frees; then the kernel remounts it
read-only (issue 24, fault 2).

The store lives on a small ext4 (a loop device, ``errors=remount-ro``) mounted over
/var/lib/flexiq in the sandbox before flexiqd starts; the jobs' marks are kept off it
(/var/lib/flexiq-worker), so only the store meets the fault.  Under a steady load of jobs
that record their executions, the test:

1. fills the disk (``dd`` until ENOSPC), tries a large enqueue, frees the disk;
2. makes ext4 remount itself read-only, as it does on an I/O error (``trigger_fs_error``
   in sysfs: the journal is aborted, the file system is read-only for good).  An
   operator's ``mount -o remount,ro`` is refused while the store is open for writing, so
   this is how a store's disk turns read-only under a running flexiqd.  Leaving that
   state takes an unmount and an fsck, so the operator's way back follows: stop flexiqd
   and the workers, ``e2fsck``, mount, start flexiqd.

What must hold, and what is measured (printed; ``pytest -s``):
- an enqueue that meets the fault fails in one line naming the disk and the store, no
  traceback, and commits none of its jobs;
- nothing committed is lost; while the disk is full no job runs twice (workers keep
  what they hold and settle it once there is room); after the read-only disk, re-runs
  only of jobs whose results the workers could not record before they were stopped,
  at most ``RERUN_BOUND`` per worker;
- workers claim nothing while the disk is read-only; after the full disk everything
  resumes by itself;
- the daemon stays up (until the operator stops it) and says why in STATUS=,
  ``flexiqctl status`` and the journal;
- the time from the disk's return to the first job completed again.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time

import pytest

from .executions import judge
from .faults import (_WORKER_CUT, RERUN_BOUND, Load, Watch, config, completed_jobs, cut_workers, executions,
                     journal_entries, start_limit_hits, wait_all_done, worker_restarts)
from .flexiqd_install import BIN, DAEMON, STORE, install, workers
from .sandbox import Sandbox

DISK = "/var/lib/flexiq"
DB = f"{DISK}/queue.db"
MARKS = "/var/lib/flexiq-worker/marks"  # off the small disk: the fault is the store's alone
FULL_MESSAGE_ID = "a4db2ae382bb4a26a7204a0a3ecd55f6"

CONFIG = config(STORE, max_workers=3, marks=MARKS)


class SmallDisk:
    """A 32 MiB ext4 image on a loop device of this machine, to mount in the sandbox."""

    def __init__(self) -> None:
        fd, self.image = tempfile.mkstemp(prefix="flexiq-disk-", suffix=".img", dir="/var/tmp")
        os.close(fd)
        self.device: str | None = None
        try:
            subprocess.run(["truncate", "-s", "32M", self.image], check=True)
            subprocess.run(["mkfs.ext4", "-q", "-F", self.image], check=True)
            self.device = subprocess.run(["losetup", "-f", "--show", self.image], check=True,
                                         capture_output=True, text=True).stdout.strip()
        except BaseException:
            self.remove()
            raise

    @property
    def name(self) -> str:
        return os.path.basename(self.device or "")

    def mount_script(self) -> str:
        """Inside the sandbox: the device node, the mount, the folders as tmpfiles.d made them."""
        rdev = os.stat(self.device).st_rdev
        return f"""
rm -f /dev/flexiq-disk; mknod -m 0600 /dev/flexiq-disk b {os.major(rdev)} {os.minor(rdev)}
mount -o errors=remount-ro /dev/flexiq-disk {DISK}
chown flexiq:flexiq {DISK}; chmod 1770 {DISK}
install -d -m 0700 -o flexiq -g flexiq /var/lib/flexiq-worker
install -d -m 0777 -o flexiq -g flexiq {MARKS}
"""

    def make_read_only(self) -> None:
        """What ext4 does on an I/O error with errors=remount-ro: abort the journal, go read-only."""
        with open(f"/sys/fs/ext4/{self.name}/trigger_fs_error", "w") as trigger:
            trigger.write("flexiq fault test: the disk turns read-only")

    def repair(self) -> str:
        done = subprocess.run(["e2fsck", "-fy", self.device], capture_output=True, text=True)
        return f"e2fsck exit {done.returncode}"

    def remove(self) -> None:
        if self.device:
            subprocess.run(["losetup", "-d", self.device], check=False)
            self.device = None
        if os.path.exists(self.image):
            os.unlink(self.image)


@pytest.fixture
def small_disk(sandbox: Sandbox):
    if not os.path.exists("/dev/loop-control"):
        pytest.skip("no loop devices on this machine")
    disk = SmallDisk()
    try:
        yield disk
    finally:
        sandbox.run(f"systemctl stop {DAEMON} 'flexiq-worker@*' 2>/dev/null; umount {DISK} 2>/dev/null; true",
                    timeout=120)
        disk.remove()


BATCH = ((6, 0.2), (1, 3.0))
FAULT_SECONDS = 8.0
BIG = 20000  # jobs in one enqueue: more than the WAL's room, so it must meet the full disk


def _states(sbx: Sandbox) -> dict[str, int]:
    code = (f"import json, sqlite3; c = sqlite3.connect('{DB}', timeout=30); "
            "print(json.dumps(dict(c.execute('SELECT state, COUNT(*) FROM jobs GROUP BY state').fetchall())))")
    return json.loads(sbx.run(["python3", "-c", code]).stdout)


def _first_completion_after(sbx: Sandbox, since: float) -> float:
    code = (f"import sqlite3; c = sqlite3.connect('{DB}', timeout=30); "
            f"print(c.execute(\"SELECT min(finished_at) FROM jobs WHERE state = 'done' AND finished_at >= {since}\")"
            ".fetchone()[0])")

    def found():
        value = sbx.run(["python3", "-c", code]).stdout.strip()
        return float(value) if value not in ("", "None") else None
    return sbx.wait_for(found, 120, interval=0.05, what="a job completed after the disk's return") - since


def _fault(sbx: Sandbox, name: str, inject, undo) -> dict:
    """Inject, let the load meet it, try a large enqueue, keep it FAULT_SECONDS, undo it; how
    long until a job completes again, and what the operator saw meanwhile."""
    watch = Watch(sbx)
    watch.start()
    injecting = time.time()  # the daemon may see the fault while it is being injected (dd filling the disk)
    inject()
    injected = time.time()
    time.sleep(2)  # the load meets it first
    big = sbx.run([str(BIN / "flexiq"), "--url", STORE, "enqueue", "work", "0.01", "--count", str(BIG)],
                  check=False, timeout=120)
    time.sleep(FAULT_SECONDS - 2)
    undone = time.time()
    watch.stop()
    undo()
    back = time.time()  # the disk takes writes again (after the operator's repair, if it needed one)
    again = _first_completion_after(sbx, back)
    return {"fault": name, "injecting": injecting, "injected": injected, "undone": undone,
            "undo_took": round(back - undone, 1),
            "big_enqueue": {"code": big.returncode, "stdout": big.stdout.strip()[:200],
                            "stderr": big.stderr.strip()},
            "seconds_to_complete_again": round(again, 2), "status_seen": watch.status,
            "flexiqctl_seen": watch.flexiqctl, "workers_seen": watch.workers}


def test_a_full_then_read_only_disk_under_the_sqlite_store_loses_nothing_and_says_why(sandbox: Sandbox,
                                                                                      small_disk: SmallDisk):
    sbx, disk = sandbox, small_disk
    began = time.time()  # the session's journal holds other tests' workers too
    install(sbx, CONFIG, before_start=disk.mount_script())
    sbx.wait_for(lambda: workers(sbx), 30, what="the minimum worker")
    load = Load(sbx, STORE, BATCH, every=0.5)
    load.enqueue(100, 0.2)
    load.start()
    faults = []
    stopped: list[float] = []

    def operator_repairs() -> None:
        """The way back from a read-only ext4: stop, fsck, mount, start."""
        stopped.append(time.time())
        sbx.run(f"systemctl stop {DAEMON} 'flexiq-worker@*'", timeout=120)
        sbx.run(["umount", DISK])
        disk.repair()
        sbx.script(disk.mount_script())
        sbx.systemctl("start", DAEMON)

    try:
        time.sleep(4)
        faults.append(_fault(sbx, "disk full", lambda: sbx.run(f"dd if=/dev/zero of={DISK}/filler bs=64k",
                                                                check=False, timeout=120),
                             lambda: sbx.run(f"rm -f {DISK}/filler")))
        time.sleep(3)
        faults.append(_fault(sbx, "read-only (ext4 error)", disk.make_read_only, operator_repairs))
        time.sleep(2)
    finally:
        load.stop()
    total = len(load.enqueues.ids)
    states = wait_all_done(sbx, lambda: _states(sbx), total, 120)
    runs = executions(sbx, MARKS)
    workers_journal = journal_entries(sbx, "flexiq-worker@*", since=began)
    daemon_journal = journal_entries(sbx, DAEMON, since=began)
    cut = cut_workers(workers_journal)
    verdict = judge(runs, cut)
    for fault in faults:
        fault["starts_while"] = sum(1 for run in runs if fault["injected"] + 3 <= run.started <= fault["undone"])
        fault["worker_said"] = sorted({e["MESSAGE"].split(": ", 1)[-1][:200] for e in workers_journal
                                       if fault["injected"] <= e["at"] <= fault["undone"]
                                       and e.get("PRIORITY") in ("3", "4")})[:3]
        said = [e for e in daemon_journal if e.get("MESSAGE_ID") == FULL_MESSAGE_ID
                and fault["injecting"] <= e["at"] <= fault["undone"]]
        fault["daemon_said"] = [e["MESSAGE"] for e in said]
        fault["daemon_said_at"] = [round(e["at"] - fault["injected"], 2) for e in said]  # < 0: while injecting
    full, read_only = faults
    report = {
        "jobs": total, "states": states, "executions": verdict.executions,
        "jobs_run_twice": verdict.crash_duplicates, "workers_cut": len(cut),
        "reruns_per_cut_worker_max": max(verdict.duplicated_by_crash.values(), default=0),
        "unexplained_reruns": len(verdict.duplicated_otherwise), "overlapping": len(verdict.overlapping),
        "enqueues_failed": len(load.enqueues.failed),
        "enqueue_errors": sorted({text for _, text in load.enqueues.failed})[:4],
        "worker_restarts": worker_restarts(workers_journal),
        "faults": [{k: v for k, v in f.items() if k not in ("injecting", "injected", "undone", "flexiqctl_seen")}
                   for f in faults],
    }
    print("sqlite disk:", json.dumps(report, indent=1))
    t0 = full["injected"]
    print("workers cut, seconds from the disk filling:", [(round(e["at"] - t0, 1), e["MESSAGE"][:160])
                                                          for e in workers_journal
                                                          if _WORKER_CUT.search(e.get("MESSAGE", ""))],
          "read-only at", round(read_only["injected"] - t0, 1), "stopped at", round(stopped[0] - t0, 1))
    print("flexiqctl status during the faults:", [f["flexiqctl_seen"][:2] for f in faults])
    # Nothing committed lost; re-runs only by workers stopped with results the read-only disk refused.
    assert states == {"done": total}, "a job was lost or dead-lettered"
    assert not load.enqueues.ids - completed_jobs(runs), "a job done in the store never ran to its end"
    assert verdict.duplicated_otherwise == [] and verdict.overlapping == []
    assert all(at >= stopped[0] for at in cut.values()), "a worker was cut before the operator stopped it"
    assert max(verdict.duplicated_by_crash.values(), default=0) <= RERUN_BOUND
    for fault in faults:
        # The big enqueue met the fault: one clear line naming the disk and the store; none of its jobs.
        big = fault["big_enqueue"]
        assert big["code"] != 0, f"{fault['fault']}: an enqueue of {BIG} jobs went through"
        assert DB in big["stderr"] and DISK in big["stderr"] and "\n" not in big["stderr"], big["stderr"]
        assert "Traceback" not in big["stderr"]
        # The daemon said why, in STATUS=, flexiqctl status and the journal.
        assert any(DB in s and DISK in s for s in fault["status_seen"]), fault["status_seen"]
        assert any(DB in s and DISK in s for s in fault["flexiqctl_seen"]), fault["flexiqctl_seen"]
        assert fault["daemon_said"], f"{fault['fault']}: nothing in the daemon's journal"
    # ... the disk by its mount point, and what is wrong with it.
    assert f"the disk {DISK} holding the queue database {DB} is full" in full["big_enqueue"]["stderr"]
    assert f"the file system {DISK} holding the queue database {DB}" in read_only["big_enqueue"]["stderr"]
    assert "read-only" in read_only["big_enqueue"]["stderr"].lower()
    # Workers claim nothing from a disk that takes no writes.  (A full one may still take some:
    # SQLite reuses its WAL's room, and what it commits there is safely committed.)
    assert read_only["starts_while"] == 0, "jobs started while the disk was read-only"
    assert load.enqueues.tracebacks == []
    assert all(DB in text and "\n" not in text for _, text in load.enqueues.failed)
    # Up throughout the full disk; stopped only by the operator for the repair.
    assert int(sbx.unit_property(DAEMON, "NRestarts") or 0) == 0
    assert not [e for e in daemon_journal if e["at"] < stopped[0] and "Main process exited" in e.get("MESSAGE", "")]
    assert start_limit_hits(workers_journal) == [] and workers(sbx, "failed") == []
    assert report["worker_restarts"] == 0
