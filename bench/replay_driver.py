"""The replay's side inside the container: enqueue a schedule on time, and read the store afterwards.

    python bench/replay_driver.py enqueue SCHEDULE URL QUEUE START
    python bench/replay_driver.py executions DATABASE QUEUE

``enqueue`` reads SCHEDULE (JSON: a list of [enqueue_at, delay, duration]),
waits until wall-clock START + enqueue_at for each job and enqueues it as
``flexiqd.demo.sleep(duration)`` runnable ``delay`` seconds later; jobs due
together go in one transaction.  It prints JSON: [job id, runnable at (wall
clock)] per job.  A job enqueued late (the machine was busy) is runnable from
when it was actually enqueued, so its wait counts from there; the lateness is
printed on stderr at the end.

``executions`` prints [job id, started at] for every attempt of the queue's
jobs that started (finished attempts from ``executions``, running ones from
``jobs``), read-only.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time

from flexiqd.queue import NewJob, open_backend

TASK = "flexiqd.demo.sleep"
# Enqueue together what falls due within this many seconds: one transaction
# instead of many when a burst arrives.
BATCH_WINDOW = 0.005


def enqueue(schedule_path: str, url: str, queue: str, start: float) -> int:
    with open(schedule_path, encoding="utf-8") as handle:
        schedule = json.load(handle)
    backend = open_backend(url)
    out: list[list[float]] = []
    late_max = 0.0
    i = 0
    while i < len(schedule):
        due = start + schedule[i][0]
        pause = due - time.time()
        if pause > 0:
            time.sleep(pause)
        now = time.time()
        batch = []
        while i < len(schedule) and start + schedule[i][0] <= now + BATCH_WINDOW:
            batch.append(schedule[i])
            i += 1
        late_max = max(late_max, now - due)
        jobs = [NewJob(task=TASK, payload={"args": [duration], "kwargs": {}}, queue=queue, delay=delay,
                       max_attempts=10)
                for _, delay, duration in batch]
        ids = backend.enqueue(jobs, now=now)
        out.extend([job_id, now + delay] for job_id, (_, delay, _) in zip(ids, batch))
    json.dump(out, sys.stdout)
    print(f"enqueued {len(out)} jobs, at most {late_max:.3f} s late", file=sys.stderr)
    return 0


def executions(database: str, queue: str) -> int:
    db = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=30)
    rows = db.execute(
        "SELECT e.job_id, e.started_at FROM executions e JOIN jobs j ON j.id = e.job_id "
        "WHERE j.queue = ? AND e.started_at IS NOT NULL "
        "UNION ALL SELECT id, started_at FROM jobs WHERE queue = ? AND state = 'running' "
        "AND started_at IS NOT NULL", (queue, queue)).fetchall()
    json.dump([list(row) for row in rows], sys.stdout)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[0] == "enqueue":
        return enqueue(argv[1], argv[2], argv[3], float(argv[4]))
    if len(argv) == 3 and argv[0] == "executions":
        return executions(argv[1], argv[2])
    print("usage:\n" + "\n".join(__doc__.strip().splitlines()[2:4]), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
