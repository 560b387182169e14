"""Continuous-batching decode: a fixed set of batch rows working through a longer list of prompts.

What it is: `rows` decode rows, each holding one prompt at a time in a KV cache of its own slots.
A row whose completion hits EOS (or `max_new_tokens`) is harvested and refilled with the next
waiting prompt: the prompt's KV is prefilled into that row alone while the other rows keep their
place, so one long completion no longer holds a whole batch of finished rows. With `refill` off
the prompts go through in waves of `rows` (each wave runs to its longest completion), which is
what the plain batched loop does and what the benchmark compares against. Once no prompt
waits, the rows still busy are moved (KV, mask and counters copied) into a batch of half the
rows or fewer, so the drain of the last long completions (an RL rollout of one wave is all
drain) runs at the cost of a small batch; each size has its own cache and graphs.

Per-row bookkeeping lives on the device: the row's completion length, its finished flag, the next
write slot and position. One decode step is: sample the next token from the previous step's
logits (on the logits as the model returned them, bf16 on GPU), record it and its log-prob
(sampling.sampled_logprobs: one fp32 logsumexp over the vocabulary), advance the row's
counters, open its new slot in the attention mask, and run the model's forward for the new
tokens. On CUDA, plain sampling (no top-k or top-p) and its log-prob are one kernel that reads
the logits once (sampling_kernel.py), and the forward's attention reads only live cache blocks
(decode_attention.py). On CUDA that whole step is one captured graph (sampling included: the
graph's own generator is registered with it and seeded once per call, the fused sampler's seed
is a device counter the step advances), so a step costs one graph launch and
no host sync; the host asks for the finished flags every `EOS_CHECK_EVERY` steps, which is when
rows are harvested and refilled.

Live-KV reads: attention reads only the first `read_len` slots of the cache. A graph is captured
for a few read lengths (buckets up to the full cache); before each step the host picks the
smallest that covers every live row. The host knows that bound without asking the device: a row
has at most as many tokens as steps since it was filled.

Graphs are captured when first needed, not up front: the first CAPTURE_AFTER steps at a read
length run eagerly (real decode steps, which are also the warm-up a capture needs: the compiled
layers' first call, kernel choice, the allocator's growth), the next one captures its graph and
every later one replays it. A bucket no step reaches (the early read lengths of a batch that
compaction makes for the drain, the late ones of a rollout whose completions stop early) is never
captured. Captures skip `torch.cuda.graph`'s release of every cached block (`empty_cache`, for
device and pinned host memory) before each capture, which would hand back, graph after graph,
memory the decode loop then allocates again.

Tokens: greedy completions are exactly those of the plain batched loop (same per-row arithmetic;
a test checks it). Sampled completions come from the same distribution but not the same draws:
the noise a prompt gets depends on which row and step it lands on, which refilling changes. The
draws of one call are reproducible for the same generator seed, rows and refill setting.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

import torch
from transformers.cache_utils import Cache

from rlkube.runtime.engine import sampling_kernel
from rlkube.runtime.engine.sampling import SamplingParams, sample_tokens, sampled_logprobs
from rlkube.runtime.engine.sliding_window import decode_window, layer_masks, within_window

log = logging.getLogger(__name__)

# How often (in steps) the host reads the finished flags: each read is a host sync, and refills
# happen only then. A finished row idles at most this many steps minus one.
EOS_CHECK_EVERY = 8
# Cache lengths and read lengths are multiples of this, so the mask rows sdpa's kernels get stay aligned.
LENGTH_STEP = 64
# Read-length buckets: the full cache split in this many steps over the completion part.
BUCKETS = 4
# The cache and the mask hold this many slots past the longest read, never read: every read is
# then a strict slice of them. A read of the whole tensor guards differently in a compiled layer
# (its view is the base's full size, the mask's row stride equals the read length), so the last
# read-length bucket compiled its attention graph once more. 8 keeps the widths 16-byte aligned.
SPARE_SLOTS = 8
# Compaction stops at this many rows: below it a step costs about the same whatever the batch.
COMPACT_MIN_ROWS = 8
# Eager steps at a read length before its graph is captured (see the module docstring).
CAPTURE_AFTER = 2


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def read_buckets(prompt_len: int, max_new_tokens: int, length: int, buckets: int = BUCKETS) -> list[int]:
    """The read lengths graphs are captured for: the prompt plus 1/4, 2/4, ... of the completion
    slots, rounded up to LENGTH_STEP, the last one the whole cache."""
    points = {min(length, _round_up(prompt_len + -(-max_new_tokens * i // buckets), LENGTH_STEP))
              for i in range(1, buckets + 1)}
    return sorted(points | {length})


def scatter_slots(keys: torch.Tensor, values: torch.Tensor, layer: int, slot: torch.Tensor,
                  key_states: torch.Tensor, value_states: torch.Tensor) -> None:
    """Write each row's new key and value (`key_states`: [rows, heads, 1, dim]) at that row's
    `slot` of layer `layer` of the stacked cache (`keys`: [layers, rows, heads, slots, dim]), in place."""
    index = slot.view(-1, 1, 1, 1)
    for cache, new in ((keys[layer], key_states), (values[layer], value_states)):
        cache.scatter_(2, index.expand(-1, cache.shape[1], 1, cache.shape[3]), new)


# `scatter_slots` as an operator of its own, for compiled decoder layers: the graph keeps the write
# as this in-place scatter. Traced as tensor ops, the write made the graph return a copy of the
# whole cache (a mutated graph input); excluded from tracing, it split every layer into four
# graphs and ten traced frames (the break unwinds each wrapper of the attention's call).
write_kv_slots = torch.library.custom_op("rlkube::write_kv_slots", mutates_args=("keys", "values"))(scatter_slots)


@write_kv_slots.register_fake
def _write_kv_slots_fake(keys, values, layer, slot, key_states, value_states) -> None:
    return None


class SlotCache(Cache):
    """Keys and values of `layers` x `rows` x `length` slots, the cache object HF attention layers
    call `update` on. Decode writes each row's new key at that row's own slot (`write_slot`) and
    returns the first `read_len` slots (`read_len` is the width of `read_mask`, the attention mask
    of the step, so a compiled layer takes it as a dimension of its input, not a constant of each
    bucket); a prefill (`prefill_rows` set) writes the prompt's keys into the first slots of those
    rows and returns them as they are (the prompt attends only to itself). One tensor holds every
    layer's keys (and one the values), so a compiled layer reaches its own by index, one graph for
    all layers. The model never builds a mask from this cache: it always gets a 4-D one. A `Cache`
    subclass only so that isinstance checks in model code accept it; none of `Cache`'s per-layer
    machinery is used (`layers` stays empty)."""

    is_compileable = False

    def __init__(self, layers: int, rows: int, length: int, device: torch.device):
        self.layers = []
        self.num_layers, self.rows, self.length = layers, rows, length
        self.keys: torch.Tensor | None = None    # [layers, rows, kv heads, length, head dim]
        self.values: torch.Tensor | None = None
        self.write_slot = torch.zeros(rows, dtype=torch.long, device=device)
        self.read_mask: torch.Tensor | None = None  # the step's mask: its last dimension is the read length
        self.prefill_rows: torch.Tensor | None = None

    @property
    def read_len(self) -> int:
        """Slots the last decode step read (the whole cache before any)."""
        return self.length if self.read_mask is None else self.read_mask.shape[-1]

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if self.prefill_rows is not None:
            return self._prefill(key_states, value_states, layer_idx)
        # Eagerly, the same write without the operator's dispatch (microseconds a layer).
        write = write_kv_slots if torch.compiler.is_compiling() else scatter_slots
        write(self.keys, self.values, layer_idx, self.write_slot, key_states, value_states)
        read_len = self.read_len
        # select, not indexing: an index specializes the layer's number (a graph per layer)
        return (self.keys.select(0, layer_idx).narrow(2, 0, read_len),
                self.values.select(0, layer_idx).narrow(2, 0, read_len))

    # Prefills run eagerly (decode_layers.py); never traced.
    @torch.compiler.disable
    def _prefill(self, key_states, value_states, layer_idx):
        if self.keys is None:
            shape = (self.num_layers, self.rows, key_states.shape[1], self.length, key_states.shape[3])
            self.keys = key_states.new_zeros(shape)
            self.values = value_states.new_zeros(shape[:-1] + (value_states.shape[3],))
            # Layers, heads and head size never change for a model: static in the compiled
            # layers, fewer symbols to reason about while tracing (on CPU 10.4 s of decode
            # compile became 8.7 s); rows and slots vary by batch and stay dynamic.
            for t in (self.keys, self.values):
                for dim in (0, 2, 4):
                    torch._dynamo.mark_static(t, dim)
        if (key_states.shape[1], key_states.shape[3], value_states.shape[3]) != \
                (self.keys.shape[2], self.keys.shape[4], self.values.shape[4]):
            raise ValueError(
                f"generation: decoder layer {layer_idx} has {key_states.shape[1]} key/value heads of size "
                f"{key_states.shape[3]}, the first layer {self.keys.shape[2]} of size {self.keys.shape[4]}; "
                "the decode cache holds models whose attention layers all have the same shape")
        width = key_states.shape[2]
        self.keys[layer_idx, :, :, :width].index_copy_(0, self.prefill_rows, key_states)
        self.values[layer_idx, :, :, :width].index_copy_(0, self.prefill_rows, value_states)
        return key_states, value_states

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


class DecodeModel(Protocol):
    """What a DecodeBatch needs of the model it decodes; generation.Decoder, which owns its
    batches, provides it. Nothing else of the decoder is read here."""

    model: torch.nn.Module
    length_buckets: int  # read-length buckets (graphs) per batch
    fused_sampling: bool  # sample in sampling_kernel.py's one pass where it applies

    def batch_key(self, rows: int, prompt_len: int, params: SamplingParams) -> tuple:
        """What a batch's graphs depend on: a batch whose key differs is built anew."""

    def mask_form(self, allowed: torch.Tensor) -> torch.Tensor:
        """A boolean 'may attend' mask in the form the model's attention takes."""

    def step_forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor,
                     cache: Cache) -> torch.Tensor:
        """The model over `input_ids` with `cache`: the last position's logits [rows, vocab]."""

    def eager(self) -> AbstractContextManager:
        """Within: the decoder layers run uncompiled (prefills; decode_layers.py)."""


class DecodeBatch:
    """Device state of `rows` decode rows for prompts of `prompt_len` columns and one sampling
    setting, plus (with `graphs`) one captured step per read-length bucket. Kept by the `Decoder`
    between calls; `key` says when it can be reused."""

    def __init__(self, decoder: DecodeModel, rows: int, prompt_len: int, params: SamplingParams, graphs: bool):
        started = time.perf_counter()
        model = decoder.model
        device = next(model.parameters()).device
        self.decoder, self.params = decoder, params
        self.rows, self.prompt_len = rows, prompt_len
        self.key = decoder.batch_key(rows, prompt_len, params)
        self.length = _round_up(prompt_len + params.max_new_tokens, LENGTH_STEP)
        self.buckets = read_buckets(prompt_len, params.max_new_tokens, self.length, decoder.length_buckets)
        slots = self.length + SPARE_SLOTS
        self.cache = SlotCache(model.config.num_hidden_layers, rows, slots, device)
        self.rng = torch.Generator(device=device)
        # The fused sampler's seed (sampling_kernel.py): advanced by every step, inside the graphs too.
        self.sample_seed = torch.zeros((), dtype=torch.long, device=device)
        self.mask = decoder.mask_form(torch.zeros(rows, 1, 1, slots, dtype=torch.bool, device=device))
        self.allowed = decoder.mask_form(torch.ones(rows, 1, 1, 1, dtype=torch.bool, device=device))
        self.blocked = decoder.mask_form(torch.zeros((), dtype=torch.bool, device=device))
        # Sliding layers (sliding_window.py): their own mask, where the window is shorter than a row.
        self.config = model.config
        self.window = decode_window(model.config, self.length)
        self.sliding = self.mask.clone() if self.window else None
        self.blocked_rows = decoder.mask_form(torch.zeros(rows, 1, 1, 1, dtype=torch.bool, device=device))
        self.input_ids = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.position_ids = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.gen_len = torch.zeros(rows, dtype=torch.long, device=device)
        self.base_pos = torch.zeros(rows, dtype=torch.long, device=device)
        self.finished = torch.ones(rows, dtype=torch.bool, device=device)
        # Column max_new_tokens takes the pad writes of rows already at their limit.
        self.history = torch.full((rows, params.max_new_tokens + 1), params.pad_token_id, dtype=torch.long,
                                  device=device)
        # The log-prob of each token of `history` when it was sampled (0 where a pad was written).
        self.logprob_history = torch.zeros(rows, params.max_new_tokens + 1, dtype=torch.float32, device=device)
        # A one-token prefill of every row allocates the cache at its final addresses and gives
        # the logits buffer its shape and dtype (bf16 on GPU: sampling reads them as they are).
        # Eager, as every prefill (decode_layers.py): compiled, its one-slot mask made the layers'
        # first graphs specialize the key length to 1, and the first decode step compiled them again.
        self.cache.prefill_rows = torch.arange(rows, device=device)
        self.mask[..., 0] = self.allowed[..., 0]
        with decoder.eager():
            one = self.mask[..., :1].clone()
            first = decoder.step_forward(self.input_ids, self.position_ids,
                                         layer_masks(self.config, one, one if self.window else None), self.cache)
        self.cache.prefill_rows = None
        self.logits = first.clone()
        self.mask.fill_(self.blocked)
        if self.sliding is not None:
            self.sliding.fill_(self.blocked)
        self.use_graphs = graphs
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.eager_steps: dict[int, int] = {}  # read length -> steps run eagerly before its capture
        # Eager steps and captures run on a stream of their own (warm-up and capture on the same
        # stream, as CUDA graphs want); one memory pool for all of this batch's graphs, which
        # never run at the same time.
        self.stream = torch.cuda.Stream(device) if graphs else None
        self.pool = None
        # Seconds spent on this batch outside decoding proper: building it (the cache's first
        # allocation) and capturing its graphs, added to as graphs are captured.
        self.capture_seconds = time.perf_counter() - started

    # -- one step ------------------------------------------------------------------------------
    def _step(self, read_len: int) -> None:
        """Sample from the last logits, record, advance, and run the forward of the new tokens."""
        p = self.params
        active = ~self.finished
        if self.decoder.fused_sampling and sampling_kernel.fused(self.logits, p):  # one pass over the logits
            sampled, sampled_logprob = sampling_kernel.sample_with_logprobs(self.logits, p, self.sample_seed)
            self.sample_seed.add_(1)
        else:
            sampled = sample_tokens(self.logits, p, self.rng)
            sampled_logprob = sampled_logprobs(self.logits, sampled, p)
        token = torch.where(active, sampled, p.pad_token_id)
        logprob = torch.where(active, sampled_logprob, 0.0)
        self.history.scatter_(1, self.gen_len[:, None], token[:, None])
        self.logprob_history.scatter_(1, self.gen_len[:, None], logprob[:, None])
        self.gen_len.add_(active.long())
        done = self.gen_len >= p.max_new_tokens
        if p.eos_token_id is not None:
            done |= token == p.eos_token_id
        self.finished |= done
        # The token just sampled is fed at the row's next slot; a finished row keeps rewriting
        # its last slot, which nothing reads before the row is refilled.
        slot = self.gen_len + (self.prompt_len - 1)
        self.cache.write_slot.copy_(slot)
        self.mask.scatter_(3, slot.view(-1, 1, 1, 1), self.allowed)
        if self.sliding is not None:
            # open the new slot, close the one that leaves the window (a spare slot, never read,
            # while the row is shorter than the window)
            self.sliding.scatter_(3, slot.view(-1, 1, 1, 1), self.allowed)
            leaving = torch.where(slot >= self.window, slot - self.window, self.sliding.shape[-1] - 1)
            self.sliding.scatter_(3, leaving.view(-1, 1, 1, 1), self.blocked_rows)
        self.input_ids.copy_(token[:, None])
        self.position_ids.copy_((self.base_pos + self.gen_len - 1)[:, None])
        mask = self.mask[..., :read_len]
        self.cache.read_mask = mask
        sliding = self.sliding[..., :read_len] if self.sliding is not None else None
        logits = self.decoder.step_forward(self.input_ids, self.position_ids, layer_masks(self.config, mask, sliding),
                                           self.cache)
        self.logits.copy_(logits)

    def step(self, live: int) -> None:
        """One decode step for rows holding at most `live` tokens after it."""
        need = self.prompt_len + min(live, self.params.max_new_tokens)
        read_len = next(b for b in self.buckets if b >= need)
        graph = self.graphs.get(read_len)
        if graph is None and self.use_graphs:
            ran = self.eager_steps.get(read_len, 0)
            if ran < CAPTURE_AFTER:
                self.eager_steps[read_len] = ran + 1
                self._on_own_stream(lambda: self._step(read_len))
                return
            graph = self._capture(read_len)  # None: it failed, and this batch decodes eagerly from here
        if graph is not None:
            graph.replay()
        else:
            self._step(read_len)

    def _on_own_stream(self, work: Callable[[], None]) -> None:
        """`work` on this batch's stream, ordered after and before the current stream's work."""
        current = torch.cuda.current_stream()
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            work()
        current.wait_stream(self.stream)

    def _capture(self, read_len: int) -> torch.cuda.CUDAGraph | None:
        """The graph of one step at `read_len`, recorded (not run) into this batch's pool; None,
        with graphs off for this batch, when the model's step cannot be captured (recording runs
        nothing, so the rows' state is as before)."""
        started = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(self.rng)
        torch.cuda.synchronize()  # nothing of the stream's eager work may be pending in the capture

        def record() -> None:
            graph.capture_begin(pool=self.pool)
            try:
                self._step(read_len)
            finally:
                graph.capture_end()

        try:
            self._on_own_stream(record)
        except Exception as e:
            log.warning("generation: CUDA graph capture failed (%s: %s); decoding without graphs",
                        type(e).__name__, e)
            self.use_graphs = False
            return None
        self.pool = graph.pool()
        self.graphs[read_len] = graph
        self.capture_seconds += time.perf_counter() - started
        return graph

    # -- rows ----------------------------------------------------------------------------------
    def seed(self, seed: int) -> None:
        """Seed this batch's sampling (its generator is registered with its graphs; the fused
        sampler's seed tensor is advanced by the step itself)."""
        self.rng.manual_seed(seed)
        self.sample_seed.fill_(seed)

    def adopt(self, src: DecodeBatch, rows: list[int]) -> None:
        """Take over rows `rows` of `src` (same prompt width and sampling) as rows 0..k-1; the
        rest of this batch idles (finished, one key open so its attention stays finite)."""
        assert self.length == src.length and len(rows) <= self.rows
        k, index = len(rows), torch.tensor(rows, device=self.gen_len.device)
        for mine, theirs in ((self.cache.keys, src.cache.keys), (self.cache.values, src.cache.values)):
            for layer in range(mine.shape[0]):  # a layer at a time: the gather's copy stays one layer's
                mine[layer, :k] = theirs[layer].index_select(0, index)
        masks = ("mask", "sliding") if self.sliding is not None else ("mask",)
        for name in (*masks, "gen_len", "base_pos", "finished", "history", "logprob_history", "logits"):
            getattr(self, name)[:k] = getattr(src, name).index_select(0, index)
        for name in masks:
            getattr(self, name)[k:] = self.blocked
            getattr(self, name)[k:, ..., :1] = self.allowed[k:]
        self.finished[k:] = True
        self.gen_len[k:] = 0

    def fill(self, rows: torch.Tensor, ids: torch.Tensor, prompt_mask: torch.Tensor) -> None:
        """Prefill the left-padded prompts `ids` into batch rows `rows` (the other rows keep their state)."""
        width = ids.shape[1]
        positions = (prompt_mask.cumsum(dim=1) - 1).clamp_min(0)
        q = torch.arange(width, device=ids.device)
        # Each query attends to real keys at or before it, and always to itself, so left-pad
        # queries (no real key) stay finite instead of NaN.
        allowed = (prompt_mask.bool()[:, None, :] & (q[None, None, :] <= q[None, :, None])) | (
            q[None, None, :] == q[None, :, None])
        form = self.decoder.mask_form
        sliding = None
        if self.sliding is not None:
            sliding = form((allowed & within_window(q[None, :, None], q[None, None, :], self.window))[:, None])
        self.cache.prefill_rows = rows
        try:
            with self.decoder.eager():  # decode_layers.py: prefills run eagerly
                logits = self.decoder.step_forward(ids, positions, layer_masks(self.config, form(allowed[:, None]), sliding),
                                                   self.cache)
        finally:
            self.cache.prefill_rows = None
        self.logits.index_copy_(0, rows, logits.to(self.logits.dtype))
        self.mask.index_fill_(0, rows, self.blocked)
        self.mask[rows, 0, 0, :width] = form(prompt_mask.bool())
        if self.sliding is not None:
            # the first decode step's query sits at slot `width`; it closes slot width - window itself
            self.sliding.index_fill_(0, rows, self.blocked)
            self.sliding[rows, 0, 0, :width] = form(prompt_mask.bool() & (q >= width - self.window))
        self.gen_len.index_fill_(0, rows, 0)
        self.finished.index_fill_(0, rows, False)
        self.base_pos.index_copy_(0, rows, prompt_mask.sum(dim=1))


def call_seed(generator: torch.Generator | None) -> int:
    """One seed for a call's sampling, drawn from the caller's generator (one host read)."""
    device = generator.device if generator is not None else "cpu"
    return int(torch.randint(0, 2**62, (1,), generator=generator, device=device))


def decode(batch: DecodeBatch, input_ids: torch.Tensor, prompt_mask: torch.Tensor, generator, refill: bool,
           resize: Callable[[int], DecodeBatch] | None = None):
    """Complete every prompt of `input_ids` ([N, P], left-padded) with the rows of `batch`.

    resize(rows): a batch of fewer rows (same prompt width and sampling). Given, once no prompt
    waits and at most half the rows are busy, the busy rows move into a batch half the size (or
    smaller, not below COMPACT_MIN_ROWS): the drain of the last long completions then runs at the
    cost of a smaller batch instead of the full one.

    Returns (response [N, T], response_mask [N, T], logprobs [N, T] fp32, stats) with T the longest
    completion; logprobs holds each sampled token's log-prob (sampling.sampled_logprobs), 0 on pads."""
    params, rows, limit = batch.params, batch.rows, batch.params.max_new_tokens
    device, count = input_ids.device, input_ids.shape[0]
    response = torch.full((count, limit + 1), params.pad_token_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((count, limit + 1), dtype=torch.float32, device=device)
    lengths = torch.zeros(count, dtype=torch.long, device=device)
    waiting = deque(range(count))
    assigned = [-1] * rows  # prompt index held by each row, -1 when idle
    age = [0] * rows  # steps since each row was filled: an upper bound of its completion length
    stats = {"rows": rows, "steps": 0, "prefills": 0, "row_steps_busy": 0, "row_steps": 0, "compactions": 0}
    seed = call_seed(generator) if params.temperature != 0.0 else 0
    batch.seed(seed)

    def fill(free: list[int]) -> None:
        prompts = [waiting.popleft() for _ in free]
        index = torch.tensor(prompts, device=device)
        batch.fill(torch.tensor(free, device=device), input_ids[index], prompt_mask[index])
        for row, prompt in zip(free, prompts, strict=True):
            assigned[row], age[row] = prompt, 0
        stats["prefills"] += 1

    fill(list(range(min(rows, count))))
    while True:
        busy = [r for r in range(rows) if assigned[r] >= 0]
        oldest = max(age[r] for r in busy)
        # Check no later than when the oldest row must have reached its limit.
        ran = max(1, min(EOS_CHECK_EVERY, limit - oldest))
        for i in range(1, ran + 1):
            batch.step(oldest + i)
        for r in busy:
            age[r] += ran
        stats["steps"] += ran
        stats["row_steps"] += ran * rows
        stats["row_steps_busy"] += ran * len(busy)
        finished = batch.finished.tolist()  # the host sync of this check
        done = [r for r in busy if finished[r]]
        if done:
            rows_t = torch.tensor(done, device=device)
            prompts_t = torch.tensor([assigned[r] for r in done], device=device)
            response.index_copy_(0, prompts_t, batch.history[rows_t])
            logprobs.index_copy_(0, prompts_t, batch.logprob_history[rows_t])
            lengths.index_copy_(0, prompts_t, batch.gen_len[rows_t])
            for r in done:
                assigned[r] = -1
        if waiting:
            idle = [r for r in range(rows) if assigned[r] < 0]
            if refill and idle:
                fill(idle[: len(waiting)])
            elif len(idle) == rows:
                fill(idle[: min(rows, len(waiting))])
        busy = [r for r in range(rows) if assigned[r] >= 0]
        if not busy and not waiting:
            break
        if resize is not None and not waiting:
            target = rows
            while target // 2 >= max(len(busy), COMPACT_MIN_ROWS):
                target //= 2
            if target < rows:
                small = resize(target)
                small.seed(seed + target)
                small.adopt(batch, busy)
                batch, rows = small, target
                assigned = [assigned[r] for r in busy] + [-1] * (target - len(busy))
                age = [age[r] for r in busy] + [0] * (target - len(busy))
                stats["compactions"] += 1
    width = int(lengths.max())
    response_mask = torch.arange(width, device=device)[None, :] < lengths[:, None]
    response = torch.where(response_mask, response[:, :width], params.pad_token_id)
    logprobs = torch.where(response_mask, logprobs[:, :width], 0.0)
    return response, response_mask.long(), logprobs, stats
