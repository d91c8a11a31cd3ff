"""Test tasks that behave like real users' tasks at their worst, and record every execution.

Each task blocks its *first* execution of a job in a way a worker cannot
interrupt from Python (a C call, a forked child that ignores SIGTERM, a
daemonised grandchild, a loop that swallows every exception, a ``finally`` that
raises); later executions of the same job finish at once, so "nothing is lost"
can be checked quickly.

Every execution holds an exclusive ``flock`` on ``$FLEXIQ_TEST_MARKS/<job>.lock``
for as long as anything runs it -- a forked child inherits the lock -- so a
second execution that starts while the first still runs finds the lock taken
and writes an ``overlap`` mark.  Marks are lines ``<what> <job> <attempt> <pid>
<time>`` appended to ``$FLEXIQ_TEST_MARKS/<pid>.log`` (``start``, ``end``,
``overlap``).
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import time

import marks
from flexiqd import Queue
from flexiqd.worker.execution import current_job

queue = Queue()


def _directory() -> str:
    return os.environ["FLEXIQ_TEST_MARKS"]


def _mark(what: str) -> None:
    job = current_job()
    marks.append(f"{what} {job.id} {job.attempts} {os.getpid()} {time.time():.6f}\n", directory=_directory())


def _execution_number() -> int:
    """1 for the first execution of the current job, 2 for the next, ..."""
    path = os.path.join(_directory(), f"{current_job().id}.runs")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, b".")
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def _take_job_lock() -> int:
    """The job's lock, held by this execution; an ``overlap`` mark when another still holds it."""
    fd = os.open(os.path.join(_directory(), f"{current_job().id}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _mark("overlap")
    return fd


def _execution(body):
    """Run ``body(first, lock_fd)`` as one recorded execution of the current job."""
    first = _execution_number() == 1
    lock = _take_job_lock()
    _mark("start")
    try:
        body(first, lock)
    finally:
        os.close(lock)
    _mark("end")
    return "ok"


@queue.task("sleep_in_c")
def sleep_in_c(seconds: float) -> str:
    """One ``time.sleep``: no Python-level interrupt lands until it returns."""
    return _execution(lambda first, _: time.sleep(seconds if first else 0.0))


@queue.task("recv_in_c")
def recv_in_c(seconds: float) -> str:
    """A socket read that waits for data that never comes (until its timeout)."""
    def body(first: bool, _lock: int) -> None:
        if not first:
            return
        reader, writer = socket.socketpair()
        with reader, writer:
            reader.settimeout(seconds)
            try:
                reader.recv(1)
            except TimeoutError:
                pass
    return _execution(body)


_IGNORE_TERM_AND_SLEEP = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                          "time.sleep(float(sys.argv[1]))")


@queue.task("child_ignoring_term")
def child_ignoring_term(seconds: float) -> str:
    """A forked child does the work, ignores SIGTERM, and holds the job's lock while it lives."""
    def body(first: bool, lock: int) -> None:
        if first:
            subprocess.run([sys.executable, "-c", _IGNORE_TERM_AND_SLEEP, str(seconds)],
                           pass_fds=(lock,), check=False)
    return _execution(body)


def _close_inherited(keep: set[int]) -> None:
    """What a daemon does first: close every descriptor it inherited but ``keep`` and the
    standard three.  A fork copies the whole process's, and the worker's other threads hold
    their own jobs' locks: kept, the grandchild would hold those jobs "running" too."""
    low = 3
    for fd in sorted(fd for fd in keep if fd >= 3):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


@queue.task("daemonized_grandchild")
def daemonized_grandchild(seconds: float) -> str:
    """A double fork: the grandchild leaves the task's process tree (new session, parent gone)
    and holds the job's lock; the task waits for it by reading a pipe it never writes to."""
    def body(first: bool, lock: int) -> None:
        if not first:
            return
        reader, writer = os.pipe()
        child = os.fork()
        if child == 0:  # the child: fork the grandchild and leave at once
            try:
                os.setsid()
                if os.fork() == 0:
                    _close_inherited({lock, writer})
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                    time.sleep(seconds)  # holds `lock` and `writer` until it ends
            finally:
                os._exit(0)
        os.close(writer)
        os.waitpid(child, 0)
        os.read(reader, 1)  # returns when the grandchild exits (its copy of `writer` closes)
        os.close(reader)
    return _execution(body)


@queue.task("loop_forever")
def loop_forever() -> str:
    """Pure Python that swallows every exception, interrupts included: it never returns."""
    def body(first: bool, _lock: int) -> None:
        while first:
            try:
                time.sleep(0.05)
            except BaseException:  # noqa: BLE001 - the hostile part
                pass
    return _execution(body)


@queue.task("raise_in_finally")
def raise_in_finally(seconds: float) -> str:
    """Interruptible work whose cleanup raises: the interrupt turns into another error."""
    def body(first: bool, _lock: int) -> None:
        if not first:
            return
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            raise RuntimeError("cleanup failed")
    return _execution(body)
