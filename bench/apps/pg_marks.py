"""The mark every benchmark task leaves: its argument, one line per run, in a file per process.

The PostgreSQL throughput benchmark reads these files to count runs per argument (a job
that ran twice shows up twice); the rates themselves come from each store's own records.
"""

import os

_fds: list[int] = []


def mark(i) -> None:
    if not _fds:
        path = os.path.join(os.environ["BENCH_OUT"], f"ran-{os.getpid()}.txt")
        _fds.append(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    os.write(_fds[0], f"{i}\n".encode())
