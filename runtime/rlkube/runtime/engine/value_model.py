"""The PPO critic: the actor's architecture with a scalar value head instead of the lm head.

V(s_t) for response token t is read from the hidden state that predicts it (column P + t - 1,
the same position the policy's log-prob of token t comes from), so GAE's delta_t =
r_t + gamma * V_{t+1} - V_t lines up token for token with the policy loss. The head starts at
zero: the first rollout's values are 0 and the first advantages are plain discounted rewards,
instead of the noise of a random projection.
"""

from __future__ import annotations

import torch

from rlkube.runtime.engine.logprobs import body_and_head
from rlkube.runtime.engine.policy import response_hidden


class ValueModel(torch.nn.Module):
    """`.lm` is a causal LM whose body is used (its lm head is dropped when untied); forward ->
    values [B, T] in fp32 for the response columns."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        body, head = body_and_head(lm)
        if head.weight is not lm.get_input_embeddings().weight:
            # An untied head is never used by the critic; do not keep (or shard) its weights.
            lm.set_output_embeddings(torch.nn.Identity())
        self.lm = lm
        hidden = lm.config.hidden_size
        dtype = lm.get_input_embeddings().weight.dtype
        self.value_head = torch.nn.Linear(hidden, 1, dtype=dtype, device=lm.get_input_embeddings().weight.device)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int) -> torch.Tensor:
        body = self.lm.get_decoder() if hasattr(self.lm, "get_decoder") else self.lm.model
        hidden = response_hidden(body, input_ids, attention_mask, prompt_len)
        return self.value_head(hidden).squeeze(-1).float()
