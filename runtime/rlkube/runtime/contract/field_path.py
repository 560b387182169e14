"""The one way a field is named in an error: `spec.roles.actor.gpus`, `spec.tolerations[0].key`.

Both sides report a user's mistake by the path of the field it is in: `rlkube validate` and the
operator (`rlkube.operator.api.field_errors`, for a manifest or a job's spec) and the runtime's CLI
(for run.yaml, exit code 3). Each turns a pydantic error location into that path here, so a
field reads the same in `kubectl describe`, in `rlkube validate` and in a trainer's log.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# pydantic adds a step per validator function to some locations ('function-after[_check(), int]');
# it names no field, so it is left out of the path.
_VALIDATOR_STEP = re.compile(r"^function-(after|before|wrap|plain)\[")


def field_path(loc: Iterable[str | int]) -> str:
    """A pydantic error location as a dotted path, list indices in brackets.

    ('spec', 'tolerations', 0, 'key') -> 'spec.tolerations[0].key'; () -> ''.
    """
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not _VALIDATOR_STEP.match(part):
            path += f".{part}" if path else str(part)
    return path
