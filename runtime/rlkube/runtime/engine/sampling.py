"""How the next token is picked: the rollout's sampling settings and the sampler the decoder runs
inside its captured step (generation.py's plain loop and decode_batch.py's continuous batching)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    eos_token_id: int | None = None
    pad_token_id: int = 0

    @classmethod
    def from_rollout(cls, rollout, eos_token_id: int | None, pad_token_id: int) -> SamplingParams:
        """From a `config.RolloutSpec`."""
        return cls(
            max_new_tokens=rollout.max_new_tokens,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
        )


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Next token per row from `[B, V]` logits: argmax at temperature 0, else a sample from the
    temperature-scaled distribution restricted to the top-k and the top-p nucleus.

    Sampling is the Gumbel-max form: argmax(logits / T - log E) with E ~ Exp(1), which draws from
    softmax(logits / T) exactly. Scaled by T it is argmax(logits - T log E): no softmax and no
    fp32 copy of the logits, so bf16 logits are read once, by the kernel that adds the fp32
    noise. No host sync anywhere, so it runs inside a captured CUDA graph.
    """
    if params.temperature == 0.0:
        return logits.argmax(dim=-1)
    scores = logits
    if params.top_k and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores.float() / params.temperature, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_scores, dim=-1)
        # Drop a token when the mass before it already reaches top_p; the first token always stays.
        drop = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) >= params.top_p
        keep = torch.empty_like(drop).scatter_(-1, order, ~drop)
        scores = scores.masked_fill(~keep, float("-inf"))
    noise = torch.empty(scores.shape, dtype=torch.float32, device=scores.device).exponential_(generator=generator)
    return torch.add(scores, noise.log_(), alpha=-params.temperature).argmax(dim=-1)
