"""The base every config model derives from, and the bounds the runtime config and the CRD share.

A module of its own so that the sections (`contract.sections`) and `config` itself derive from
one `Spec` without importing each other.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# Bounds shared by the runtime config and the CRD schema (maxLength / maxItems there).
MAX_PATH_LEN = 1024
MAX_NAME_LEN = 253
# The roles of a job, in canonical order (the order of the device map's rank ranges).
ROLE_NAMES = ("actor", "critic", "reward", "reference")


class Spec(BaseModel):
    """Base of every config model: camelCase on the wire, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )


def optional_path(description: str) -> Any:
    """A path field that may be unset (None), but not empty, and no longer than MAX_PATH_LEN."""
    return Field(default=None, min_length=1, max_length=MAX_PATH_LEN, description=description)
