"""The child side of an app check: import ``module:attribute`` as a worker does, print JSON.

Run as ``python -m flexiqd.apps.probe module:attribute`` by ``flexiqd.apps.check``.  The
document says which interpreter ran, the error a worker would die of (if any), the tasks
the app registers and the files its import loaded -- what ``findings`` needs to say
whether the workers' sandbox can see them and who could change them.
"""

from __future__ import annotations

import json
import sys


def probe(spec: str) -> dict:
    before = set(sys.modules)
    document: dict = {"python": sys.executable, "version": sys.version.split()[0], "error": None,
                      "tasks": {}, "files": []}
    try:
        from ..worker.loader import load_app

        app = load_app(spec)
    except Exception as exc:  # a worker dies of any of these: report each, never raise
        said = str(exc) if type(exc).__name__ == "TaskError" else f"{type(exc).__name__}: {exc}"
        document["error"] = said.removeprefix(f"--app {spec!r}: ")
        return document
    finally:
        document["files"] = sorted({module.__file__ for name, module in list(sys.modules.items())
                                    if name not in before and getattr(module, "__file__", None)})
    # The options each task declares (flexiqd.queue.declarations): the daemon writes them to
    # the store, so producers that enqueue by name get them before any worker has started.
    document["tasks"] = {name: {"queue": task.options.queue, "priority": task.options.priority,
                                "max_attempts": task.options.max_attempts, "timeout": task.options.timeout}
                         for name, task in sorted(app.tasks.items())}
    return document


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m flexiqd.apps.probe module:attribute", file=sys.stderr)
        return 2
    json.dump(probe(argv[0]), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
