"""The benchmark's no-op task for flexiq 2.1 (``bench_flexiq:queue``), same side effect as bench_flexiqd."""

import os
import time

from flexiq import Queue

queue = Queue(db_path=os.environ.get("BENCH_DB", ".flexiq/flexiq.db"))
_out: list[int] = []


def _fd() -> int:
    if not _out:
        path = os.path.join(os.environ["BENCH_OUT"], f"ran-{os.getpid()}.txt")
        _out.append(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    return _out[0]


@queue.task(name="noop")
def noop(i):
    os.write(_fd(), f"{i} - {time.time():.6f}\n".encode())
