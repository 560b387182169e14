"""Completions of geometric length on a random-init model, the same for every benchmark side.

A random-init model never says EOS by itself, so the benchmarks make each sampled token EOS with
probability h = 1 - 0.5 ** (1 / median) (geometric lengths, median `median`), whatever the
model's logits: a forward hook on the LM head sets the EOS logit of the last position of its
output (the position a sampler reads: HF `generate` and rlkube's decoder both ask for that one
alone) to logsumexp(other logits) + log(h / (1 - h)).

A fixed bias on the EOS logit, used before, does not do this: a random-init model's logits are
not flat (std ~0.8 at the 1.5B shape) and its own EOS logit varies by row and model, so the hazard
depended on the weights, and two models of the same shape initialised on different devices ended
at different rates (1.5B shape, median 48: TRL 140-151 tokens, rlkube 66-69 on the H200). Other
positions are left alone (training log-probs read the head's weight directly, not the module).

Imports torch alone: bench_utilization.py loads it in the CLI process before the runtime.
"""

from __future__ import annotations

import math

import torch


def eos_hook(eos: int, median: float):
    """The forward hook (module, inputs, output) -> output that sets the EOS logit."""
    hazard = 1.0 - 0.5 ** (1.0 / median)
    offset = math.log(hazard / (1.0 - hazard))

    def hook(module, inputs, output):
        # Tensor ops only (no Python scalar written into a CUDA tensor): rlkube captures the head
        # in its decode CUDA graph, and a capture refuses a host-to-device copy.
        with torch.no_grad():
            last = output[..., -1, :].float()
            every = torch.logsumexp(last, dim=-1)
            others = every + torch.log1p(-torch.exp(last[..., eos] - every))  # all but EOS
        output[..., -1, eos] = (others + offset).to(output.dtype)
        return output

    return hook


def eos_hazard(model: torch.nn.Module, eos: int, median: float):
    """Hook `model`'s LM head (eos_hook); returns the hook handle."""
    return model.get_output_embeddings().register_forward_hook(eos_hook(eos, median))
