"""Rules on the object's metadata that the API server applies itself (its ObjectMeta validation,
before any schema): label keys and values, annotation keys. A CRD can add no rule to metadata but
the name's, so these have no CEL; the Python half is here so that `rlkube validate` refuses what
the API server refuses.
"""

from __future__ import annotations

import re

from rlkube.operator.api.limits import LABEL_VALUE_MAX, LABEL_VALUE_PATTERN
from rlkube.operator.api.pod_spec import label_key_problem


def label_value_problem(value: str) -> str | None:
    """Why `value` is not a valid label value, or None."""
    if len(value) > LABEL_VALUE_MAX or not re.fullmatch(LABEL_VALUE_PATTERN, value):
        return (f"must be a label value: at most {LABEL_VALUE_MAX} characters (letters, digits, '-', '_', '.'), "
                f"starting and ending alphanumeric, got {value!r}")
    return None


def label_problems(labels: dict[str, str]) -> list[str]:
    problems = [f"key {key!r}: {problem}" for key in labels if (problem := label_key_problem(key))]
    problems += [f"{key}: {problem}" for key, value in labels.items() if (problem := label_value_problem(value))]
    return problems


def annotation_problems(annotations: dict[str, str]) -> list[str]:
    # The API server checks an annotation key lower-cased: 'Example.COM/Note' is a valid one.
    return [f"key {key!r}: {problem}" for key in annotations if (problem := label_key_problem(key.lower()))]
