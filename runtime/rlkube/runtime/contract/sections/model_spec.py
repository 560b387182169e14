"""`model`: which model a run trains (a Hugging Face checkpoint or a config), its dtype, kernels
and compilation, and LoRA adapters; with its own rules (one source, a config's model_type and
vocab_size). The same `ModelSpec` is a role's own model (`roles.<role>.model`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from rlkube.runtime.contract.rule import Rule, when
from rlkube.runtime.contract.spec import MAX_NAME_LEN, MAX_PATH_LEN, Spec, optional_path
from rlkube.runtime.contract.vocab import VOCAB_SIZE, vocab_size_problem

# Each rule of a section is a Python check and its CEL on the section's object (the operator puts
# the CEL into the CRD; rlkube.operator.api.validation).
MODEL_SOURCE = (
    Rule("exactly one of path and config must be set", "has(self.path) != has(self.config)",
         lambda model: when((model.path is None) == (model.config is None))),
)


class LoraSpec(Spec):
    """Low-rank adapters (LoRA) on the actor: only the adapters train; the base weights stay frozen
    and, with the adapters switched off, serve as the reference policy (no second copy)."""

    rank: int = Field(default=8, ge=1, le=4096, description="Rank r of each adapter's A (r x in) and B (out x r).")
    alpha: float = Field(
        default=16.0, gt=0.0, le=1e6, description="Scale of the adapters' output: alpha / rank."
    )
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout on the adapters' input.")
    target_modules: list[Annotated[str, Field(min_length=1, max_length=MAX_NAME_LEN)]] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1, max_length=64,
        description="Names (last path component) of the linear layers that get adapters, for example "
        "q_proj, v_proj, gate_proj.",
    )


class ModelSpec(Spec):
    """Which model to train and how to run it."""

    RULES = MODEL_SOURCE

    path: str | None = optional_path(
        "Directory of a Hugging Face checkpoint, loaded with from_pretrained(path). "
        "Exactly one of path and config is set.",
    )
    config: dict[str, Any] | None = Field(
        default=None, max_length=256,
        description="A Hugging Face model config (as in config.json, must include model_type) for a "
        "randomly initialised model built with from_config. Exactly one of path and config is set.",
    )
    tokenizer: str = Field(
        default="byte", min_length=1, max_length=MAX_PATH_LEN,
        description="Tokenizer directory for from_pretrained, or 'byte' for rlkube's built-in "
        "byte-level tokenizer (256 byte tokens plus pad/bos/eos).",
    )
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="Parameter and compute dtype."
    )
    attention: Literal["auto", "sdpa", "flash_attention_2", "flex_attention", "eager"] = Field(
        default="auto",
        description="Attention kernel. 'auto' picks flash_attention_2 when it is installed and the "
        "device is CUDA; else, for packed DPO/KTO rows on CUDA, flex_attention with a document mask; "
        "else sdpa. The choice is logged.",
    )
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute activations in the backward pass to save memory."
    )
    compile: Literal["auto", "layers", "off"] = Field(
        default="auto",
        description="DPO/KTO: torch.compile each decoder layer of the actor and reference (regional "
        "compilation: norms, rotary, activation and residual ops fused around the matmuls). 'auto' is "
        "'layers' on CUDA and 'off' on CPU; the first steps pay the compile (logged). PPO/GRPO: 'auto' "
        "generates through the actor's layers compiled on CUDA (the KV cache written outside the "
        "graphs) and scores and trains the actor, critic and reference through compiled layers where "
        "the role runs on one GPU (an FSDP-sharded role scores and trains uncompiled); 'layers' "
        "compiles them on every device and sharding.",
    )
    lora: LoraSpec | None = Field(
        default=None,
        description="Actor only: train low-rank adapters instead of every weight. The reference is the "
        "same weights with the adapters off, so a colocated reference costs no memory.",
    )

    @model_validator(mode="after")
    def _model_config(self) -> ModelSpec:
        # Runs after `RULES` (one of path and config) hold.
        # The CRD's twin is the schema's `required: [model_type]` inside config.
        if self.config is not None and "model_type" not in self.config:
            raise ValueError("config must include model_type (for example 'qwen2' or 'llama')")
        # The CRD declares it an integer >= 1; whether it holds the tokenizer's ids is a rule on
        # the spec (vocab.VOCAB_RULES): the tokenizer that feeds a role's model is the actor's.
        if self.config is not None and VOCAB_SIZE in self.config:
            problem = vocab_size_problem(self.config[VOCAB_SIZE])
            if problem:
                raise ValueError(f"config.{VOCAB_SIZE}: {problem}")
        return self
