"""Record what flexiq 2.1.0's own autoscaler code writes, for test_policy_flexiq.py.

Run with an interpreter that has flexiq 2.1.0 installed (not a dependency of
flexiqd):  python tests/unit/data/record_flexiq_lines.py > tests/unit/data/flexiq-2.1.0-lines.json

For every case -- the eight published vectors, then a grid of inputs and
options -- it calls ``flexiq.autoscale.compute_desired_workers`` and formats
the decision with the autoscaler's own log format, through ``logging``, as
``AutoscaleController.serve_forever`` does.
"""

import itertools
import json
import logging
import sys
from pathlib import Path

import flexiq
from flexiq.autoscale import AutoscaleConfig, compute_desired_workers

# flexiq/autoscale/controller.py, AutoscaleController.serve_forever
FORMAT = "autoscale: pending=%s running=%s workers=%s -> %s (%s)"
OPTIONS = ("min_workers", "max_workers", "target_queue_depth_per_worker", "target_utilisation", "tolerance")
COLUMNS = ["pending", "running", "current_workers", *OPTIONS, "concurrency_per_worker", "desired_workers", "line"]


def cases():
    vectors = json.loads((Path(__file__).parent / "flexiq-vectors.json").read_text())
    for case in vectors:
        yield {key: case[key] for key in ("pending", "running", "current_workers", *OPTIONS,
                                          "concurrency_per_worker")}
    grid = itertools.product((0, 15, 16, 1000), (0, 1, 6, 33), (0, 1, 2, 8, 20), ((1, 10), (3, 8)), (10,),
                             (0.75,), (0, 0.1, 0.5), (1, 4))
    for pending, running, current, (low, high), depth, util, tolerance, concurrency in grid:
        yield {"pending": pending, "running": running, "current_workers": current, "min_workers": low,
               "max_workers": high, "target_queue_depth_per_worker": depth, "target_utilisation": util,
               "tolerance": tolerance, "concurrency_per_worker": concurrency}


def main():
    records = []
    for case in cases():
        config = AutoscaleConfig(app_path="app:queue", threads_per_worker=case["concurrency_per_worker"],
                                 **{key: case[key] for key in OPTIONS})
        decision = compute_desired_workers(pending=case["pending"], running=case["running"],
                                           current_workers=case["current_workers"], config=config)
        record = logging.LogRecord("flexiq.autoscale", logging.INFO, __file__, 0, FORMAT,
                                   (decision.pending, decision.running, decision.current_workers,
                                    decision.desired_workers, decision.rationale), None)
        records.append([*(case[key] for key in COLUMNS[:-2]), decision.desired_workers, record.getMessage()])
    sys.stdout.write('{"flexiq": "%s", "format": %s,\n"columns": %s,\n"cases": [\n%s\n]}\n' % (
        getattr(flexiq, "__version__", "2.1.0"), json.dumps(FORMAT), json.dumps(COLUMNS),
        ",\n".join(json.dumps(r) for r in records)))


if __name__ == "__main__":
    main()
