"""Rewards: rule-based functions named by import path, and a reward-model role.

A rule-based reward is any `function(prompt: str, completion: str) -> float`, named in the
config as 'package.module:function' (`roles.reward.function`) and looked up once at start.
`target_pattern` is the one rlkube ships for its toy task and tests.

A reward model is an `AutoModelForSequenceClassification` with one label, loaded from the
reward role's model spec (or built from a config), that scores each (prompt, completion)
sequence at its last real token. It runs on the reward role's own device group.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable

import torch

from .config import ModelSpec
from .generation import attention_mode, padded_causal_mask
from .models import pick_attention, resolve_dtype
from .policy import positions_of

RewardFunction = Callable[[str, str], float]

# The toy task: write lowercase ASCII letters. A random byte-level model hits this class with
# probability ~26/259 per byte, so the reward is dense enough to learn from in a few steps,
# and there is a clear ceiling (1.0) to measure progress against.
TARGET_PATTERN = re.compile(r"[a-z]")


def target_pattern(prompt: str, completion: str) -> float:
    """Fraction of the completion's characters that match `TARGET_PATTERN` (0 for an empty one)."""
    if not completion:
        return 0.0
    return sum(1 for ch in completion if TARGET_PATTERN.fullmatch(ch)) / len(completion)


def load_reward_function(path: str) -> RewardFunction:
    """The function named by 'package.module:function'."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"roles.reward.function: cannot import module {module_name!r}: {e}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"roles.reward.function: {module_name!r} has no callable {attr!r}")
    return fn


def score_with_function(fn: RewardFunction, prompts: list[str], completions: list[str]) -> torch.Tensor:
    """[N] float32 rewards; a non-finite value is an error in the user's function, named as such."""
    scores = []
    for prompt, completion in zip(prompts, completions, strict=True):
        value = float(fn(prompt, completion))
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"roles.reward.function returned {value} for prompt {prompt[:40]!r}")
        scores.append(value)
    return torch.tensor(scores, dtype=torch.float32)


class RewardModel(torch.nn.Module):
    """A sequence-classification model scoring each row at its last real token -> [B] fp32."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.mode = attention_mode(model)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        body = self.model.base_model
        dtype = self.model.score.weight.dtype
        out = body(
            input_ids=input_ids,
            attention_mask=padded_causal_mask(attention_mask, self.mode, dtype),
            position_ids=positions_of(attention_mask),
            use_cache=False,
        )
        hidden = out.last_hidden_state
        columns = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        last = torch.where(attention_mask.bool(), columns, -1).max(dim=1).values.clamp_min(0)
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
