"""A worker's exit: the processes its tasks started are killed, and have exited, before it goes
(its pid is what tells the store that nothing still runs its jobs)."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import fcntl, json, os, subprocess, sys, tempfile
from flexiqd.worker.exit import become_subreaper, kill_descendants

become_subreaper()
lock = tempfile.NamedTemporaryFile(delete=False).name
# A task's child holding the job's lock, and a grandchild that double-forked away.  The child
# holds a gigabyte: a killed process frees its memory before it closes its files, so its lock
# outlives the SIGKILL by the time that takes.
code = "import fcntl, os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
       "fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); " \
       "ballast = b'x' * (1 << 30); print('locked', flush=True); time.sleep(60)"
child = subprocess.Popen([sys.executable, "-c", code, lock], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "locked"
grandchild = subprocess.Popen(["setsid", "-f", "sleep", "60"])
grandchild.wait()
killed = kill_descendants()
# Nothing may still hold the lock the moment kill_descendants returns.
fd = os.open(lock, os.O_RDWR)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    free = True
except BlockingIOError:
    free = False
print(json.dumps({"killed": killed, "lock_free": free}))
"""


def test_the_processes_a_task_left_have_exited_when_the_kill_returns():
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout.splitlines()[-1])
        assert result["killed"] >= 2
        assert result["lock_free"], "a killed task's process still held the job's lock"
