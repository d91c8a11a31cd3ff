"""``python -m flexiqd.sim policies ...``: the policy benchmark (``flexiq bench``, cli/bench.py)."""

import sys

from ..cli.bench import main

sys.exit(main(sys.argv[1:]))
