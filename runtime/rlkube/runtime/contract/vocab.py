"""The byte tokenizer's vocabulary, and the rules that a model given by `config` can embed every id
of the tokenizer that feeds it.

The trainer tokenizes with the actor's `model.tokenizer` alone: the actor generates and trains on
its ids, and a role's own model (a critic, reward or reference model) reads the same sequences (a
role's own `tokenizer` field is not read). A model whose `config.vocab_size` is below the
tokenizer's vocabulary indexes past its embedding table on the first id it cannot hold: a device
assert on CUDA, an IndexError on CPU, in the pod. The tokenizer's vocabulary is known at admission
only for the byte tokenizer (`BYTE_VOCAB_SIZE`; a tokenizer directory is read in the pod), and
`vocab_size` only where the config gives it (unset, transformers' default for the model type
holds far more), so these rules check that case; the runtime checks the actor's model against a
tokenizer read from a directory when it builds it.
"""

from __future__ import annotations

from typing import Any

from rlkube.runtime.contract.rule import Rule, when

# model.tokenizer's value for rlkube's built-in byte-level tokenizer (data/tokenizer.py).
BYTE_TOKENIZER = "byte"
# Its vocabulary: the 256 byte values are ids 0..255, then pad 256, bos 257 and eos 258.
BYTE_IDS = 256
BYTE_VOCAB_SIZE = BYTE_IDS + 3
VOCAB_SIZE = "vocab_size"  # the Hugging Face config's key

# (field path of the model, attribute chain from the spec); the actor's model first.
MODELS = (("model", ()), *((f"roles.{name}.model", (name,)) for name in ("critic", "reward", "reference")))


def vocab_size_problem(value: Any) -> str | None:
    """Why `value` cannot be a config's vocab_size (the CRD declares it an integer >= 1), or None."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"must be an integer >= 1, got {value!r}"
    return None


def _vocab_size(spec: Any, roles: tuple[str, ...]) -> int | None:
    """The vocab_size of the model at `roles` (the actor's for ()), None where it has no config
    or its config gives no valid vocab_size (`vocab_size_problem` reports that one)."""
    model = spec.model
    for name in roles:
        role = getattr(spec.roles, name)
        model = None if role is None else role.model
    if model is None or model.config is None or vocab_size_problem(model.config.get(VOCAB_SIZE)):
        return None
    return model.config[VOCAB_SIZE]


def _rule(where: str, roles: tuple[str, ...]) -> Rule:
    cel_model = "self." + ".".join(("roles", roles[0], "model") if roles else ("model",))
    guards = [f"has(self.roles.{roles[0]})", f"has({cel_model})"] if roles else []
    present = " && ".join([*guards, f"has({cel_model}.config)", f"has({cel_model}.config.{VOCAB_SIZE})"])
    byte = f"(has(self.model.tokenizer) ? self.model.tokenizer : '{BYTE_TOKENIZER}') == '{BYTE_TOKENIZER}'"
    reader = "the actor's model embeds the ids of" if not roles else f"the {roles[0]} role's model reads the ids of"

    def broken(spec: Any) -> str | None:
        size = _vocab_size(spec, roles)
        return when(spec.model.tokenizer == BYTE_TOKENIZER and size is not None and size < BYTE_VOCAB_SIZE,
                    f", got {size}")

    return Rule(
        f"{where}.config.{VOCAB_SIZE}: {reader} the byte tokenizer (model.tokenizer '{BYTE_TOKENIZER}'), "
        f"{BYTE_VOCAB_SIZE} of them ({BYTE_IDS} bytes, pad, bos, eos), which a smaller embedding table "
        f"cannot hold: must be >= {BYTE_VOCAB_SIZE}",
        f"!({present} && {byte}) || {cel_model}.config.{VOCAB_SIZE} >= {BYTE_VOCAB_SIZE}",
        broken,
        f".{where}.config.{VOCAB_SIZE}",
    )


VOCAB_RULES: tuple[Rule, ...] = tuple(_rule(where, roles) for where, roles in MODELS)
