"""The benchmark's no-op task for huey's SqliteHuey (``bench_huey.huey``), same side effect as bench_flexiqd.

The task returns None, so huey stores no result: its store keeps nothing of a
finished task, and completions are counted from the per-process files.
"""

import os
import time

from huey import SqliteHuey

huey = SqliteHuey("bench", filename=os.environ.get("BENCH_DB", "huey.db"))
_out: dict[int, int] = {}


def _fd() -> int:
    pid = os.getpid()  # the process consumer forks its workers: one file each
    if pid not in _out:
        path = os.path.join(os.environ["BENCH_OUT"], f"ran-{pid}.txt")
        _out[pid] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    return _out[pid]


@huey.task(name="noop")
def noop(i):
    os.write(_fd(), f"{i} - {time.time():.6f}\n".encode())
