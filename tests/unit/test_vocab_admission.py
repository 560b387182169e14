"""A model config's vocab_size against the byte tokenizer gets one verdict from pydantic (`rlkube
validate`), the CRD (schema and CEL) and the runtime's config: where the actor's model.tokenizer is
'byte', the actor's model and each role's own model given by config embed its 259 ids."""

from __future__ import annotations

import copy

import pytest
from rltj_builders import ROLES, TINY_CONFIG, job
from verdicts import assert_one_verdict

from rlkube.runtime.contract.vocab import BYTE_IDS, BYTE_TOKENIZER, BYTE_VOCAB_SIZE
from rlkube.runtime.data.tokenizer import ByteTokenizer, load_tokenizer


def config(vocab_size=None) -> dict:
    out = {key: value for key, value in TINY_CONFIG.items() if key != "vocab_size"}
    return out if vocab_size is None else {**out, "vocab_size": vocab_size}


def with_role_model(algorithm: str, name: str, model: dict) -> dict:
    roles = copy.deepcopy(ROLES[algorithm])
    roles[name] = {"gpus": 1, "model": model} if name != "reference" else {"gpus": 0, "model": model}
    return roles


ACTOR = "spec.model.config.vocab_size"
CASES = [
    # (algorithm, spec overrides, refused)
    ("dpo", {"model": {"config": config(259)}}, None),
    ("dpo", {"model": {"config": config(258)}}, ACTOR),
    ("dpo", {"model": {"config": config(64), "tokenizer": "byte"}}, ACTOR),
    ("dpo", {"model": {"config": config()}}, None),  # unset: the model type's default, far larger
    # a tokenizer directory is read in the pod: its vocabulary is not known at admission
    ("dpo", {"model": {"config": config(64), "tokenizer": "/models/tokenizer"}}, None),
    ("dpo", {"model": {"path": "/models/actor"}}, None),
    # the type and bound the CRD declares
    ("dpo", {"model": {"config": config(0)}}, ACTOR),
    ("dpo", {"model": {"config": config("259")}}, ACTOR),
    ("dpo", {"model": {"config": config(True)}}, ACTOR),
    ("dpo", {"model": {"config": config(259.0)}}, ACTOR),
    # a role's own model reads the ids of the actor's tokenizer (its own tokenizer field is not read)
    ("ppo", {"roles": with_role_model("ppo", "critic", {"config": config(100)})}, "spec.roles.critic.model.config.vocab_size"),
    ("ppo", {"roles": with_role_model("ppo", "critic", {"config": config(100), "tokenizer": "/tok"})},
     "spec.roles.critic.model.config.vocab_size"),
    ("ppo", {"roles": with_role_model("ppo", "critic", {"config": config(259)})}, None),
    ("grpo", {"roles": with_role_model("grpo", "reward", {"config": config(200)})}, "spec.roles.reward.model.config.vocab_size"),
    ("dpo", {"roles": with_role_model("dpo", "reference", {"config": config(258)})},
     "spec.roles.reference.model.config.vocab_size"),
    ("ppo", {"model": {"config": config(), "tokenizer": "/models/tokenizer"},
             "roles": with_role_model("ppo", "critic", {"config": config(100)})}, None),
]


@pytest.mark.parametrize("algorithm, overrides, refused", CASES)
def test_vocab_size_gets_one_verdict_from_pydantic_the_crd_and_the_runtime(algorithm, overrides, refused):
    overrides = {**overrides, "model": {"dtype": "float32", **overrides.get("model", {"config": config(259)})}}
    assert_one_verdict(job(algorithm=algorithm, **overrides), refused)


def test_the_rules_read_the_byte_tokenizer_itself():
    tokenizer = load_tokenizer(BYTE_TOKENIZER)
    assert isinstance(tokenizer, ByteTokenizer) and tokenizer.vocab_size == BYTE_VOCAB_SIZE
    assert max(tokenizer.encode(bytes(range(BYTE_IDS)).decode("latin-1"))) < BYTE_IDS
    assert max(tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) == BYTE_VOCAB_SIZE - 1
