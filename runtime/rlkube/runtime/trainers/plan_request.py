"""What this GPU will hold, read from the config before any weight is loaded: the memory plan's
request (memory_plan.PlanRequest).

Each role's model is built on the meta device (shapes only, no memory, about a second for a 7B
config) to count its parameters exactly, LoRA adapters and `training.trainableModules` included.
The card's capacity and what it already holds come from CUDA; on a CPU there is no card to plan
for, and batches come from `batching.maxTokensPerGpu` alone (batching.CPU_TOKEN_BUDGET when unset).
"""

from __future__ import annotations

import gc

import torch

from rlkube.runtime.contract.config import ModelSpec, RuntimeConfig
from rlkube.runtime.engine.freezing import freeze_except
from rlkube.runtime.engine.models import DTYPES
from rlkube.runtime.infra.distributed import DistContext
from rlkube.runtime.infra.log import log
from rlkube.runtime.trainers.memory_plan import HeldModel, MemoryPlan, ModelShape, PlanRequest, make_plan


def device_memory(device: torch.device) -> tuple[int, int] | None:
    """(capacity, bytes already in use) of `device`'s card; None where there is nothing to plan
    for (a CPU). The tests replace this to plan for a card of their choosing on the CPU."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return total, total - free


def free_device_memory() -> None:
    """After an out-of-memory error: drop what the failed work left (its tensors are garbage once the
    exception is handled) and give the caching allocator's free blocks back, so a redo at a smaller
    budget starts from the plan's memory, not from the fragments of the failed attempt."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _hf_config(spec: ModelSpec):
    from transformers import AutoConfig

    if spec.path is not None:
        return AutoConfig.from_pretrained(spec.path, local_files_only=True)
    fields = dict(spec.config or {})
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def _lora_parameters(lm: torch.nn.Module, spec) -> int:
    """Adapter parameters `spec` adds: r x (in + out) for each targeted linear layer."""
    head = lm.get_output_embeddings()
    total = 0
    for name, module in lm.named_modules():
        if module is head or name.rsplit(".", 1)[-1] not in spec.target_modules:
            continue
        if isinstance(module, torch.nn.Linear):
            total += spec.rank * (module.in_features + module.out_features)
        elif isinstance(module, torch.nn.Embedding):
            total += spec.rank * (module.num_embeddings + module.embedding_dim)
    return total


def held_model(role: str, spec: ModelSpec, shards: int, trains: bool, trainable_modules=None) -> HeldModel:
    """`role`'s model of `spec` as one GPU holds it (counted on the meta device)."""
    from transformers import AutoModelForCausalLM

    hf_config = _hf_config(spec)
    dtype = DTYPES[spec.dtype]
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    params = sum(p.numel() for p in lm.parameters())
    trainable = 0
    if trains and spec.lora is not None:
        trainable = _lora_parameters(lm, spec.lora)
        params += trainable
    elif trains and trainable_modules is not None:
        trainable = freeze_except(lm, trainable_modules)["trainable"]
    elif trains:
        trainable = params
    return HeldModel(role, ModelShape.of(hf_config), params, trainable, dtype.itemsize, shards,
                     checkpointing=spec.gradient_checkpointing and trains)


def plan_memory(config: RuntimeConfig, ctx: DistContext, models: list[HeldModel], decode_rows: int = 0,
                prompt_tokens: int = 0) -> MemoryPlan | None:
    """This GPU's plan for `models` (None on a CPU); DoesNotFit when they cannot fit at all."""
    memory = device_memory(ctx.device)
    if memory is None:
        return None
    capacity, in_use = memory
    b = config.batching
    request = PlanRequest(
        capacity=capacity, fraction=b.memory_fraction, in_use=in_use, models=tuple(models),
        row_tokens=config.data.max_seq_len, decode_rows=decode_rows, prompt_tokens=prompt_tokens,
        new_tokens=config.rollout.episode_tokens if decode_rows else 0,  # a multi-turn row: its whole episode
        decode_rows_cap=config.rollout.decode_rows, train_tokens_cap=b.max_tokens_per_gpu,
    )
    plan = make_plan(request)
    log.info("memory plan: %s", plan.describe())
    return plan


def shards_of(ctx: DistContext, role: str) -> int:
    """Ranks `role` is FSDP-sharded over (1 when it is not sharded)."""
    return len(ctx.role_ranks[role]) if ctx.sharded(role) else 1


def preference_models(config: RuntimeConfig, ctx: DistContext) -> list[HeldModel]:
    """DPO/KTO: the trained policy and its frozen reference (none with LoRA and no reference
    model of its own: the reference is the policy with its adapters off)."""
    held = [held_model("actor", config.model, shards_of(ctx, "actor"), True, config.training.trainable_modules)]
    ref = config.roles.reference
    ref_spec = ref.model if ref is not None else None
    if ref_spec is not None or config.model.lora is None:
        held.append(held_model("reference", ref_spec or config.model, shards_of(ctx, "actor"), False))
    return held


def staging_of(plan: MemoryPlan | None) -> str:
    """Where background checkpoints take their snapshot (infra/checkpoint.Checkpointer's staging):
    on the GPU where the plan counted it, in host memory where it did not; without a plan, as the
    checkpointer judges."""
    if plan is None:
        return "auto"
    return "device" if plan.snapshot_on_device else "host"


def reference_shares_actor(config: RuntimeConfig, ranks: dict[str, list[int]]) -> bool:
    """A LoRA actor's reference is the actor with its adapters off: no second copy of the base,
    where the reference runs on the actor's ranks and names no model of its own."""
    ref = config.roles.reference
    return (config.model.lora is not None and ref is not None and ref.model is None
            and ranks.get("reference") == ranks.get("actor"))


def plan_rl_memory(config: RuntimeConfig, ctx: DistContext, here: set[str], with_critic: bool, actor_rows: int,
                   prompt_width: int | None) -> MemoryPlan | None:
    """This GPU's memory plan for the RL roles it holds (None on a CPU); DoesNotFit (exit 3) when
    they cannot fit, before any weight is loaded. `actor_rows`: the rows this GPU's actor
    generates per step (0 without the actor)."""
    roles, t = config.roles, config.training
    held = []
    if "actor" in here:
        held.append(held_model("actor", config.model, shards_of(ctx, "actor"), True, t.trainable_modules))
    if with_critic and "critic" in here:
        critic = (roles.critic.model or config.model).model_copy(update={"lora": None})  # trained in full
        held.append(held_model("critic", critic, shards_of(ctx, "critic"), True))
    if t.kl > 0 and "reference" in here and not reference_shares_actor(config, config.device_map or {}):
        held.append(held_model("reference", roles.reference.model or config.model, shards_of(ctx, "reference"),
                               False))
    if roles.reward is not None and roles.reward.model is not None and "reward" in here:
        held.append(held_model("reward", roles.reward.model, 1, False))
    if not held:
        return None
    return plan_memory(config, ctx, held, actor_rows, prompt_width or 0)
