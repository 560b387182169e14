"""The reward-model role: an `AutoModelForSequenceClassification` with one label, loaded from the
reward role's model spec (or built from a config), that scores each (prompt, completion)
sequence at its last real token. It runs on the reward role's own device group.
"""

from __future__ import annotations

import torch

from rlkube.runtime.contract.config import ModelSpec
from rlkube.runtime.engine.models import pick_attention, resolve_dtype
from rlkube.runtime.engine.policy import flush_left_hidden


class RewardModel(torch.nn.Module):
    """A sequence-classification model scoring each row at its last real token -> [B] fp32."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden, _ = flush_left_hidden(self.model.base_model, input_ids, attention_mask)
        # flush left, a row's last real token is at its length - 1
        last = (attention_mask.sum(dim=1) - 1).clamp_min(0)
        picked = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        return self.model.score(picked).squeeze(-1).float()


def build_reward_model(spec: ModelSpec, device: torch.device, pad_token_id: int, seed: int = 0) -> RewardModel:
    """Load (or, from a config, randomly initialise) a one-label sequence classifier."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    attention = pick_attention(spec.attention, device)
    dtype = resolve_dtype(spec, device)
    if spec.path is not None:
        model = AutoModelForSequenceClassification.from_pretrained(
            spec.path, num_labels=1, dtype=dtype, attn_implementation=attention, local_files_only=True
        )
    else:
        fields = dict(spec.config or {})
        model_type = fields.pop("model_type")
        try:
            config = AutoConfig.for_model(model_type, num_labels=1, pad_token_id=pad_token_id, **fields)
        except (ValueError, TypeError) as e:
            raise ValueError(f"roles.reward.model.config: {e}") from None
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForSequenceClassification.from_config(
                config, dtype=dtype, attn_implementation=attention
            )
    model.eval().requires_grad_(False)
    return RewardModel(model.to(device))
