"""LoRA on the actor: low-rank adapters trained on frozen base weights, through PEFT.

`add_lora(lm, spec)` injects the adapters of `model.lora` into the HF model *in place* (PEFT
replaces each targeted nn.Linear by a LoRA layer holding the original as `base_layer`) and
returns the `PeftModel` handle that knows how to switch them off, save them and merge them.
The trainers keep using the plain HF model: its forward now runs through the adapters, so the
policy's log-probs and the hybrid engine's generation both see the adapted weights, and nothing
downstream (the chunked head, FSDP units, the decoder) needs to know about PEFT.

The reference policy is the same module with the adapters off (`adapters_disabled`), so a LoRA
job holds one copy of the base weights, not two: `ReferenceView` is the module the trainers call
where they would otherwise call a frozen copy. Only the adapters require gradients, so only they
get AdamW moments (`trainable_parameters`).

`save_adapter` writes the adapter (PEFT's adapter_config.json + adapter_model.safetensors) or,
with `merge=True`, a plain HF directory with the adapters folded into the weights. It is the
export of a LoRA run until the HF export of finished jobs lands; that export should call it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from rlkube.runtime.contract.config import LoraSpec


def add_lora(lm: torch.nn.Module, spec: LoraSpec):
    """Adapters of `spec` injected into `lm` in place; returns the PeftModel wrapping `lm`.

    The base weights are frozen; the adapters' B starts at zero, so the adapted model starts equal
    to the base model (the reference), as a full fine-tune starts equal to its frozen copy.
    """
    from peft import LoraConfig, get_peft_model

    head = lm.get_output_embeddings()
    present = {name.rsplit(".", 1)[-1] for name, m in lm.named_modules()
               if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)) and m is not head}
    missing = sorted(set(spec.target_modules) - present)
    if missing:
        # The lm head is not offered: the chunked log-prob path reads head.weight directly
        # (engine/logprobs.py), so an adapter there would train nothing and change generation only.
        raise ValueError(
            f"model.lora.targetModules: {', '.join(missing)} name no linear or embedding layer of the "
            f"model's body; its layers are {', '.join(sorted(present))}"
        )
    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                        target_modules=list(spec.target_modules), bias="none")
    peft_model = get_peft_model(lm, config)
    # get_peft_model casts adapters to fp32 by default ("autocast_adapter_dtype"); keep them in the
    # model's dtype so the chunked head and FSDP see one dtype per unit.
    dtype = next(p for p in lm.parameters() if not p.requires_grad).dtype
    for name, p in lm.named_parameters():
        if "lora_" in name:
            p.data = p.data.to(dtype)
    return peft_model


def is_lora(lm: torch.nn.Module) -> bool:
    """`lm` carries LoRA adapters (PEFT's tuner layers)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return any(isinstance(m, BaseTunerLayer) for m in lm.modules())


def _tuner_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in module.modules() if isinstance(m, BaseTunerLayer)]


@contextmanager
def adapters_disabled(module: torch.nn.Module) -> Iterator[None]:
    """Inside: every LoRA layer under `module` computes its base layer only (the reference)."""
    layers = _tuner_layers(module)
    was = [not layer.disable_adapters for layer in layers]
    try:
        for layer in layers:
            layer.enable_adapters(False)
        yield
    finally:
        for layer, enabled in zip(layers, was, strict=True):
            layer.enable_adapters(enabled)
        # enable_adapters(True) marks the adapters trainable again; the base stays frozen.


class ReferenceView(torch.nn.Module):
    """The reference policy of a LoRA actor: the actor's own module, adapters off, no gradients.

    It holds the actor module without registering it (a plain attribute), so the reference owns
    no parameters: it is never checkpointed, sharded or counted twice.
    """

    def __init__(self, actor: torch.nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "actor", actor)

    def forward(self, *args, **kwargs):
        with torch.no_grad(), adapters_disabled(self.actor):
            return self.actor(*args, **kwargs)


def trainable_parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an optimizer should hold state for: those that require gradients."""
    return [p for p in module.parameters() if p.requires_grad]


def save_adapter(peft_model, out_dir: str | Path, merge: bool = False) -> Path:
    """Write the adapter (or, with `merge`, the merged HF model) of `peft_model` to `out_dir`.

    Merging works on a host copy, so the training model keeps its adapters and its device memory.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not merge:
        peft_model.save_pretrained(str(out))
        return out
    host = copy.deepcopy(peft_model).to("cpu")
    merged = host.merge_and_unload()
    merged.save_pretrained(str(out))
    return out
