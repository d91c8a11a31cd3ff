"""``python -m flexiqd.sim policies ...``: the policy benchmark (see ``bench``)."""

import sys

from .bench import main

sys.exit(main(sys.argv[1:]))
