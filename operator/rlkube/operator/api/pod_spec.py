"""The pod knobs of the spec (resources, node selector, tolerations, security context), each
model with its rules, a Python check and its CEL twin.

The API server validates a pod far more strictly than a CRD's schema says: a request above its
limit, a label key with two slashes or a name part longer than 63 characters, a toleration whose
fields contradict each other, all come back as 422 only when the operator creates the pod, long
after `kubectl apply` said yes. These rules move those refusals to admission.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal

from pydantic import Field

from rlkube.operator.api.limits import (
    LABEL_KEY_MAX,
    LABEL_KEY_PATTERN,
    LABEL_VALUE_MAX,
    LABEL_VALUE_PATTERN,
    QUANTITY_MAX_LEN,
    QUANTITY_PATTERN,
)
from rlkube.runtime.contract.rule import Rule, when
from rlkube.runtime.contract.rule import cel_entry as rule
from rlkube.runtime.contract.spec import Spec

# -- resources: a request above its limit ---------------------------------------------------------

_SUFFIXES = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
    "P": Decimal("1e15"), "E": Decimal("1e18"),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([numkMGTPE]|[KMGTPE]i|[eE][-+]?[0-9]+)?$")

RESOURCE_FIELDS = (("cpu", "cpu"), ("memory", "memory"), ("ephemeral_storage", "ephemeralStorage"))


def quantity_value(text: str) -> Decimal | None:
    """The amount a Kubernetes quantity stands for ('500m' -> 0.5, '2Gi' -> 2147483648); None
    when `text` is not one (the field's own pattern reports that)."""
    match = _QUANTITY.match(text)
    if not match:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number) * (Decimal(10) ** int(suffix[1:]))
        return Decimal(number) * _SUFFIXES[suffix]
    except (InvalidOperation, KeyError, ValueError):
        return None


def _request_above_limit(field: str, wire: str) -> Rule:
    """A request at most its limit, when both are set (the API server refuses the pod otherwise)."""

    def broken(resources: Any) -> str | None:
        request, limit = getattr(resources.requests, field), getattr(resources.limits, field)
        if request is None or limit is None:
            return None
        req, lim = quantity_value(request), quantity_value(limit)
        return when(req is not None and lim is not None and req > lim, f" ({limit}), got {request}")

    both = f"has(self.requests) && has(self.requests.{wire}) && has(self.limits) && has(self.limits.{wire})"
    return Rule(
        f"requests.{wire}: must be <= limits.{wire}",
        f"!({both}) || quantity(self.requests.{wire}).compareTo(quantity(self.limits.{wire})) <= 0",
        broken,
        ".requests",
    )


RESOURCES = tuple(_request_above_limit(field, wire) for field, wire in RESOURCE_FIELDS)


Quantity = Annotated[str, Field(max_length=QUANTITY_MAX_LEN, pattern=QUANTITY_PATTERN)]


class ResourceList(Spec):
    """CPU and memory amounts, as Kubernetes quantities."""

    cpu: Quantity | None = Field(default=None, description="CPU cores, e.g. '500m' or '8'.")
    memory: Quantity | None = Field(default=None, description="Memory, e.g. '2Gi' or '512Mi'.")
    ephemeral_storage: Quantity | None = Field(
        default=None, description="Node-local scratch space, e.g. '10Gi'."
    )


class PodResources(Spec):
    """CPU and memory of each pod. GPUs are not set here: each pod gets placement.gpusPerPod."""

    RULES = RESOURCES

    requests: ResourceList = Field(
        default_factory=ResourceList, description="Amounts the scheduler reserves for each pod."
    )
    limits: ResourceList = Field(
        default_factory=ResourceList, description="Most each pod may use (memory: OOM-killed above)."
    )



# -- label keys of the node selector --------------------------------------------------------------

# A label key as the API server checks it (validation.IsQualifiedName): an optional DNS-subdomain
# prefix and '/', then a name of 1-63 characters, alphanumeric at both ends. No backslashes, so
# the same text serves as a CEL string literal.
LABEL_NAME = "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_PREFIX = "[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
LABEL_KEY_REGEX = f"^({LABEL_PREFIX}/)?{LABEL_NAME}$"
LABEL_PREFIX_MAX = 253


def label_key_problem(key: str) -> str | None:
    """Why `key` is not a valid label key, or None."""
    prefix, slash, _ = key.rpartition("/")
    if slash and len(prefix) > LABEL_PREFIX_MAX:
        return f"the prefix before '/' must be at most {LABEL_PREFIX_MAX} characters"
    if not re.fullmatch(LABEL_KEY_REGEX, key):  # not re.match: its '$' also matches before a final newline
        return ("must be a label key: an optional DNS-subdomain prefix and '/', then a name of 1-63 "
                "characters (letters, digits, '-', '_', '.'), starting and ending alphanumeric")
    return None


# On the map: every key is a label key (the prefix length is left to the key's maxLength).
NODE_SELECTOR_CEL = [
    rule(f"self.all(k, k.matches('{LABEL_KEY_REGEX}'))", "every key must be a label key: an optional "
         "DNS-subdomain prefix and '/', then a name of 1-63 characters, starting and ending alphanumeric")
]

# -- tolerations ----------------------------------------------------------------------------------

TOLERATION = (
    Rule("value: must be empty when operator is Exists",
         "self.operator != 'Exists' || !has(self.value) || self.value == ''",
         lambda t: when(t.operator == "Exists" and bool(t.value)), ".value"),
    Rule("operator: must be Exists when key is unset", "has(self.key) || self.operator == 'Exists'",
         lambda t: when(t.key is None and t.operator != "Exists"), ".operator"),
    Rule("tolerationSeconds: only applies to effect NoExecute",
         "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
         lambda t: when(t.toleration_seconds is not None and t.effect != "NoExecute"), ".tolerationSeconds"),
)


class Toleration(Spec):
    """A pod toleration, as in the Pod API."""

    RULES = TOLERATION

    key: str | None = Field(
        default=None, max_length=LABEL_KEY_MAX, pattern=LABEL_KEY_PATTERN,
        description="Taint key the toleration matches; unset with operator Exists matches all taints.",
    )
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="How key and value match.")
    value: str | None = Field(
        default=None, max_length=LABEL_VALUE_MAX, pattern=LABEL_VALUE_PATTERN,
        description="Taint value (operator Equal).",
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect matched; unset matches all effects."
    )
    toleration_seconds: int | None = Field(
        default=None, ge=0, le=31_536_000,
        description="NoExecute only: seconds the pod stays bound after the taint appears.",
    )



# -- security context -----------------------------------------------------------------------------

SECURITY = (
    Rule("runAsNonRoot: true contradicts runAsUser 0 (root); set a non-zero runAsUser or drop runAsNonRoot",
         "!(has(self.runAsNonRoot) && self.runAsNonRoot && has(self.runAsUser) && self.runAsUser == 0)",
         lambda s: when(bool(s.run_as_non_root) and s.run_as_user == 0), ".runAsNonRoot"),
)


class PodSecurity(Spec):
    """Overrides of the pods' security context (the operator's default runs as non-root 1000)."""

    RULES = SECURITY

    run_as_user: int | None = Field(default=None, ge=0, le=2**31 - 1, description="UID of the trainer process.")
    run_as_group: int | None = Field(default=None, ge=0, le=2**31 - 1, description="GID of the trainer process.")
    fs_group: int | None = Field(
        default=None, ge=0, le=2**31 - 1, description="Group that owns mounted volumes (checkpoints)."
    )
    run_as_non_root: bool | None = Field(
        default=None, description="Refuse to start a container whose user is root."
    )

