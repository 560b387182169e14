"""Rules within one section of the spec (a model, a role, batching, data, elastic, run policy),
and the model types rlkube trains.

The rules of the sections the trainer reads too (a model's one source, a role's gpus or
colocateWith, the micro-batch bounds, one eval source) are `Rule`s in the runtime's contract
(`rlkube.runtime.contract.sections`), Python and CEL together; the rest (`ElasticSpec`,
`RunPolicySpec`, the integer fields) have their CEL here and their Python in `spec_types`. A model given by
`config` names a `model_type` rlkube trains (`SUPPORTED_MODEL_TYPES`): the CRD declares
`model_type` with its enum inside the otherwise free-form config, and the contract's
`model_types.model_type_problems` is the Python half. A model given by `path` has its config.json read in the pod (runtime/cli.py: exit 3
naming the field).
"""

from __future__ import annotations

from rlkube.operator.api.validation.cel import rule
from rlkube.operator.api.validation.rule import Rule, when
from rlkube.runtime.contract.model_types import SUPPORTED_MODEL_TYPES
from rlkube.runtime.contract.vocab import BYTE_TOKENIZER, BYTE_VOCAB_SIZE, VOCAB_SIZE

ELASTIC = (
    Rule("maxWorkers: must be >= minWorkers", "self.maxWorkers >= self.minWorkers",
         lambda e: when(e.max_workers < e.min_workers, f" ({e.min_workers}), got {e.max_workers}"), ".maxWorkers"),
)
FAIL_ON_EXIT_CODES_CEL = [
    rule("!self.exists(c, c == 143)", "must not contain 143: that code means stopped by SIGTERM after a checkpoint")
]


# On every integer field of the spec. The API server's schema check takes a float with no
# fractional part (2.0) for an integer, but its CEL then fails on it ("expected int, got float64")
# wherever a rule reads the field, and pydantic (strict) refuses it everywhere; reading the value
# in a rule on the field itself refuses it everywhere too, naming the field.
INTEGER_CEL = [rule("self == self", "must be an integer (not a float such as 2.0)")]


def immutable(field: str) -> list[dict]:
    return [rule("self == oldSelf", f"{field} is immutable: it defines the run; create a new RLTrainingJob instead")]


# -- model types ----------------------------------------------------------------------------------
# The Python half is the contract's `model_types.model_type_problems` (the trainer runs it too).

# Declared inside the free-form model config, so the API server checks it (it cannot look at an
# undeclared field).
MODEL_CONFIG_SCHEMA = {
    "required": ["model_type"],
    "properties": {
        "model_type": {
            "type": "string",
            "description": "The model family, as in config.json; one rlkube trains.",
            "enum": list(SUPPORTED_MODEL_TYPES),
            "maxLength": max(map(len, SUPPORTED_MODEL_TYPES)),
        },
        # Declared so the spec's rules can read it (contract.vocab.VOCAB_RULES); the Python half of
        # the type and bound is ModelSpec's validator (contract.vocab.vocab_size_problem).
        VOCAB_SIZE: {
            "type": "integer",
            "description": "Size of the model's vocabulary (its embedding rows), as in config.json. "
            f"With model.tokenizer '{BYTE_TOKENIZER}', at least {BYTE_VOCAB_SIZE}.",
            "minimum": 1,
            "x-kubernetes-validations": INTEGER_CEL,
        },
    },
}
