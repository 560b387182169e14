"""What this GPU will hold, read from the config before any weight is loaded: the memory plan's
request (memory_plan.PlanRequest).

Each role's model is built on the meta device (shapes only, no memory, about a second for a 7B
config) to count its parameters exactly, LoRA adapters and `training.trainableModules` included.
The card's capacity and what it already holds come from CUDA; on a CPU there is no card to plan
for, and batches come from `batching.maxTokensPerGpu` alone (batching.CPU_TOKEN_BUDGET when unset).
"""

from __future__ import annotations

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
        new_tokens=config.rollout.max_new_tokens if decode_rows else 0,
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
