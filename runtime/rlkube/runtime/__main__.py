"""Entry point of `python -m rlkube.runtime` (see cli.py)."""

import sys

from rlkube.runtime.cli import main

if __name__ == "__main__":
    sys.exit(main())
