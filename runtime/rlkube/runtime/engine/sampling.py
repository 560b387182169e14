"""How the next token is picked: the rollout's sampling settings and the sampler the decoder runs
inside its captured step (generation.py's plain loop and decode_batch.py's continuous batching),
and the log-prob each generation path records for the token it sampled (`sampled_logprobs`)."""

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


def sampled_logprobs(logits: torch.Tensor, tokens: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """fp32 log-prob [B] of each row's sampled token under log_softmax(logits.float() / T), T the
    rollout temperature (T = 1 at temperature 0: the model's own distribution).

    This is the convention of the trainer's log-probs (engine/policy.py: logits / T in fp32, T = 1
    for greedy rollouts), so the two compare like with like. With top-k / top-p the sampler draws
    from the restricted, renormalised distribution, but the log-prob recorded here is still the
    full temperature-scaled softmax's: what the training forward computes for the same token.

    One fp32 logsumexp over the vocabulary and a gather: the fp32 copy of the logits lives only for
    this call. No host sync, so it runs inside the decoder's captured CUDA graph as well as eagerly.
    """
    z = logits.float()
    if params.temperature not in (0.0, 1.0):
        # divided, not multiplied by 1/T: the training forward's arithmetic (fused_head.chunk_stats)
        z = z.div_(params.temperature) if z is not logits else z / params.temperature
    return z.gather(1, tokens[:, None]).squeeze(1) - torch.logsumexp(z, dim=-1)
