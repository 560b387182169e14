"""Validation errors as a user reads them: a camelCase field path and what would be valid.

`field_errors` turns a pydantic ValidationError into `FieldError`s ('spec.roles.actor.gpus: must be
>= 1, got 0'), paths written by `rlkube.runtime.contract.field_path` as the runtime writes them;
`describe_error` words one pydantic error, naming the valid fields (with a guess at a misspelt
one) or the format a pattern stands for.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ValidationError

from rlkube.operator.api.limits import (
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    LABEL_KEY_PATTERN,
    LABEL_VALUE_PATTERN,
    QUANTITY_PATTERN,
)
from rlkube.runtime.contract.config import CheckpointSpec, RoleSpec
from rlkube.runtime.contract.field_path import field_path


@dataclass(frozen=True)
class FieldError:
    """One user-facing validation error: a dotted camelCase field path and what would be valid."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message



_PATH_PREFIX = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*|\[\d+\])*): (.*)$", re.S)


def field_errors(
    exc: ValidationError, prefix: tuple[str | int, ...] = (), model: type[BaseModel] | None = None
) -> list[FieldError]:
    """Turn a pydantic ValidationError into FieldErrors with camelCase dotted paths.

    A model validator's message may start with a relative path ("roles.critic: ...") and may hold
    several problems on separate lines; each becomes its own FieldError under the validator's
    location.
    """
    out: list[FieldError] = []
    for error in exc.errors(include_url=False):
        loc = (*prefix, *error["loc"])
        kind = error["type"]
        if kind == "value_error":
            text = str(error.get("ctx", {}).get("error", error["msg"]))
            for line in text.splitlines() or [text]:
                match = _PATH_PREFIX.match(line)
                if match:
                    out.append(FieldError(field_path((*loc, match.group(1))), match.group(2)))
                else:
                    out.append(FieldError(field_path(loc), line))
            continue
        out.append(FieldError(field_path(loc), describe_error(error, _model_at(model, error["loc"]))))
    return out


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# Errors of a bound: the comparison and the bound's key in the error's context.
_BOUNDS = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"), "less_than_equal": ("<=", "le"),
           "less_than": ("<", "lt")}
# Errors of a value of the wrong type: what it must be.
_TYPES = {
    **dict.fromkeys(("int_type", "int_parsing", "int_from_float"), "an integer"),
    **dict.fromkeys(("float_type", "float_parsing", "finite_number"), "a finite number"),
    **dict.fromkeys(("bool_type", "bool_parsing"), "true or false"),
    **dict.fromkeys(("string_type", "string_unicode"), "a string"),
    **dict.fromkeys(("model_type", "model_attributes_type", "dict_type"), "a mapping"),
    "list_type": "a list",
    **dict.fromkeys(("datetime_type", "datetime_parsing", "datetime_from_date_parsing"), "an RFC 3339 date-time"),
}


def describe_error(error: Any, parent: type[BaseModel] | None = None) -> str:
    """What is wrong and what would be valid, for one pydantic error (not a value_error)."""
    kind, ctx, value = error["type"], error.get("ctx", {}), error.get("input")
    got = f", got {_show(value)}"
    if kind in _BOUNDS:
        comparison, bound = _BOUNDS[kind]
        return f"must be {comparison} {ctx[bound]}{got}"
    if kind in _TYPES:
        return f"must be {_TYPES[kind]}{got}"
    if kind == "literal_error":
        expected = str(ctx["expected"])
        return f"must be {expected}{got}" if " or " not in expected else f"must be one of {expected}{got}"
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        names = _field_names(parent)
        field = str(error["loc"][-1]) if error["loc"] else ""
        close = difflib.get_close_matches(field, names, n=1, cutoff=0.6)
        guess = f"; did you mean {close[0]!r}?" if close else ""
        hint = f" (valid fields: {', '.join(names)})" if names else ""
        return f"unknown field{guess}{hint}"
    if kind == "string_too_long":
        return f"must be at most {ctx['max_length']} characters, got {len(value)}"
    if kind == "string_too_short":
        return f"must be at least {ctx['min_length']} characters{got}"
    if kind == "string_pattern_mismatch":
        pattern = ctx["pattern"]
        return f"must be {_PATTERN_NAMES[pattern]}{got}" if pattern in _PATTERN_NAMES else f"must match {pattern}{got}"
    if kind == "too_long":
        return f"must have at most {ctx['max_length']} items, got {ctx.get('actual_length')}"
    if kind == "too_short":
        return f"must have at least {ctx['min_length']} items, got {ctx.get('actual_length')}"
    return str(error["msg"])


# Patterns as a user would name them, for error messages.
_PATTERN_NAMES = {
    QUANTITY_PATTERN: "a Kubernetes quantity such as '500m', '2' or '16Gi'",
    LABEL_KEY_PATTERN: "a label key such as 'kubernetes.io/hostname' (no spaces; optional 'prefix/')",
    LABEL_VALUE_PATTERN: "a label value (letters, digits, '-', '_' and '.', at most 63 characters)",
    DNS_SUBDOMAIN_PATTERN: "a DNS subdomain name (lower-case letters, digits, '-' and '.')",
    DNS_LABEL_PATTERN: "a DNS label (lower-case letters, digits and '-')",
}


def _pattern_of(model: type[BaseModel], field: str) -> str:
    return next(m.pattern for m in model.model_fields[field].metadata if getattr(m, "pattern", None))


_PATTERN_NAMES[_pattern_of(RoleSpec, "function")] = (
    "an import path 'package.module:function', e.g. 'rlkube.runtime.rewards:target_pattern'"
)
_PATTERN_NAMES[_pattern_of(CheckpointSpec, "volume_claim")] = (
    "a PersistentVolumeClaim name (lower-case letters, digits, '-' and '.')"
)


def _field_names(model: type[BaseModel] | None) -> list[str]:
    if model is None:
        return []
    return [info.alias or name for name, info in model.model_fields.items()]


def _model_at(root: type[BaseModel] | None, loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The model class holding the field at `loc` (for listing valid fields), if one is found."""
    if root is None:
        return None
    current: Any = root
    for part in loc[:-1]:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = next(
                (info for name, info in current.model_fields.items() if part in (name, info.alias)), None
            )
            if field is None:
                return None
            current = _unwrap(field.annotation)
        elif isinstance(current, tuple):  # (container, item type)
            current = _unwrap(current[1])
        else:
            return None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """Strip Optional/Annotated; lists and dicts become (container, item type)."""
    while True:
        origin = typing.get_origin(annotation)
        args = typing.get_args(annotation)
        if origin is Annotated:
            annotation = args[0]
        elif origin in (typing.Union, types.UnionType):
            rest = [a for a in args if a is not type(None)]
            if len(rest) != 1:
                return annotation
            annotation = rest[0]
        elif origin in (list, tuple):
            return ("list", args[0])
        elif origin is dict:
            return ("dict", args[1])
        else:
            return annotation
