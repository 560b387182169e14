"""Building the models a role needs: load or create, pick the attention kernel, shard.

- `build_causal_lm(spec, device)`: a real checkpoint from `path` (local files only: no hub is
  reachable from pods), or `from_config` for a randomly initialised model (tiny test models,
  benchmark shapes). Parameters in `spec.dtype`, made on `device` from the start: a checkpoint's
  tensors are read from its safetensors files straight onto the device one at a time (into a
  model built there), never as a whole second copy in host memory; `from_pretrained` with a
  device map does the same when accelerate is installed, and plain `from_pretrained` + `.to`
  is the fallback (warned once) for checkpoints without safetensors or with renamed keys.
- `pick_attention(spec.attention, device, packed)`: 'auto' is flash_attention_2 when the flash_attn
  package is importable and the device is CUDA; else, when the caller packs several sequences
  into a row (DPO/KTO with data.packing) on CUDA, torch's flex_attention with a document mask
  (engine/logprobs.py builds it once per micro-batch); else sdpa. An explicit choice that cannot
  run (flash_attention_2 without the package or without CUDA) is replaced by sdpa with one loud
  warning. The choice is logged.
- `avoid_cudnn_sdpa()`: for callers that feed sdpa rows whose shapes change every micro-batch.
- `compile_layers(model, requested, device)`: regional torch.compile of the decoder layers
  (`model.compile`), for training: DPO/KTO on CUDA, PPO/GRPO when asked for ('layers').
- `shard(module, ctx, role)`: FSDP2 `fully_shard` over the role's process group, one unit per
  decoder layer plus the root, when the group has more than one rank; bf16 compute with fp32
  gradient reduction. A one-rank group is left alone.
- `frozen_copy(model)`: the reference policy, colocated with the actor: a copy of the actor's
  initial weights, eval mode, `requires_grad=False`, used under `torch.no_grad()` only.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
from contextlib import contextmanager
from pathlib import Path

import torch

from rlkube.runtime.contract.config import ModelSpec
from rlkube.runtime.infra.distributed import DistContext
from rlkube.runtime.infra.log import warn_once

log = logging.getLogger("rlkube.runtime")

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def flash_attn_available() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def flex_attention_available() -> bool:
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def pick_attention(requested: str, device: torch.device, packed: bool = False) -> str:
    """The attention implementation to use for `requested` on `device` (logged); `packed`: the
    caller lays several sequences end to end in a row and needs a kernel that keeps them apart."""
    cuda = device.type == "cuda"
    if requested == "auto":
        if cuda and flash_attn_available():
            chosen = "flash_attention_2"
        elif cuda and packed and flex_attention_available():
            chosen = "flex_attention"
        else:
            chosen = "sdpa"
    elif requested == "flash_attention_2" and not (cuda and flash_attn_available()):
        why = "the flash_attn package is not installed" if cuda else "the device is not CUDA"
        warn_once("attention", f"model.attention=flash_attention_2 but {why}; using sdpa instead")
        chosen = "sdpa"
    else:
        chosen = requested
    log.info("attention: requested %s, using %s on %s", requested, chosen, device.type)
    return chosen


def avoid_cudnn_sdpa(device: torch.device) -> None:
    """Take cuDNN out of sdpa's choice of kernels (process-wide), leaving flash and
    memory-efficient attention. torch 2.11 prefers cuDNN's attention on Hopper, and cuDNN builds an
    execution plan for every new (rows, length) shape: measured on an H200 (tests/gpu/profile_step.py,
    DPO with one sequence a row, lengths changing every micro-batch) ~2.5 ms of host time per
    attention call, the GPU idle ~40% of the step, and steps of 3.3 s that took 1.4-1.5 s without it."""
    if device.type == "cuda" and hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)
        log.info("sdpa: cuDNN attention off (shapes change every micro-batch); flash/efficient kernels")


def resolve_dtype(spec: ModelSpec, device: torch.device) -> torch.dtype:
    dtype = DTYPES[spec.dtype]
    if device.type == "cpu" and dtype == torch.float16:
        warn_once("dtype", "model.dtype=float16 is slow and unstable on CPU; using float32 instead")
        return torch.float32
    return dtype


def build_causal_lm(
    spec: ModelSpec, device: torch.device, seed: int = 0, packed: bool = False, weights: bool = True,
) -> tuple[torch.nn.Module, str]:
    """The causal LM of `spec` on `device`, and the attention implementation it uses (`packed`: see
    pick_attention). `weights=False`: the caller overwrites every parameter next (a trained role
    resuming from a checkpoint), so the weight files of `spec.path` are not read; only its config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    attention = pick_attention(spec.attention, device, packed)
    dtype = resolve_dtype(spec, device)
    hf_config = None
    if spec.path is not None and weights:
        model = load_pretrained(spec.path, dtype, attention, device)
    elif spec.path is not None:
        hf_config = AutoConfig.from_pretrained(spec.path, local_files_only=True)
        log.info("model.path %s: weights not read, the checkpoint being resumed holds them", spec.path)
    else:
        fields = dict(spec.config or {})
        model_type = fields.pop("model_type")
        try:
            hf_config = AutoConfig.for_model(model_type, **fields)
        except (ValueError, TypeError) as e:
            raise ValueError(f"model.config: {e}") from None
    if hf_config is not None:
        # Same seed -> same initial weights on every rank, so an unsharded model starts equal.
        # Initialised directly on the device: a 1.5B model takes a minute to initialise on a CPU.
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, attn_implementation=attention)
    if attention == "flex_attention" and spec.attention == "auto" and head_dim(model.config) < 16:
        # flex's CUDA kernel needs a head dimension of at least 16 (tiny test models have 8)
        log.info("attention: head dim %d < 16, flex_attention cannot run it; using sdpa", head_dim(model.config))
        model.set_attn_implementation("sdpa")
        attention = "sdpa"
    model.config.use_cache = False
    if spec.gradient_checkpointing:
        activation_checkpointing(model, True)
    # from_pretrained hands a model over in eval mode. A model built here is trained unless its
    # caller freezes it (frozen models call eval()): in eval mode transformers skips gradient
    # checkpointing, and a compiled layer's graphs guard on the flag (a critic left in eval mode
    # next to an actor in train mode compiled a training graph of its own).
    model.train()
    return model.to(device), attention


def activation_checkpointing(model: torch.nn.Module, on: bool) -> None:
    """Recompute activations in the backward pass (`on`), or stop. transformers 5.x renamed
    `gradient_checkpointing_*` to `activation_checkpointing_*`; where a version has the new names
    the old ones warn (FutureWarning) in every run's log, so the new ones are used when present."""
    if on:
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        disable = getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable
        disable()


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def load_pretrained(path: str, dtype: torch.dtype, attention: str, device: torch.device) -> torch.nn.Module:
    """The checkpoint at `path` on `device` in `dtype`, without a full copy in host memory."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if importlib.util.find_spec("accelerate") is not None:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attention,
                                                    local_files_only=True, device_map={"": device})
    files = sorted(Path(path).glob("*.safetensors"))
    if files:
        hf_config = AutoConfig.from_pretrained(path, local_files_only=True)
        # Built on the device (random init there takes milliseconds), then overwritten tensor by tensor.
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, attn_implementation=attention)
        if _copy_safetensors(model, files, device):
            return model
        del model
    warn_once("model-load", f"model.path {path}: no safetensors with the model's own names; loading with "
              "from_pretrained on the host, then moving to the device (a second copy while it moves)")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attention,
                                                 local_files_only=True)
    return model.to(device)


def _copy_safetensors(model: torch.nn.Module, files: list[Path], device: torch.device) -> bool:
    """Copy every tensor of `files` into `model`'s parameter of the same name; False (model left
    half-written, to be discarded) when a name is unknown or a parameter stays unwritten."""
    from safetensors import safe_open

    own = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    written: set[str] = set()
    with torch.no_grad():
        for file in files:
            with safe_open(str(file), framework="pt", device=str(device)) as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is no mapping)
                    if name not in own:
                        return False
                    own[name].copy_(f.get_tensor(name))
                    written.add(name)
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
        tied = {n for n, p in model.named_parameters(remove_duplicate=False)
                if p is model.get_input_embeddings().weight}
        written |= tied
    missing = {n for n, _ in model.named_parameters(remove_duplicate=False)} - written
    return not missing


@contextmanager
def evaluating(model: torch.nn.Module):
    """Within: `model` in eval mode (no dropout), its mode restored after. For passes without a
    backward (generation, old log-probs, values, the eval set): what they score is the model's
    distribution, not one dropout sample of it, and they share one compiled graph."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A forward-only copy: the reference policy."""
    ref = copy.deepcopy(model)
    if any(getattr(m, "gradient_checkpointing", False) for m in ref.modules()):  # what either property reads
        activation_checkpointing(ref, False)  # nothing to recompute without a backward
    ref.eval()
    ref.requires_grad_(False)
    return ref


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks of an HF causal LM (the FSDP units)."""
    lm = getattr(model, "lm", model)
    body = lm.get_decoder() if hasattr(lm, "get_decoder") else getattr(lm, "model", lm)
    layers = getattr(body, "layers", None) or getattr(body, "h", None)
    if layers is None:
        raise TypeError(f"{type(lm).__name__}: cannot find decoder layers to shard")
    return list(layers)


# The shortest packed row a compiled layer is given (trainers pad shorter ones up to it). The
# first compile is dynamic in the row length, but inductor guards its kernels on ranges of it
# (seen on an H200 with torch 2.11: `4096 <= length` for 32-bit indexing, `hidden * length <
# 5242880` for a fusion choice); a micro-batch below them recompiled the layer twice more (5.5 s).
COMPILED_MIN_TOKENS = 4096


def compile_wanted(requested: str, device: torch.device, auto: bool = True) -> bool:
    """model.compile: 'layers' always, 'off' never, 'auto' on CUDA where the caller's `auto` says
    compiling that pass was measured to pay: DPO/KTO training, RL decoding, and RL scoring and
    training of a role on one GPU (H200, 2026-12-05: GRPO +23% and PPO +19% tokens/s, see
    docs/benchmarks.md); not yet an FSDP-sharded role's scoring and training (unmeasured)."""
    return requested == "layers" or (requested == "auto" and auto and device.type == "cuda")


def compile_layers(model: torch.nn.Module, requested: str, device: torch.device, auto: bool = True) -> bool:
    """Regional compilation: `torch.compile` on each decoder layer of `model` in place, where
    `requested` asks for it (compile_wanted, `auto` as there). One layer's graph serves every
    layer (same code, same shapes), so the compile is paid once, not once per layer. Shapes are
    dynamic from the first compile: with the default (static first, dynamic on the second distinct
    length) a long-tailed DPO run compiled each layer graph twice, 35 s and then 24 s in its second
    step. Training and a no-grad reference forward still get a graph each (grad mode is guarded).
    Call it after any copy of the model is made (a deep copy of a compiled layer would call the
    original's forward) and before FSDP wraps the layers. Returns whether it compiled."""
    if not compile_wanted(requested, device, auto):
        return False
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile(dynamic=True)
    log.info("compile: %d decoder layers through torch.compile (model.compile=%s)", len(layers), requested)
    return True


def compile_role(model: torch.nn.Module, requested: str, ctx: DistContext, role: str) -> bool:
    """compile_layers for a PPO/GRPO role's scoring and training: 'auto' compiles a role that runs
    on one GPU (measured to pay) and leaves an FSDP-sharded one uncompiled (not measured yet)."""
    return compile_layers(model, requested, ctx.device, auto=not ctx.sharded(role))


def shard(module: torch.nn.Module, ctx: DistContext, role: str = "actor") -> torch.nn.Module:
    """FSDP2 over the ranks of `role` (no-op for a one-rank group or a non-distributed run)."""
    if not ctx.sharded(role):
        return module
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    group = ctx.group(role)
    if group is None:
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    else:
        mesh = DeviceMesh.from_group(group, ctx.device.type)
    param_dtype = next(module.parameters()).dtype
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(module):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(module, mesh=mesh, mp_policy=mp)
    return module


def count_parameters(model: torch.nn.Module) -> dict[str, int]:
    """Total, embedding and non-embedding parameter counts (for MFU)."""
    lm = getattr(model, "lm", model)
    total = sum(p.numel() for p in lm.parameters())
    emb = lm.get_input_embeddings().weight.numel()
    head = lm.get_output_embeddings().weight
    tied = head is lm.get_input_embeddings().weight
    return {
        "total": total,
        "embedding": emb,
        "head": head.numel(),
        "tied": int(tied),
        "body": total - emb - (0 if tied else head.numel()),
    }


def parameter_storage_bytes(*modules: torch.nn.Module) -> int:
    """Bytes of parameter storage the modules hold, each storage counted once: a LoRA reference
    that is a view of the actor adds nothing, a separate reference copy adds its own."""
    seen, total = set(), 0
    for module in modules:
        for p in module.parameters():
            storage = p.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total
