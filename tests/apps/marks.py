"""Where the test apps record their executions: a line appended to a file of this process's
own (``<name>.log``, by default ``<pid>.log``) in ``$FLEXIQ_TEST_MARKS``.

O_APPEND: lines from concurrent threads never interleave.  Each app writes its own line
(what it needs counted); the tests read the folder.
"""

import os

MARKS_ENV = "FLEXIQ_TEST_MARKS"


def append(line: str, *, directory: str | None = None, name: str | None = None) -> None:
    path = os.path.join(directory or os.environ[MARKS_ENV], f"{name or os.getpid()}.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
