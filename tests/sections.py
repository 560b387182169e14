"""Test manifests and configs are a base plus overrides of some top-level sections."""

from __future__ import annotations

import copy
from typing import Any


def with_sections(base: dict, sections: dict[str, Any]) -> dict:
    """`base` with `sections` applied: a dict value is merged into the base's section of that
    name (one level deep), anything else replaces it. Neither argument is changed."""
    out = copy.deepcopy(base)
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **copy.deepcopy(value)}
        else:
            out[key] = copy.deepcopy(value)
    return out
