"""Partial freezing: train only the actor's parameters named by `training.trainableModules`.

A parameter is trained when one of the patterns is a substring of one of its names in the
Hugging Face model (`model.layers.1.mlp.up_proj.weight`, `lm_head.weight`); every other one gets
`requires_grad=False` before the model is sharded. What that buys, and why it is done that way:

- no gradient: autograd never computes one for a frozen parameter, and a frozen embedding at the
  bottom of the stack ends the backward pass early;
- no optimizer state: `Trainer.adamw` hands AdamW only the parameters that require grad, so the
  two fp32-sized moments of every frozen parameter are never allocated (nor checkpointed);
- no gradient reduction: FSDP2 reduce-scatters only the parameters that have a gradient, so a
  frozen parameter costs no communication either (its shards are still all-gathered for the
  forward: it is used, just not trained).

A tied lm head and embedding are one parameter with two names: naming either trains it. A pattern
that matches nothing is a configuration error (naming `training.trainableModules[i]` and some real
names), never a run that silently trains nothing.

`parameter_budget(module)` is what the start record shows of it: parameters trained and frozen,
the optimizer-state bytes this rank will hold, and the gradient bytes reduced per synchronisation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlkube.runtime.infra.errors import ConfigError
from rlkube.runtime.infra.log import log

FIELD = "training.trainableModules"
ADAM_MOMENTS = 2  # exp_avg and exp_avg_sq, each the size of the parameter (shard) in its dtype
REDUCE_BYTES = 4  # FSDP2 reduces gradients in fp32 (models.shard: reduce_dtype=torch.float32)


def _names_by_parameter(model: torch.nn.Module) -> dict[int, tuple[torch.nn.Parameter, list[str]]]:
    """Every parameter once, with all its names (a tied weight has more than one)."""
    out: dict[int, tuple[torch.nn.Parameter, list[str]]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        out.setdefault(id(param), (param, []))[1].append(name)
    return out


def freeze_except(model: torch.nn.Module, patterns: Sequence[str], field: str = FIELD) -> dict[str, int]:
    """Freeze every parameter of `model` none of whose names contains one of `patterns`.

    Returns {"trainable": n, "frozen": m} in elements. ConfigError naming `field[i]` when pattern i
    matches no parameter name.
    """
    params = _names_by_parameter(model)
    all_names = [name for _, names in params.values() for name in names]
    for i, pattern in enumerate(patterns):
        if not any(pattern in name for name in all_names):
            examples = ", ".join(all_names[:3] + all_names[-2:])
            raise ConfigError(
                f"{field}[{i}]: {pattern!r} matches no parameter of the actor's model (parameter names "
                f"look like {examples}; a pattern is a substring of a name)"
            )
    counts = {"trainable": 0, "frozen": 0}
    for param, names in params.values():
        trained = any(pattern in name for name in names for pattern in patterns)
        param.requires_grad_(trained)
        counts["trainable" if trained else "frozen"] += param.numel()
    return counts


def _local(param: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a (possibly FSDP2-sharded, DTensor) parameter."""
    return param.to_local() if hasattr(param, "to_local") else param


def parameter_budget(module: torch.nn.Module) -> dict[str, int]:
    """What training `module` costs this rank, for the start record.

    trainableParameters / frozenParameters: elements of the whole model (all shards);
    optimizerStateBytes: AdamW moments of this rank's shards of the trained parameters;
    reducedBytesPerStep: fp32 gradient bytes reduce-scattered at each gradient synchronisation
    (once per optimizer step) on this rank's group; 0 when the module is not sharded.
    """
    trainable = frozen = state = reduced = 0
    seen: set[int] = set()
    for param in module.parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        if not param.requires_grad:
            frozen += param.numel()
            continue
        trainable += param.numel()
        local = _local(param)
        state += ADAM_MOMENTS * local.numel() * local.element_size()
        if hasattr(param, "to_local"):  # a DTensor: FSDP2 reduce-scatters its gradient
            reduced += param.numel() * REDUCE_BYTES
    return {"trainableParameters": trainable, "frozenParameters": frozen,
            "optimizerStateBytes": state, "reducedBytesPerStep": reduced}


def apply_trainable_modules(lm: torch.nn.Module, patterns: Sequence[str] | None, lora: object = None) -> None:
    """`training.trainableModules` on the actor's HF model, before it is sharded (no-op when unset)."""
    if patterns is None:
        return
    if lora is not None:
        raise ConfigError(f"{FIELD}: cannot be combined with model.lora, which trains only its adapters")
    counts = freeze_except(lm, patterns)
    log.info("%s: training %d parameters, %d frozen", FIELD, counts["trainable"], counts["frozen"])
