"""The names of a checkpoint directory's parts (infra/checkpoint.py's module docstring), torch-free
so that code running before torch loads (readahead.py) finds checkpoints by the same names."""

from __future__ import annotations

import re

META = "rlkube-checkpoint.json"  # a committed checkpoint's metadata file: its commit point
STEP_DIR = re.compile(r"^step-(\d{9})$")
