"""Why a run failed, as the trainer leaves it in its termination message for the operator. Torch-free.

Next to the last report (progress.TERMINATION_MESSAGE_KEY) a failed run writes
`{"error": {"exit": "config", "field": "data.source", "message": "..."}}` (infra/progress.py
write_termination_error); the kubelet copies it into the pod's status, and the operator
(observed.py) copies it into the job's Failed condition and an Event, so `kubectl describe` names
the field or file without anyone reading pod logs. `message` is one line.
"""

from __future__ import annotations

TERMINATION_ERROR_KEY = "error"
ERROR_EXIT = "exit"        # one of ERROR_CATEGORIES
ERROR_FIELD = "field"      # the config field path or file the error is about ("" when none)
ERROR_MESSAGE = "message"  # one line, cut to ERROR_MESSAGE_MAX_CHARS
ERROR_MESSAGE_MAX_CHARS = 1024
ERROR_CONFIG = "config"        # exit pod.EXIT_CONFIG: the config or its data is wrong; retrying cannot help
ERROR_NON_FINITE = "nonFinite"  # exit pod.EXIT_NON_FINITE
ERROR_CRASH = "crash"          # any other exception: retried from the latest checkpoint
ERROR_CATEGORIES: tuple[str, ...] = (ERROR_CONFIG, ERROR_NON_FINITE, ERROR_CRASH)
