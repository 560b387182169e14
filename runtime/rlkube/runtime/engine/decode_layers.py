"""Decoder layers compiled for generation: one graph per layer, the KV cache write in it, in place.

Why: a decode step of a 1.5B model at batch 256 launched ~1,300 kernels, ~1,200 of them small
(RMSNorm's six or seven element-wise kernels, rotary embedding's slices and concatenations,
SiLU times the up projection, residual adds): ~2.7 ms of a 7.3 ms step (docs/benchmarks.md,
"Rollout"). `torch.compile` fuses those into a few Triton kernels around the matmuls. Compiling
the whole forward was tried and was slower: the cache write inside the graph became a copy of
the whole KV cache per layer (a mutated graph input). Here the write is an operator of its own
(decode_batch.write_kv_slots) that the graph calls in place on the cache, so each layer is one
graph, the write included. Excluding the write from tracing instead, as was done first, broke
every layer into four graphs, and each wrapper around the attention's call (transformers'
deprecation and kernel-hub wrappers) into frames dynamo traced twice: ten traced frames where
one does, which every start and restart paid (on CPU, 11.6 s of decode compile against 8.7 s
with one graph and the cache's fixed dimensions static, both with every artifact cached).

Within the context, every decoder layer that is not compiled already runs through a compiled
copy of its call (made once per layer and kept, dynamic in the batch and length dimensions, so
compaction's smaller batches and the read-length buckets reuse one graph). Prompt prefills run
the layers eagerly (`paused`): a prompt block is a different graph from a one-token step (dynamo
specializes a dimension of 1), compiling it too doubled the graphs the first rollout compiles,
and a prefill is one forward per refill against a decode step per token. On exit the layers
are as they were, so training is unaffected. A layer its trainer compiled for training
(models.compile_layers: PPO/GRPO with `model.compile: layers`) generates through this context's
call too, or eagerly when this one is off, and gets its own back on exit: its training graph
is compiled for training shapes and settings, not for decoding.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
import torch.fx.experimental._config as fx_config

from rlkube.runtime.engine.models import decoder_layers


class CompiledDecodeLayers:
    """Within: `model`'s decoder layers run compiled for decoding (when `enabled`), else eagerly;
    restored on exit.

    Kept by the Decoder for the model's life: each layer's compiled call is made on first entry
    and reused. Off for layers sharded by FSDP (their calls carry the unshard hooks)."""

    def __init__(self, model: torch.nn.Module, enabled: bool):
        sharded = any(type(p).__name__ == "DTensor" for p in model.parameters())
        self.enabled = enabled and not sharded
        try:
            self.layers = decoder_layers(model)
        except TypeError:  # no decoder layers to find: none compiled either
            self.layers = []
        self.calls: dict[int, object] = {}  # layer index -> its compiled call
        self.swapped: list[tuple[torch.nn.Module, object]] = []  # (layer, the call it had before)

    def __enter__(self):
        # Dynamo takes a module's int attributes as constants: without this each layer's
        # `layer_idx` (the cache's layer it selects) compiled its own graph, and past the eighth
        # the recompile limit left the rest uncompiled.
        self._unspec_ints = torch._dynamo.config.patch(allow_unspec_int_on_nn_module=self.enabled)
        self._unspec_ints.__enter__()
        # Dynamo gives two dimensions of equal size one symbol ("duck sizing"): a batch of 128 rows
        # and a head_dim of 128 became one, so each smaller batch (compaction, a refill's last
        # rows) failed that guard and compiled three more graphs.
        self._no_duck = fx_config.patch(use_duck_shape=False) if self.enabled else nullcontext()
        self._no_duck.__enter__()
        for i, layer in enumerate(self.layers):
            if self.enabled and i not in self.calls:
                self.calls[i] = torch.compile(layer._call_impl, dynamic=True)
            call = self.calls.get(i)  # None (eager) when the decode compile is off
            if layer._compiled_call_impl is not call:
                self.swapped.append((layer, layer._compiled_call_impl))
                layer._compiled_call_impl = call
        return self

    @contextmanager
    def paused(self):
        """Within: the layers run eagerly (a prefill: see DecodeBatch.fill)."""
        calls = [(layer, layer._compiled_call_impl) for layer in self.layers]
        for layer, _ in calls:
            layer._compiled_call_impl = None
        try:
            yield
        finally:
            for layer, call in calls:
                layer._compiled_call_impl = call

    def __exit__(self, *exc):
        for layer, call in self.swapped:
            layer._compiled_call_impl = call
        self.swapped = []
        self._no_duck.__exit__(*exc)
        self._unspec_ints.__exit__(*exc)
        return False
