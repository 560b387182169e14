"""Batched rollout generation from a Hugging Face causal LM's own forward, with a KV cache.

What it is: prefill of left-padded prompts of mixed lengths, then one forward per new token over
the cache, sampling with temperature / top-k / top-p (greedy at temperature 0) and stopping each
row at its EOS. With fewer decode rows than prompts (`batch_rows`), a row that hits EOS is
refilled with the next waiting prompt (`decode_batch`: continuous batching inside one call, so
one long completion does not hold a batch of finished rows). What it is not: a serving engine
(no paged cache, no request queue across calls).

Why not HF `generate`: its per-token Python (logits processors, stopping criteria, mask
rebuilding) and its default cache (a growing `torch.cat` per layer per token) dominate decode
time at RL batch sizes. Here the attention mask is a 4-D tensor that the model takes as-is and
is updated in place; the cache has fixed addresses; on CUDA one whole decode step (sampling,
EOS bookkeeping, mask update, forward) is a captured CUDA graph, so a step costs one graph
launch and the host syncs only every few steps to look for finished rows.

Cache slots: a row's prompt block occupies slots [0, P) (left padding included, masked out);
its k-th generated token sits at slot P + k. Position ids count only real tokens, so a row's
first generated token has position = its prompt length, exactly as HF `generate` does.

Log-probs: every path records, for each sampled token, its log-prob under the temperature-scaled
softmax it was drawn from (`sampling.sampled_logprobs`, the trainer's convention), so the trainer
can measure how far its own forward's log-probs of the same tokens are from generation's.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass

import torch

from rlkube.runtime.engine import decode_attention as live_kernel
from rlkube.runtime.engine.attention import attention_mode, swapped
from rlkube.runtime.engine.decode_batch import BUCKETS, DecodeBatch, decode
from rlkube.runtime.engine.decode_batch import EOS_CHECK_EVERY as _EOS_CHECK_EVERY
from rlkube.runtime.engine.decode_layers import CompiledDecodeLayers
from rlkube.runtime.engine.sampling import SamplingParams, sample_tokens, sampled_logprobs
from rlkube.runtime.engine.sliding_window import decode_window, layer_masks, within_window

log = logging.getLogger(__name__)


@dataclass
class GenerationOutput:
    """Prompts and completions, prompt block left-padded and completion block right-padded."""

    prompt_ids: torch.Tensor  # [B, P]
    prompt_mask: torch.Tensor  # [B, P], 1 on real prompt tokens
    response_ids: torch.Tensor  # [B, T], pad after EOS
    response_mask: torch.Tensor  # [B, T], 1 on generated tokens up to and including EOS
    # [B, T] fp32: each generated token's log-prob when it was sampled (sampling.sampled_logprobs), 0 on pads
    logprobs: torch.Tensor | None = None

    @property
    def sequences(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(dim=1)

    @property
    def generated_tokens(self) -> int:
        return int(self.response_mask.sum())


# Decode attention. With a mask, HF's sdpa path (transformers 5.17) repeats every key/value head
# `groups` times before calling the kernel: at batch 256 that writes and re-reads ~6x the KV cache
# per layer per token. For one query token the groups can instead ride in the query-length
# dimension ([B, Hq, 1, D] -> [B, Hkv, G, D]), so the kernel reads each cached key/value once
# (`_gqa_decode_attention`). On CUDA the decode step goes further (`_live_decode_attention`,
# decode_attention.py): a split-KV kernel that also skips every block of slots no row has a live
# token in, where sdpa reads the whole read length of every row. Prefill uses HF's sdpa unchanged.
_GQA_DECODE = "rlkube_gqa_decode_sdpa"
_LIVE_DECODE = "rlkube_live_decode"


def _gqa_decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                          **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if query.shape[2] != 1 or groups == 1 or key.shape[1] * groups != query.shape[1]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    batch, heads, _, dim = query.shape
    packed = query.reshape(batch, heads // groups, groups, dim)
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(batch, heads, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


def _live_decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                           **kwargs):
    # The kernel has no backward: a decode step under autograd (never inside `generate`, which
    # runs without it) takes sdpa.
    if (not torch.is_grad_enabled() and live_kernel.supported(query, key, attention_mask)
            and key.shape[-1] == value.shape[-1]):
        return live_kernel.live_decode_attention(query, key, value, attention_mask, scaling), None
    return _gqa_decode_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                 is_causal=is_causal, **kwargs)


def decode_attention(model, enabled: bool, live: bool = True):
    """Within: the model's sdpa layers decode with `_live_decode_attention` (with `live`) or
    `_gqa_decode_attention`; its own attention on exit."""
    name, function = (_LIVE_DECODE, _live_decode_attention) if live else (_GQA_DECODE, _gqa_decode_attention)
    return swapped(model, name, function,
                   enabled=enabled and getattr(model.config, "_attn_implementation", None) == "sdpa")


def _cache_kwarg(model) -> str:
    """transformers renamed `past_key_values` to `cache` in 5.2x; accept either."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class Decoder:
    """Generation state for one model, kept between calls so each rollout reuses it.

    The default path (`static_cache`, any attention that takes a 4-D mask) is the continuous-
    batching decoder of `decode_batch`: a cache of per-row slots, sampling and bookkeeping inside
    the step, and on CUDA one captured graph per read-length bucket that a step reached (captured
    once; again only when the batch shape, the sampling setting or the parameter storage changes,
    as after an FSDP unshard into fresh memory). `static_cache=False` (or flash-attention, which takes 2-D masks only)
    runs the plain eager loop over a growing `DynamicCache`, in waves of `batch_rows`.

    batch_rows: decode rows (None: one row per prompt). With fewer rows than prompts, `refill`
    frees a row at its EOS and prefills the next waiting prompt into it; without it prompts go
    in waves.
    """

    def __init__(self, model, static_cache: bool | None = None, cuda_graphs: bool | None = None,
                 batch_rows: int | None = None, refill: bool = True, compile_layers: bool = False):
        self.model = model
        on_cuda = next(model.parameters()).device.type == "cuda"
        self.mode = attention_mode(model)
        self.static_cache = (self.mode != "2d") if static_cache is None else static_cache
        if self.static_cache and self.mode == "2d":
            log.warning("generation: attention %r takes no 4-D mask; decoding with a dynamic cache, "
                        "without CUDA graphs", model.config._attn_implementation)
            self.static_cache = False
        self.cuda_graphs = (on_cuda and self.static_cache) if cuda_graphs is None else cuda_graphs
        if self.cuda_graphs and not on_cuda:
            raise ValueError("Decoder: cuda_graphs needs the model on a CUDA device")
        if self.cuda_graphs and not self.static_cache:
            raise ValueError("Decoder: cuda_graphs needs static_cache")
        if batch_rows is not None and batch_rows < 1:
            raise ValueError(f"Decoder: batch_rows must be >= 1, got {batch_rows}")
        self.batch_rows, self.refill = batch_rows, refill
        self._cache_kwarg = _cache_kwarg(model)
        self.gqa_decode = True  # see _gqa_decode_attention; off only to measure its effect
        self.live_attention = True  # see _live_decode_attention; off only to measure its effect
        self.fused_sampling = True  # sampling_kernel.py where it applies; off only to measure its effect
        self.length_buckets = BUCKETS  # read-length buckets (graphs) per cache; 1 only to measure their effect
        # Move the last busy rows into smaller batches once nothing waits (decode_batch.decode).
        # Each size keeps its own cache and graphs, up to twice the memory of the full batch.
        self.compact = True
        self._batch = None
        self._smaller: dict[int, DecodeBatch] = {}
        # Decoder layers through torch.compile while generating (decode_layers.py).
        self.compiled_layers = CompiledDecodeLayers(model, compile_layers)
        self._released_capture_seconds = 0.0  # capture_seconds_total of the batches released so far
        self.last_stats: dict = {}

    # -- masks ---------------------------------------------------------------------------------
    def mask_form(self, allowed: torch.Tensor) -> torch.Tensor:
        """A boolean 'may attend' mask in the form the attention kernel takes."""
        if self.mode == "eager":
            dtype = next(self.model.parameters()).dtype
            zero = torch.zeros((), dtype=dtype, device=allowed.device)
            return torch.where(allowed, zero, torch.finfo(dtype).min)
        return allowed

    def step_forward(self, input_ids, position_ids, mask, cache, key_valid_2d=None):
        """The model over `input_ids` with `cache`: the last position's logits (decode_batch.DecodeModel)."""
        kwargs = {self._cache_kwarg: cache}
        out = self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=key_valid_2d if self.mode == "2d" else mask,
            use_cache=True,
            logits_to_keep=1,
            **kwargs,
        )
        return out.logits[:, -1, :]

    def eager(self):
        """Within: the decoder layers run uncompiled (decode_batch.DecodeModel)."""
        return self.compiled_layers.paused()

    # -- entry ---------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> GenerationOutput:
        """Complete every row of a left-padded prompt batch (`input_ids`, `attention_mask`: [N, P])."""
        if params.max_new_tokens < 1:
            raise ValueError(f"rollout.maxNewTokens: must be >= 1, got {params.max_new_tokens}")
        device = next(self.model.parameters()).device
        input_ids = input_ids.to(device)
        prompt_mask = attention_mask.to(device=device, dtype=torch.long)
        if bool((prompt_mask[:, -1] == 0).any()):
            raise ValueError("generate: prompts must be left-padded (last column all real tokens)")
        rows = min(self.batch_rows or input_ids.shape[0], input_ids.shape[0])
        try:
            return self._generate(input_ids, prompt_mask, params, generator, rows)
        except torch._dynamo.exc.TorchDynamoException as e:
            if not self.compiled_layers.enabled:
                raise
            # A model torch.compile cannot take (its layers restored on the way out): decode it
            # uncompiled from here on rather than fail the rollout.
            log.warning("generation: compiling the decoder layers failed (%s: %s); decoding them uncompiled",
                        type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            self.compiled_layers = CompiledDecodeLayers(self.model, False)
            self.release()
            return self._generate(input_ids, prompt_mask, params, generator, rows)

    def _generate(self, input_ids, prompt_mask, params: SamplingParams, generator, rows: int) -> GenerationOutput:
        with decode_attention(self.model, self.gqa_decode, self.live_attention), self.compiled_layers:
            if not self.static_cache:
                if self.refill and rows < input_ids.shape[0]:
                    from rlkube.runtime.infra.log import warn_once

                    warn_once("decoder-refill-waves", (
                        f"rollout.refill with the dynamic-cache decoder (attention "
                        f"{getattr(self.model.config, '_attn_implementation', None)!r} takes no 4-D mask): "
                        f"prompts go through the {rows} decode rows in waves, without refill"))
                return self._generate_waves(input_ids, prompt_mask, params, generator, rows)
            captured_before = self.capture_seconds_total
            batch = self._decode_batch(rows, input_ids.shape[1], params)
            resize = self._smaller_batch if self.compact else None
            response, response_mask, logprobs, self.last_stats = decode(batch, input_ids, prompt_mask, generator,
                                                                        self.refill, resize)
            if any(not b.use_graphs for b in (batch, *self._smaller.values())):
                self.cuda_graphs = False  # a capture failed (DecodeBatch._capture): later batches decode eagerly
            # Seconds of this call spent building decode batches (graph capture), 0 when reused.
            self.last_stats["captureSeconds"] = round(self.capture_seconds_total - captured_before, 3)
        return GenerationOutput(input_ids, prompt_mask, response, response_mask, logprobs)

    def batch_key(self, rows: int, prompt_len: int, params: SamplingParams) -> tuple:
        """What a decode batch's graphs depend on (decode_batch.DecodeModel): its shape, the
        sampling, the parameters' storage (an FSDP unshard into fresh memory) and the step's parts."""
        weights = tuple(p.data_ptr() for p in self.model.parameters())
        return (rows, prompt_len, params, weights, self.length_buckets, self.live_attention, self.fused_sampling)

    def _decode_batch(self, rows: int, prompt_len: int, params: SamplingParams) -> DecodeBatch:
        if self._batch is not None and self._batch.key == self.batch_key(rows, prompt_len, params):
            return self._batch
        self.release()  # one set of caches resident at a time: drop the old one before allocating
        self._batch = self._new_batch(rows, prompt_len, params)
        return self._batch

    def _smaller_batch(self, rows: int) -> DecodeBatch:
        """A batch of `rows` rows like the current one (compaction's target), kept for reuse."""
        if rows not in self._smaller:
            self._smaller[rows] = self._new_batch(rows, self._batch.prompt_len, self._batch.params)
        return self._smaller[rows]

    @property
    def capture_seconds_total(self) -> float:
        """Seconds every DecodeBatch of this decoder spent outside decoding proper: built (caches
        allocated) and graphs captured, the released ones included."""
        batches = [self._batch, *self._smaller.values()] if self._batch is not None else []
        return self._released_capture_seconds + sum(b.capture_seconds for b in batches)

    def _new_batch(self, rows: int, prompt_len: int, params: SamplingParams) -> DecodeBatch:
        try:
            batch = DecodeBatch(self, rows, prompt_len, params, graphs=self.cuda_graphs)
        except Exception as e:
            if not self.cuda_graphs:
                raise
            # Building the batch failed with graphs on (its stream, a CUDA error): decode eagerly, same loop.
            log.warning("generation: decode batch with CUDA graphs failed (%s: %s); decoding without graphs",
                        type(e).__name__, e)
            self.cuda_graphs = False
            batch = DecodeBatch(self, rows, prompt_len, params, graphs=False)
        return batch

    def release(self) -> None:
        """Free the KV caches and graphs (the hybrid engine calls this before training)."""
        self._released_capture_seconds = self.capture_seconds_total
        self._batch = None
        self._smaller = {}

    # -- the plain loop (dynamic cache) --------------------------------------------------------
    def _generate_waves(self, input_ids, prompt_mask, params, generator, rows) -> GenerationOutput:
        outs = [self._generate_eager(input_ids[i : i + rows], prompt_mask[i : i + rows], params, generator)
                for i in range(0, input_ids.shape[0], rows)]
        if len(outs) == 1:
            return outs[0]
        width = max(o.response_ids.shape[1] for o in outs)
        pad = torch.nn.functional.pad
        return GenerationOutput(
            input_ids, prompt_mask,
            torch.cat([pad(o.response_ids, (0, width - o.response_ids.shape[1]), value=params.pad_token_id)
                       for o in outs]),
            torch.cat([pad(o.response_mask, (0, width - o.response_mask.shape[1])) for o in outs]),
            torch.cat([pad(o.logprobs, (0, width - o.logprobs.shape[1])) for o in outs]),
        )

    def _generate_eager(self, input_ids, prompt_mask, params: SamplingParams, generator) -> GenerationOutput:
        from transformers import DynamicCache

        device = input_ids.device
        batch, prompt_len = input_ids.shape
        total = prompt_len + params.max_new_tokens
        # key_valid[b, j]: may any later query attend to cache slot j. Generated slots flip on as
        # they are written.
        key_valid = torch.zeros(batch, total, dtype=torch.bool, device=device)
        key_valid[:, :prompt_len] = prompt_mask.bool()
        positions = (prompt_mask.cumsum(dim=1) - 1).clamp_min(0)
        # Full layers only: a config's sliding layers would keep only their window's keys, where the
        # masks here (sliding_window.py) cover every slot of the row.
        cache = DynamicCache()
        # Prefill. Each query attends to valid keys at or before it, and always to itself, so
        # left-pad queries (which have no valid key) stay finite instead of NaN.
        q = torch.arange(prompt_len, device=device)
        allowed = (key_valid[:, None, :prompt_len] & (q[None, None, :] <= q[None, :, None])) | (
            q[None, None, :] == q[None, :, None]
        )
        config, window = self.model.config, decode_window(self.model.config, total)  # sliding_window.py
        slots = torch.arange(total, device=device)

        def masks(allowed: torch.Tensor, query_slots: torch.Tensor):
            """The full mask, and the sliding layers' where the window is shorter than a row."""
            width = allowed.shape[-1]
            sliding = None if window is None else self.mask_form(
                allowed & within_window(query_slots, slots[:width], window))
            return layer_masks(config, self.mask_form(allowed), sliding)

        logits = self.step_forward(input_ids, positions, masks(allowed[:, None], q[None, None, :, None]), cache,
                                   prompt_mask)
        response = torch.full((batch, params.max_new_tokens), params.pad_token_id, dtype=torch.long,
                              device=device)
        response_mask = torch.zeros(batch, params.max_new_tokens, dtype=torch.long, device=device)
        logprobs = torch.zeros(batch, params.max_new_tokens, dtype=torch.float32, device=device)
        finished = torch.zeros(batch, dtype=torch.bool, device=device)
        next_position = positions[:, -1:] + 1
        steps_run = 0
        for step in range(params.max_new_tokens):
            token = sample_tokens(logits, params, generator)
            logprobs[:, step] = torch.where(finished, 0.0, sampled_logprobs(logits, token, params))
            token = torch.where(finished, params.pad_token_id, token)
            response[:, step] = token
            response_mask[:, step] = (~finished).long()
            steps_run = step + 1
            if params.eos_token_id is not None:
                finished |= token == params.eos_token_id
                if (step + 1) % _EOS_CHECK_EVERY == 0 and bool(finished.all()):
                    break
            if step + 1 == params.max_new_tokens:
                break
            slot = prompt_len + step
            key_valid[:, slot] = True
            mask = masks(key_valid[:, None, None, : slot + 1], slots[slot])
            logits = self.step_forward(token[:, None], next_position, mask, cache, key_valid[:, : slot + 1].long())
            next_position = next_position + 1
        return GenerationOutput(
            prompt_ids=input_ids,
            prompt_mask=prompt_mask,
            response_ids=response[:, :steps_run],
            response_mask=response_mask[:, :steps_run],
            logprobs=logprobs[:, :steps_run],
        )


def generate(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    static_cache: bool | None = None,
    cuda_graphs: bool | None = None,
    batch_rows: int | None = None,
    refill: bool = True,
) -> GenerationOutput:
    """One-shot generation (builds a `Decoder`; keep a `Decoder` to reuse caches and graphs)."""
    return Decoder(model, static_cache=static_cache, cuda_graphs=cuda_graphs, batch_rows=batch_rows,
                   refill=refill).generate(
        input_ids, attention_mask, params, generator
    )
