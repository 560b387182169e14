"""The sections of the runtime's input: model, roles, data, batching, training, checkpoint, export
(the rollout section is `contract.rollout`), `device_map`, and each section's own rules.

These models are also the building blocks of the `RLTrainingJob` spec: the operator's API types
(`rlkube.operator.api`) embed `ModelSpec`, `RolesSpec`, `DataSpec`, `BatchingSpec`,
`TrainingSpec`, `RolloutSpec` and `CheckpointSpec` as they are, so a field is described,
bounded and validated in exactly one place, and the CRD (generated from the API types) carries
the same descriptions that `kubectl explain` shows. `contract.config` puts them together into
`RuntimeConfig` and is where the rest of the code imports them from; the rules across sections
(`role_rules`, `algorithm_settings`) read them from here.

Field names are snake_case in Python and camelCase on the wire (YAML, the CRD). Unknown fields
are errors. This module must stay importable without torch: the operator imports it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from rlkube.runtime.contract.role_rules import ROLES_RULES
from rlkube.runtime.contract.rule import Rule, check, when
from rlkube.runtime.contract.spec import MAX_NAME_LEN, MAX_PATH_LEN, ROLE_NAMES, Spec
from rlkube.runtime.contract.vocab import VOCAB_SIZE, vocab_size_problem

# The rules of one section, each a Python check and its CEL on the section's object (the operator
# puts the CEL into the CRD; rlkube.operator.validation). Rules across sections: role_rules (the
# roles), algorithm_settings (the spec).
MODEL_SOURCE = (
    Rule("exactly one of path and config must be set", "has(self.path) != has(self.config)",
         lambda model: when((model.path is None) == (model.config is None))),
)
ROLE_SOURCE = (
    Rule("exactly one of gpus and colocateWith must be set", "has(self.gpus) != has(self.colocateWith)",
         lambda role: when((role.gpus is None) == (role.colocate_with is None))),
)
EVAL_SOURCE = (
    Rule("eval: set eval or evalFraction, not both", "!has(self.eval) || !has(self.evalFraction)",
         lambda data: when(data.eval is not None and data.eval_fraction is not None), ".eval"),
)
MICRO_BATCH_BOUNDS = (
    Rule("maxMicroBatch: must be >= minMicroBatch", "self.maxMicroBatch >= self.minMicroBatch",
         lambda b: when(b.max_micro_batch < b.min_micro_batch, f" ({b.min_micro_batch}), got {b.max_micro_batch}"),
         ".maxMicroBatch"),
)


def optional_path(description: str) -> Any:
    """A path field that may be unset (None), but not empty, and no longer than MAX_PATH_LEN."""
    return Field(default=None, min_length=1, max_length=MAX_PATH_LEN, description=description)


class LoraSpec(Spec):
    """Low-rank adapters (LoRA) on the actor: only the adapters train; the base weights stay frozen
    and, with the adapters switched off, serve as the reference policy (no second copy)."""

    rank: int = Field(default=8, ge=1, le=4096, description="Rank r of each adapter's A (r x in) and B (out x r).")
    alpha: float = Field(
        default=16.0, gt=0.0, le=1e6, description="Scale of the adapters' output: alpha / rank."
    )
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout on the adapters' input.")
    target_modules: list[Annotated[str, Field(min_length=1, max_length=MAX_NAME_LEN)]] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        max_length=64,
        description="Names (last path component) of the linear layers that get adapters, for example "
        "q_proj, v_proj, gate_proj.",
    )


class ModelSpec(Spec):
    """Which model to train and how to run it."""

    path: str | None = optional_path(
        "Directory of a Hugging Face checkpoint, loaded with from_pretrained(path). "
        "Exactly one of path and config is set.",
    )
    config: dict[str, Any] | None = Field(
        default=None,
        max_length=256,
        description="A Hugging Face model config (as in config.json, must include model_type) for a "
        "randomly initialised model built with from_config. Exactly one of path and config is set.",
    )
    tokenizer: str = Field(
        default="byte",
        min_length=1,
        max_length=MAX_PATH_LEN,
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
    def _one_source(self) -> ModelSpec:
        check(MODEL_SOURCE, self)
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


class RoleSpec(Spec):
    """One role of the job (actor, critic, reward, reference) and its device group."""

    gpus: int | None = Field(
        default=None,
        ge=0,
        le=4096,
        description="GPUs in this role's own device group. Exactly one of gpus and colocateWith is "
        "set. 0 means the role runs on CPU inside the actor's processes (a rule-based reward, say).",
    )
    colocate_with: Literal["actor", "critic", "reward", "reference"] | None = Field(
        default=None,
        description="Share the device group of the named role instead of having GPUs of its own "
        "(time-shared in one process).",
    )
    model: ModelSpec | None = Field(
        default=None,
        description="This role's own model. Unset: the reference copies the actor's model; the "
        "critic uses the actor's model with a value head; the reward role needs either a model "
        "or a function.",
    )
    function: str | None = Field(
        default=None,
        max_length=MAX_PATH_LEN,
        pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$",
        description="Reward role only: import path 'package.module:function' of a rule-based reward "
        "function(prompt: str, completion: str) -> float, used instead of a reward model.",
    )

    @model_validator(mode="after")
    def _gpus_or_colocate(self) -> RoleSpec:
        check(ROLE_SOURCE, self)
        return self


class RolesSpec(Spec):
    """The job's roles. The actor is required; which others are allowed depends on the algorithm."""

    actor: RoleSpec = Field(description="The policy being trained; it also generates (hybrid engine).")
    critic: RoleSpec | None = Field(default=None, description="Value model (PPO only).")
    reward: RoleSpec | None = Field(
        default=None, description="Reward model, or a rule-based reward function (PPO, GRPO)."
    )
    reference: RoleSpec | None = Field(
        default=None, description="Frozen reference policy for the KL term (DPO, PPO, GRPO)."
    )

    def present(self) -> dict[str, RoleSpec]:
        """The roles that are set, in canonical order (actor, critic, reward, reference)."""
        return {name: role for name in ROLE_NAMES if (role := getattr(self, name)) is not None}

    @model_validator(mode="after")
    def _colocation(self) -> RolesSpec:
        check(ROLES_RULES, self)
        return self

    def group_owner(self, name: str) -> str:
        """The role whose GPUs `name` runs on (follows colocateWith to the end)."""
        roles = self.present()
        while roles[name].colocate_with is not None:
            name = roles[name].colocate_with  # type: ignore[assignment]
        return name

    def total_gpus(self) -> int:
        return sum(role.gpus or 0 for role in self.present().values())


def device_map(roles: RolesSpec) -> dict[str, list[int]]:
    """Global GPU ranks of each role: contiguous ranges in canonical role order.

    Roles with their own GPUs get consecutive ranges (actor first); colocated roles get the range
    of the role they colocate with; a role with `gpus: 0` runs on the actor's ranks (on CPU).
    Example: actor 2, critic 1, reward 1, reference colocated with actor ->
    {actor: [0, 1], critic: [2], reward: [3], reference: [0, 1]}.
    """
    present = roles.present()
    ranks: dict[str, list[int]] = {}
    next_rank = 0
    for name, role in present.items():
        if role.gpus:
            ranks[name] = list(range(next_rank, next_rank + role.gpus))
            next_rank += role.gpus
    for name in present:
        if name in ranks:
            continue
        owner = roles.group_owner(name)
        ranks[name] = list(ranks.get(owner, ranks["actor"]))
    return {name: ranks[name] for name in present}


class DataFields(Spec):
    """Which column of the data files holds each field rlkube reads; unset: the field's own name."""

    prompt: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_LEN, description="Prompt column.")
    chosen: str | None = Field(
        default=None, min_length=1, max_length=MAX_NAME_LEN, description="Preferred response column (DPO)."
    )
    rejected: str | None = Field(
        default=None, min_length=1, max_length=MAX_NAME_LEN, description="Dispreferred response column (DPO)."
    )
    completion: str | None = Field(
        default=None, min_length=1, max_length=MAX_NAME_LEN, description="Completion column (unpaired data)."
    )
    label: str | None = Field(
        default=None, min_length=1, max_length=MAX_NAME_LEN,
        description="Boolean column saying whether the completion is desirable (unpaired data).",
    )
    answer: str | None = Field(
        default=None, min_length=1, max_length=MAX_NAME_LEN,
        description="Reference answer column for rule-based rewards (PPO, GRPO).",
    )

    def column(self, name: str) -> str:
        """The column that holds field `name`."""
        return getattr(self, name) or name


class DataSpec(Spec):
    """Where training data comes from and how it is batched into tokens.

    packing, lengthBucketing, prefetch and lengthMix apply to DPO only: PPO and GRPO generate
    from left-padded prompts taken inside the step."""

    source: str = Field(
        min_length=1,
        max_length=MAX_PATH_LEN,
        description="Path of a JSONL or Parquet file (or a directory of them), or of a directory "
        "written by Hugging Face datasets' save_to_disk (format 'arrow'). For format 'synthetic', a "
        "free label; the data is generated from `seed`.",
    )
    format: Literal["jsonl", "parquet", "arrow", "synthetic"] = Field(
        default="jsonl",
        description="File format. Preference data has fields prompt, chosen, rejected (strings, or "
        "lists of {role, content} messages rendered with the tokenizer's chat template; without a "
        "prompt, the messages chosen and rejected share make it); prompt data (PPO, GRPO) has prompt "
        "and optionally answer.",
    )
    fields: DataFields = Field(
        default_factory=lambda: DataFields(),
        description="Column names in the files for the fields rlkube reads, when they differ from "
        "the field names (for example {prompt: question, chosen: good, rejected: bad}).",
    )
    skip_invalid: bool = Field(
        default=False,
        description="Skip malformed records (missing field, wrong type, empty text, too long for "
        "maxSeqLen), logging each and counting them, instead of failing on the first one.",
    )
    max_seq_len: int = Field(
        default=1024, ge=8, le=1_048_576, description="Longest sequence (prompt + response) in tokens; "
        "longer samples are truncated from the left of the prompt."
    )
    packing: bool = Field(
        default=True,
        description="DPO only: pack several samples into one row with per-sample position ids and "
        "a block mask, so no compute is spent on padding. PPO/GRPO never pack (they generate from "
        "left-padded prompts); the setting has no effect on them.",
    )
    length_bucketing: bool = Field(
        default=True,
        description="DPO only, when packing is off: group samples of similar length into a "
        "micro-batch to cut padding. PPO/GRPO do not bucket; the setting has no effect on them.",
    )
    prefetch: int = Field(
        default=2,
        ge=0,
        le=64,
        description="DPO only: micro-batches prepared ahead on a background thread (the next step's "
        "first ones while this step's last one runs; 0: none, each when it is needed). PPO/GRPO take "
        "their prompts inside the step and accept only 2 (the default) or 0.",
    )
    num_samples: int = Field(
        default=512,
        ge=1,
        le=100_000_000,
        description="Synthetic data only: number of samples (pairs for DPO, prompts for PPO/GRPO).",
    )
    length_mix: Literal["fixed", "longTailed"] = Field(
        default="fixed",
        description="Synthetic preference pairs (DPO) only: 'fixed' lengths, or a log-normal mix "
        "(median ~300 tokens, tail past 2,000) capped at maxSeqLen. PPO/GRPO's synthetic prompts "
        "have lengths of their own and accept only 'fixed'.",
    )
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed for data order and synthesis.")
    eval: str | None = optional_path(
        "Evaluation data: a JSONL or Parquet file, a directory of them, or a save_to_disk "
        "directory, with the training data's fields (the format is read from the path; data.format where "
        "it cannot be). Not combinable with evalFraction.",
    )
    eval_fraction: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description="Hold out this fraction of the training data for evaluation (at least one sample), "
        "chosen by data.seed, so the same samples are held out on every rank and after a restart.",
    )

    @model_validator(mode="after")
    def _one_eval_source(self) -> DataSpec:
        check(EVAL_SOURCE, self)
        return self


class BatchingSpec(Spec):
    """How many samples make an optimizer step and how they are split into micro-batches.

    Every field applies to every algorithm. On a GPU the runtime plans its memory before the
    first step (weights, gradients, optimizer state, KV cache, a reserve) and sizes training
    micro-batches, forward-only passes and decode rows from what is left of memoryFraction of
    the card; an out-of-memory error halves the budget and redoes the work."""

    global_batch: int = Field(
        default=32,
        ge=1,
        le=1_048_576,
        description="Samples (pairs for DPO, prompts for PPO/GRPO) per optimizer step across all "
        "workers. Kept fixed when workers or micro-batches change.",
    )
    mode: Literal["fixed", "adaptive"] = Field(
        default="adaptive",
        description="'adaptive': micro-batches cut by a token budget (from the memory plan on a GPU, "
        "maxTokensPerGpu on a CPU) that follows each step's measured peak memory. 'fixed': "
        "micro-batches of maxMicroBatch samples (DPO) or rollout rows (PPO/GRPO), whatever they cost. "
        "In both, an out-of-memory error shrinks the micro-batch and redoes the work.",
    )
    min_micro_batch: int = Field(
        default=1,
        ge=1,
        le=65536,
        description="Smallest micro-batch (samples for DPO, rollout rows for PPO/GRPO) the adaptive "
        "batcher plans, whatever the token budget.",
    )
    max_micro_batch: int = Field(
        default=64,
        ge=1,
        le=65536,
        description="Largest micro-batch, in samples (DPO) or rollout rows (PPO/GRPO: prompts x "
        "groupSize), whatever the token budget.",
    )
    max_tokens_per_gpu: int | None = Field(
        default=None,
        ge=64,
        le=16_777_216,
        description="Token budget of one training micro-batch on one GPU (packed tokens, or rows x "
        "longest row when padded; PPO/GRPO rows are padded). Unset: the memory plan's on a GPU, 16384 "
        "on a CPU. Set: the plan's budget is capped at this value (DPO's adaptive batcher may grow "
        "past it when measured memory allows, as before).",
    )
    memory_fraction: float = Field(
        default=0.9,
        ge=0.3,
        le=0.98,
        description="Share of the GPU's memory the memory plan and the adaptive batcher may fill "
        "(peak reserved memory, CUDA context included). The rest is headroom.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> BatchingSpec:
        check(MICRO_BATCH_BOUNDS, self)
        return self


class TrainingSpec(Spec):
    """Optimizer and algorithm settings."""

    steps: int = Field(default=100, ge=1, le=100_000_000, description="Optimizer steps to run.")
    lr: float = Field(default=1e-5, gt=0.0, le=1.0, description="Peak learning rate (AdamW).")
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0, description="AdamW weight decay.")
    warmup_steps: int = Field(default=0, ge=0, le=100_000_000, description="Linear warm-up steps.")
    max_grad_norm: float = Field(default=1.0, gt=0.0, le=1e6, description="Gradient clipping norm.")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed for initialisation and sampling.")
    # DPO
    beta: float = Field(default=0.1, gt=0.0, le=100.0, description="DPO: strength of the implicit KL.")
    loss_type: Literal["sigmoid", "ipo"] = Field(default="sigmoid", description="DPO: loss form.")
    # PPO / GRPO
    clip: float = Field(default=0.2, gt=0.0, le=10.0, description="PPO/GRPO: policy ratio clip epsilon.")
    clip_high: float | None = Field(
        default=None,
        gt=0.0,
        le=10.0,
        description="GRPO clip-higher: upper clip epsilon (defaults to clip).",
    )
    value_clip: float = Field(default=0.2, gt=0.0, le=1e6, description="PPO: value loss clip range.")
    kl: float = Field(
        default=0.0,
        ge=0.0,
        le=100.0,
        description="PPO/GRPO: KL coefficient to the reference; > 0 needs roles.reference.",
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        default="k3",
        description="PPO/GRPO: per-token KL estimator, with r = pi_ref / pi on tokens sampled from pi: "
        "k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r (algorithms/ppo.py, docs/algorithms.md). "
        "k1 only in the reward (ppo with klInReward): as a loss its expected gradient is 0.",
    )
    kl_in_reward: bool = Field(
        default=False, description="PPO: subtract the KL from the reward (True) or add it as a loss (False)."
    )
    entropy_coef: float = Field(default=0.0, ge=0.0, le=10.0, description="PPO/GRPO: entropy bonus.")
    gamma: float = Field(default=1.0, ge=0.0, le=1.0, description="PPO: GAE discount.")
    gae_lambda: float = Field(default=0.95, ge=0.0, le=1.0, alias="lambda", description="PPO: GAE lambda.")
    group_size: int = Field(
        default=4,
        ge=1,
        le=1024,
        description="GRPO: completions sampled per prompt; at least 2, since advantages are rewards "
        "relative to the group's mean.",
    )
    scale_rewards: bool = Field(
        default=True,
        description="GRPO: divide each completion's advantage by its group's reward std (DeepSeekMath); "
        "false only subtracts the group mean (Dr. GRPO).",
    )
    loss_aggregation: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = Field(
        default="token-mean",
        description="PPO/GRPO: how the actor's per-token loss becomes one number: the mean over every "
        "response token of the mini-batch, or the mean over its sequences of each sequence's token sum "
        "or token mean (verl's loss_agg_mode).",
    )
    fused_logprobs: bool = Field(
        default=True,
        description="Take per-token log-probs (and the PPO/GRPO entropy) through the lm head chunk by chunk, "
        "never holding the [tokens, vocab] logits (a chunk's logits are recomputed in the backward pass); "
        "false materialises them all (more memory, one matmul less). Same values to fp32 rounding.",
    )
    ppo_epochs: int = Field(default=1, ge=1, le=100, description="PPO/GRPO: passes over each rollout.")
    mini_batches: int = Field(default=1, ge=1, le=4096, description="PPO/GRPO: optimizer steps per epoch of a rollout.")
    trainable_modules: list[Annotated[str, Field(min_length=1, max_length=MAX_NAME_LEN)]] | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Partial freezing: train only the actor's parameters whose name in the Hugging Face "
        "model contains one of these strings (for example ['layers.1.', 'lm_head']); the others get no "
        "gradient, no optimizer state and no gradient reduction. Unset: every parameter trains.",
    )
    eval_every_steps: int | None = Field(
        default=None, ge=1, le=100_000_000,
        description="Evaluate every N steps on data.eval or data.evalFraction (DPO/KTO: reward accuracy and "
        "margin; PPO/GRPO: mean reward of greedy completions). Unset: only after the last step.",
    )
    # KTO
    kto_desirable_weight: float = Field(
        default=1.0, gt=0.0, le=1000.0,
        description="KTO: weight of the loss of desirable completions (lambda_D of the KTO paper).",
    )
    kto_undesirable_weight: float = Field(
        default=1.0, gt=0.0, le=1000.0,
        description="KTO: weight of the loss of undesirable completions (lambda_U); with unbalanced data "
        "the KTO paper keeps lambda_D * desirable / (lambda_U * undesirable) in [1, 4/3].",
    )


class CheckpointSpec(Spec):
    """Where and how often the trainer checkpoints."""

    dir: str = Field(
        default="/checkpoints", min_length=1, max_length=MAX_PATH_LEN, description="Checkpoint directory in the pod."
    )
    every_steps: int = Field(default=50, ge=1, le=100_000_000, description="Checkpoint every N steps.")
    keep: int = Field(default=2, ge=1, le=1000, description="Committed checkpoints to keep.")
    volume_claim: str | None = Field(
        default=None,
        max_length=MAX_NAME_LEN,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="PersistentVolumeClaim mounted at dir (shared by all pods). Unset: a hostPath "
        "per node under /var/lib/rlkube/<namespace>/<job>-<uid>, so a restarted gang on the same nodes "
        "resumes and a re-created job starts fresh.",
    )
    compile_cache_dir: str | None = optional_path(
        "Where torch.compile keeps its caches (compiled graphs and kernels). Unset: "
        "<dir>/.compile-cache, so this job's restarts reuse its compiled graphs. A directory on a volume "
        "several jobs mount read-write (spec.volumes) lets a job's first start reuse the graphs an earlier "
        "job compiled for the same model shape, torch version and GPU type. The TORCHINDUCTOR_CACHE_DIR "
        "environment variable, where set, wins.",
    )


class ExportSpec(Spec):
    """The trained actor as a Hugging Face model directory (config, safetensors, tokenizer)."""

    enabled: bool = Field(default=True, description="Export at the end of training (and every everySteps).")
    dir: str | None = optional_path(
        "Directory of the export in the pod, replaced atomically by each export. Unset: "
        "<checkpoint.dir>/export, on the checkpoint volume.",
    )
    every_steps: int | None = Field(
        default=None, ge=1, le=100_000_000,
        description="Also export every N steps. Unset: only after the last step.",
    )
    merge_lora: bool = Field(
        default=False,
        description="LoRA runs: also write the model with the adapters folded into its weights (a plain "
        "Hugging Face model) in dir; the adapter itself (PEFT's format) is always written, in dir/adapter.",
    )
