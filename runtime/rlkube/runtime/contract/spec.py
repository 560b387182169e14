"""The base every config model derives from, and the bounds the runtime config and the CRD share.

A module of its own so that the sections (`contract.sections`) and `config` itself derive from
one `Spec` without importing each other.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from rlkube.runtime.contract.rule import Rule, problems

# Bounds shared by the runtime config and the CRD schema (maxLength / maxItems there).
MAX_PATH_LEN = 1024
MAX_NAME_LEN = 253
# The roles of a job, in canonical order (the order of the device map's rank ranges).
ROLE_NAMES = ("actor", "critic", "reward", "reference")


class Spec(BaseModel):
    """Base of every config model: camelCase on the wire, unknown fields rejected, and the model's
    own rules (`RULES`, `problems`) checked."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )

    # The rules on this model's object, each a Python check and its CEL (the operator puts the CEL
    # on this object in the CRD), written beside the model; checked once its fields are valid.
    RULES: ClassVar[tuple[Rule, ...]] = ()

    def problems(self) -> list[str]:
        """Every rule this object breaks, one 'path: what would be valid' line each, paths relative
        to the object; a model with rules that are not `Rule`s adds them here."""
        return problems(self.RULES, self)

    @model_validator(mode="after")
    def _rules(self) -> Spec:
        # Every problem on its own line, each starting with its path, so the user sees them all
        # at once (the error formatters split the lines and prefix the location).
        found = self.problems()
        if found:
            raise ValueError("\n".join(found))
        return self


def optional_path(description: str) -> Any:
    """A path field that may be unset (None), but not empty, and no longer than MAX_PATH_LEN."""
    return Field(default=None, min_length=1, max_length=MAX_PATH_LEN, description=description)


def repeated(values: list[Any]) -> list[Any]:
    """The values that occur more than once in `values`, sorted (for a list that is a set)."""
    return sorted({value for value in values if values.count(value) > 1})
