"""The fence test's app: a task that starts a child process and then waits, both for long.

The child's pid goes to ``$FLEXIQ_TEST_MARKS/child.pid`` so the test can see it die
with the worker.
"""

import os
import subprocess
import time

from flexiqd import Queue

queue = Queue()


@queue.task("fork_and_wait")
def fork_and_wait(seconds: float = 600.0) -> str:
    child = subprocess.Popen(["sleep", str(seconds)])
    path = os.path.join(os.environ["FLEXIQ_TEST_MARKS"], "child.pid")
    with open(path + ".tmp", "w") as handle:
        handle.write(str(child.pid))
    os.rename(path + ".tmp", path)
    time.sleep(seconds)
    return "ok"
