"""How a worker process ends: its tasks' processes die with it, and nothing waits for a stuck thread.

A task may fork (a subprocess, a daemon that double-forks away).  The worker
becomes a *child subreaper* at start, so even a double-forked grandchild is
re-parented to it rather than to init, and stays among its descendants; at exit
it SIGKILLs them all.  Under systemd, ``KillMode=mixed`` ends what is left of the
unit's cgroup; outside systemd this is what makes "the worker is gone" mean
"nothing it started still runs a job".

A thread stuck in C cannot be stopped, and the interpreter's shutdown would
wait for it: ``exit_now`` flushes what the worker wrote and ends the process
with ``os._exit``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time

log = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36
# Rounds of listing and killing descendants: a process forking while the first round runs
# is caught by the next; a killed process cannot fork any more.
_KILL_ROUNDS = 5
# How long to wait for the killed processes to be gone: a SIGKILL is delivered when the
# process next runs, and until it has exited it still holds what the job held (its files,
# its locks).  The worker's pid is what says "the job's holder is gone", so it must not
# exit first.
_KILL_WAIT = 5.0


def become_subreaper() -> bool:
    """Make orphaned descendants this process's children (Linux); False when refused."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
            return True
        error = ctypes.get_errno()
    except (OSError, AttributeError) as exc:
        error = getattr(exc, "errno", 0) or 0
    log.warning("Cannot become a child subreaper (%s): a task's double-forked processes escape "
                "the worker's clean-up.", os.strerror(error) if error else "unsupported")
    return False


def kill_descendants() -> int:
    """SIGKILL every descendant process of this one and wait until they have exited (at most
    ``_KILL_WAIT``); return how many were killed."""
    killed: set[int] = set()
    for _ in range(_KILL_ROUNDS):
        alive = descendants(os.getpid()) - killed
        if not alive:
            break
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
    if killed and not _wait_exited(killed, _KILL_WAIT):
        log.warning("Processes a task started were still exiting %gs after SIGKILL: %s.", _KILL_WAIT,
                    ", ".join(map(str, sorted(_running(killed)))))
    return len(killed)


def _running(pids: set[int]) -> set[int]:
    """Those of ``pids`` that have not exited (a zombie has: its files and locks are released)."""
    left = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue  # gone (reaped)
        if stat[stat.rfind(b")") + 2:].split()[:1] != [b"Z"]:
            left.add(pid)
    return left


def _wait_exited(pids: set[int], timeout: float) -> bool:
    """Wait until every one of ``pids`` has exited (reaping this process's children); False on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        _reap()
        if not _running(pids):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def _reap() -> None:
    """Collect the exit status of any child that has exited (as a subreaper, orphans included)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def descendants(root: int) -> set[int]:
    """Pids of ``root``'s descendants, from /proc.

    Read from each process's own ``stat`` (its parent), which a worker unit's
    ``ProcSubset=pid`` and ``ProtectProc=invisible`` leave readable for its own
    processes -- unlike /proc/stat, which psutil needs.
    """
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue  # gone meanwhile, or not ours to see
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses; split after the last ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and fields[0] != b"Z":
            parents[int(entry)] = int(fields[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def exit_now(code: int) -> None:
    """End the process at once with ``code``, after flushing logs and standard streams."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
