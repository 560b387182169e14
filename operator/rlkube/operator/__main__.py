"""`python -m rlkube.operator`: the operator process (same as `rlkube operator`)."""

import sys

from rlkube.operator.main import run

sys.exit(run(sys.argv[1:]))
