"""Multi-turn generation: episodes of several assistant turns over one KV cache kept across them.

What it is: the rows of a left-padded prompt batch generate turn by turn. A row's turn ends at
EOS, at the stop sequence (`stop_ids`: the tokens of the closing tool-call tag), at maxNewTokens,
or when its episode is out of room (`max_episode_tokens`). Once every row's turn has ended, the
caller's `between(rows, turns)` gets the turns that ended at the stop sequence and answers with
the tokens to append to each (a tool turn) or None (the episode ends there). The appended tokens
of all rows go through one forward over the cache (a prefill of those tokens only: the
conversation before them is never encoded again), and the rows that got tokens generate their
next turn, up to `max_turns` turns. Episodes whose turn ended otherwise are over.

Cache layout: one cache for the batch, one column per forward position, as in the plain loop of
generation.py. A row idle in a column (its turn over while others go on, or shorter appended
tokens than another row's, left-padded in the append forward) has that slot masked out of every
later query; positions count only a row's real tokens, so each row sees exactly the conversation
it would see alone, and its log-probs are those of encoding it again from the start
(tests/training/test_multi_turn.py checks it). The masked slots are the cost: the cache is as
wide as the longest turn of each turn plus the longest appended block, summed over the turns.

What it is not: the fast path. Multi-turn episodes run this eager loop over a growing
`DynamicCache` (one host read per token to find each row's turn end), in waves of `batch_rows`.
The continuous-batching decoder (decode_batch.py: static slot cache, CUDA graphs, refill) stops
rows only at EOS and has no way to append tokens to a row between turns, nor to stop on a token
sequence; a row there could not take tool tokens without its own prefill into its slots.

Tokens: with `max_turns` 1 and no stop sequence the tokens are those of the plain loop
(`Decoder` with `static_cache=False`) for the same generator: the same prefill, masks, positions
and one draw for the whole batch per step.

Log-probs: each token the policy sampled is recorded with its log-prob under the temperature-scaled
softmax it was drawn from (`sampling.sampled_logprobs`, the trainer's convention); appended tool
tokens were not sampled and get 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlkube.runtime.engine.attention import swapped
from rlkube.runtime.engine.generation import Decoder
from rlkube.runtime.engine.sampling import SamplingParams, sample_tokens, sampled_logprobs

# (row indices of the call, each row's tokens of the turn that just ended) -> per row: the tokens
# to append before its next turn, or None to end its episode.
BetweenTurns = Callable[[list[int], list[list[int]]], list[list[int] | None]]


@dataclass
class EpisodeOutput:
    """Prompts and episodes: the prompt block left-padded, the response block right-padded."""

    prompt_ids: torch.Tensor  # [B, P]
    prompt_mask: torch.Tensor  # [B, P]
    response_ids: torch.Tensor  # [B, T], pad after the episode's end
    response_mask: torch.Tensor  # [B, T], 1 on every real token: the policy's and the appended
    policy_mask: torch.Tensor  # [B, T], 1 on the tokens the policy generated
    logprobs: torch.Tensor  # [B, T] fp32 log-probs of the policy's tokens when sampled (0 elsewhere)
    turns: list[int]  # assistant turns of each episode
    generated_tokens: int  # tokens the policy generated, all episodes


@dataclass
class _Row:
    tokens: list[int]
    policy: list[int]
    logprobs: list[float]
    turn: list[int]  # tokens of the turn in progress
    turns: int = 1
    active: bool = True  # generating its current turn
    ended_at_stop: bool = False
    pending: int | None = None  # sampled at the last step, not yet in the cache


class EpisodeDecoder:
    """Multi-turn generation with the model and mask conventions of a `Decoder` (module docstring)."""

    def __init__(self, decoder: Decoder, max_turns: int, max_episode_tokens: int,
                 stop_ids: list[int] | None = None) -> None:
        if max_turns < 1 or max_episode_tokens < 1:
            raise ValueError(f"EpisodeDecoder: max_turns {max_turns} and max_episode_tokens "
                             f"{max_episode_tokens} must be >= 1")
        self.decoder, self.model = decoder, decoder.model
        self.max_turns, self.max_episode_tokens = max_turns, max_episode_tokens
        self.stop_ids = list(stop_ids or [])

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams,
                 between: BetweenTurns, generator: torch.Generator | None = None,
                 batch_rows: int | None = None) -> EpisodeOutput:
        """Every row of a left-padded prompt batch ([N, P]) played out as an episode, in waves of
        `batch_rows` rows (None: all at once); `between` gets global row indices."""
        device = next(self.model.parameters()).device
        input_ids = input_ids.to(device)
        prompt_mask = attention_mask.to(device=device, dtype=torch.long)
        if bool((prompt_mask[:, -1] == 0).any()):
            raise ValueError("generate: prompts must be left-padded (last column all real tokens)")
        count = input_ids.shape[0]
        step = min(batch_rows or count, count)
        rows: list[_Row] = []
        # flash-attention takes 2-D masks only; the episode's masks with holes need sdpa's 4-D ones.
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        with swapped(self.model, "sdpa", sdpa_attention_forward, enabled=self.decoder.mode == "2d"), \
                self.decoder.eager():
            for start in range(0, count, step):
                rows += self._wave(input_ids[start:start + step], prompt_mask[start:start + step], params,
                                   between, generator, start)
        return self._output(input_ids, prompt_mask, rows, params)

    # -- one wave ------------------------------------------------------------------------------
    def _mask(self, allowed: torch.Tensor) -> torch.Tensor:
        return self.decoder.mask_form(allowed) if self.decoder.mode != "2d" else allowed

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor, cache) -> torch.Tensor:
        out = self.model(input_ids=ids, position_ids=positions, attention_mask=self._mask(allowed), use_cache=True,
                         logits_to_keep=1, **{self.decoder._cache_kwarg: cache})
        return out.logits[:, -1, :]

    def _wave(self, input_ids, prompt_mask, params: SamplingParams, between: BetweenTurns, generator,
              first_row: int) -> list[_Row]:
        from transformers import DynamicCache

        device = input_ids.device
        batch, prompt_len = input_ids.shape
        key_valid = torch.zeros(batch, prompt_len + self.max_episode_tokens + 1, dtype=torch.bool, device=device)
        key_valid[:, :prompt_len] = prompt_mask.bool()
        positions = (prompt_mask.cumsum(dim=1) - 1).clamp_min(0)
        cache = DynamicCache(config=self.model.config)
        logits = self._forward(input_ids, positions, _block_mask(key_valid[:, :prompt_len], 0, prompt_len), cache)
        next_position = positions[:, -1] + 1
        width = prompt_len  # cache columns written
        rows = [_Row([], [], [], []) for _ in range(batch)]
        while True:
            # -- decode the turn of every active row --------------------------------------------
            while any(r.active for r in rows):
                token = sample_tokens(logits, params, generator)
                chosen = sampled_logprobs(logits, token, params)
                produced = [r.active for r in rows]
                for r, t, logprob in zip(rows, token.tolist(), chosen.tolist(), strict=True):
                    if r.active:
                        self._take(r, t, logprob, params)
                if not any(r.active for r in rows):
                    break  # the last tokens wait as `pending` for the appended tokens' forward
                if width + 1 > key_valid.shape[1]:
                    key_valid = _grow(key_valid, width + 1)
                key_valid[:, width] = torch.tensor(produced, device=device)
                feed = torch.tensor([r.pending if r.pending is not None else params.pad_token_id for r in rows],
                                    device=device)
                for r in rows:
                    r.pending = None
                logits = self._forward(feed[:, None], next_position[:, None],
                                       key_valid[:, None, None, :width + 1], cache)
                next_position = next_position + key_valid[:, width].long()
                width += 1
            # -- between turns: what to append to each row whose turn ended in a call ------------
            asking = [b for b, r in enumerate(rows) if r.ended_at_stop and r.turns < self.max_turns
                      and len(r.tokens) < self.max_episode_tokens]
            if not asking:
                return rows
            answers = between([first_row + b for b in asking], [list(rows[b].turn) for b in asking])
            appended: dict[int, list[int]] = {}
            for b, tokens in zip(asking, answers, strict=True):
                r = rows[b]
                # A tool turn must leave room for one token of the next turn; else the episode ends.
                if tokens is None or len(r.tokens) + len(tokens) + 1 > self.max_episode_tokens:
                    continue
                appended[b] = ([r.pending] if r.pending is not None else []) + list(tokens)
                r.tokens += tokens
                r.policy += [0] * len(tokens)
                r.logprobs += [0.0] * len(tokens)
            for r in rows:
                r.pending, r.ended_at_stop = None, False
            if not appended:
                return rows
            logits, next_position, key_valid, width = self._append(appended, rows, cache, key_valid, next_position,
                                                                   width, params.pad_token_id)

    def _take(self, r: _Row, token: int, logprob: float, params: SamplingParams) -> None:
        """Record a row's sampled token and end its turn where it ends."""
        r.tokens.append(token)
        r.policy.append(1)
        r.logprobs.append(logprob)
        r.turn.append(token)
        r.pending = token
        stop = bool(self.stop_ids) and r.turn[-len(self.stop_ids):] == self.stop_ids
        if (params.eos_token_id is not None and token == params.eos_token_id) or stop \
                or len(r.turn) >= params.max_new_tokens or len(r.tokens) >= self.max_episode_tokens:
            r.active = False
            r.ended_at_stop = stop and token != params.eos_token_id

    def _append(self, appended: dict[int, list[int]], rows: list[_Row], cache, key_valid, next_position, width: int,
                pad_id: int):
        """One forward of every row's appended tokens (right-aligned in a block of the longest)."""
        device = key_valid.device
        batch, block = len(rows), max(len(t) for t in appended.values())
        ids = torch.full((batch, block), pad_id, dtype=torch.long, device=device)
        valid = torch.zeros(batch, block, dtype=torch.bool, device=device)
        for b, tokens in appended.items():
            ids[b, block - len(tokens):] = torch.tensor(tokens, device=device)
            valid[b, block - len(tokens):] = True
        if width + block > key_valid.shape[1]:
            key_valid = _grow(key_valid, width + block)
        key_valid[:, width:width + block] = valid
        positions = (next_position[:, None] + valid.long().cumsum(dim=1) - 1).clamp_min(0)
        logits = self._forward(ids, positions, _block_mask(key_valid[:, :width + block], width, block), cache)
        for b, r in enumerate(rows):
            r.active = b in appended
            if r.active:
                r.turn, r.turns = [], r.turns + 1
        return logits, next_position + valid.long().sum(dim=1), key_valid, width + block

    # -- the result ------------------------------------------------------------------------------
    def _output(self, input_ids, prompt_mask, rows: list[_Row], params: SamplingParams) -> EpisodeOutput:
        device = input_ids.device
        width = max(1, max(len(r.tokens) for r in rows))
        ids = torch.full((len(rows), width), params.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        policy = torch.zeros_like(mask)
        logps = torch.zeros((len(rows), width), dtype=torch.float32)
        for b, r in enumerate(rows):
            n = len(r.tokens)
            ids[b, :n] = torch.tensor(r.tokens, dtype=torch.long)
            mask[b, :n] = 1
            policy[b, :n] = torch.tensor(r.policy, dtype=torch.long)
            logps[b, :n] = torch.tensor(r.logprobs, dtype=torch.float32)
        return EpisodeOutput(input_ids, prompt_mask, ids.to(device), mask.to(device), policy.to(device),
                             logps.to(device), [r.turns for r in rows],
                             int(policy.sum()))


def _block_mask(key_valid: torch.Tensor, start: int, block: int) -> torch.Tensor:
    """'May attend' [B, 1, block, start + block] for queries at columns start..start+block-1: the
    valid keys before the block, the valid ones of the block at or before the query, and always
    the query itself (so a padding query, which has no valid key, stays finite)."""
    q = torch.arange(block, device=key_valid.device)
    k = torch.arange(start + block, device=key_valid.device)
    causal = k[None, :] <= (start + q)[:, None]
    allowed = key_valid[:, None, :] & causal[None] | (k[None, :] == (start + q)[:, None])[None]
    return allowed[:, None]


def _grow(key_valid: torch.Tensor, need: int) -> torch.Tensor:
    grown = torch.zeros(key_valid.shape[0], max(need, 2 * key_valid.shape[1]), dtype=torch.bool,
                        device=key_valid.device)
    grown[:, :key_valid.shape[1]] = key_valid
    return grown
