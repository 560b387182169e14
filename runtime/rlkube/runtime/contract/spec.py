"""The base every config model derives from, and the bounds the runtime config and the CRD share.

A module of its own so that the sections split out of `config` (`rollout`) and `config` itself
derive from one `Spec` without importing each other.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
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
