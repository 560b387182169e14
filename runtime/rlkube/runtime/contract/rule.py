"""`Rule`: one validation rule written once, its Python check and its CEL on the same object, with
one message both doors print.

The runtime's contract holds the rules the trainer applies to its own config (a section's own
rules, roles and colocation, what an algorithm cannot honour), so that the trainer, `rlkube
validate` and the API server read one definition: the runtime runs `broken`, the operator's
`rlkube.operator.api.crd_rules` puts `cel` into the CRD (`Rule.crd`). Torch-free and free of
Kubernetes: a CEL rule is only text here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


def cel_entry(cel: str, message: str, field_path: str | None = None, reason: str | None = None) -> dict:
    """One `x-kubernetes-validations` entry. The message starts with the field path relative to
    the object the rule sits on, as the Python check's error does."""
    out: dict[str, Any] = {"rule": cel, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    if reason:
        out["reason"] = reason
    return out


@dataclass(frozen=True)
class Rule:
    """A rule on the object of one pydantic model (a section of the spec, the roles, the spec).

    `message` starts with the field path relative to that object ('maxWorkers: must be >= minWorkers');
    the API server prints it as written, the Python doors print it with what `broken` adds (the
    values it saw: ' (4), got 8'). `cel` holds when the object is valid; `broken` is its Python
    twin: None when the object is valid, else the detail ('' for none).
    """

    message: str
    cel: str
    broken: Callable[[Any], str | None]
    field_path: str | None = None

    def crd(self) -> dict:
        """The rule as an `x-kubernetes-validations` entry."""
        return cel_entry(self.cel, self.message, self.field_path)

    def problem(self, obj: Any) -> str | None:
        detail = self.broken(obj)
        return None if detail is None else self.message + detail


def problems(rules: Iterable[Rule], obj: Any) -> list[str]:
    """The messages of the rules `obj` breaks, in the rules' order."""
    return [problem for each in rules if (problem := each.problem(obj)) is not None]


def check(rules: Iterable[Rule], obj: Any) -> None:
    """Raise one ValueError listing every rule `obj` breaks, a line each (for a model validator)."""
    found = problems(rules, obj)
    if found:
        raise ValueError("\n".join(found))


def crd(rules: Iterable[Rule]) -> list[dict]:
    return [each.crd() for each in rules]


def when(condition: bool, detail: str = "") -> str | None:
    """`broken`'s answer: `detail` when `condition` (the rule is broken), else None."""
    return detail if condition else None
