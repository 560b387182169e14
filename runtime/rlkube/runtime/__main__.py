"""Entry point of `python -m rlkube.runtime` (see cli.py). It leaves through
infra/process_exit.exit_now: the run's outcome is written by then, and the interpreter's
teardown would only hold the pod's GPU for seconds more."""

import sys

from rlkube.runtime.cli import main
from rlkube.runtime.infra.process_exit import exit_now, fast_exit_enabled

if __name__ == "__main__":
    code = main()
    if fast_exit_enabled():
        exit_now(code)
    sys.exit(code)
