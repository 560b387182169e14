"""Decoder layers compiled for generation, with the KV cache written outside the compiled graphs.

Why: a decode step of a 1.5B model at batch 256 launched ~1,300 kernels, ~1,200 of them small
(RMSNorm's six or seven element-wise kernels, rotary embedding's slices and concatenations,
SiLU times the up projection, residual adds): ~2.7 ms of a 7.3 ms step (docs/benchmarks.md,
"Rollout"). `torch.compile` fuses those into a few Triton kernels around the matmuls. Compiling
the whole forward was tried and was slower: the cache write inside the graph became a copy of
the whole KV cache per layer (a mutated graph input). Here the cache's `update`
(decode_batch.SlotCache) is excluded from tracing, so each layer compiles into the part before
the cache write and the part after it, and the write stays the in-place scatter it is eagerly.

Within the context, every decoder layer that is not compiled already runs through a compiled
copy of its call (made once per layer and kept, dynamic in the batch and length dimensions, so
compaction's smaller batches and the read-length buckets reuse one graph). Prompt prefills run
the layers eagerly (`paused`): a prompt block is a different graph from a one-token step (dynamo
specializes a dimension of 1), compiling it too doubled the graphs the first rollout compiles,
and a prefill is one forward per refill against a decode step per token. On exit the layers
are as they were, so training is unaffected. A layer the trainer compiled (DPO's
`compile_layers`) is left to its own compiled call.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from rlkube.runtime.engine.models import decoder_layers


class CompiledDecodeLayers:
    """Within: `model`'s decoder layers run compiled (when `enabled`); restored on exit.

    Kept by the Decoder for the model's life: each layer's compiled call is made on first entry
    and reused. Off for layers sharded by FSDP (their calls carry the unshard hooks)."""

    def __init__(self, model: torch.nn.Module, enabled: bool):
        sharded = any(type(p).__name__ == "DTensor" for p in model.parameters())
        self.layers = decoder_layers(model) if enabled and not sharded else []
        self.calls: dict[int, object] = {}  # layer index -> its compiled call
        self.swapped: list[torch.nn.Module] = []

    def __enter__(self):
        # The attention's frame is traced apart from its layer's (the cache write breaks the
        # graph inside it), and dynamo takes a module's int attributes as constants: without
        # this each layer's `layer_idx` compiled its own attention graph, and past the eighth the
        # recompile limit left the rest uncompiled.
        self._unspec_ints = torch._dynamo.config.patch(allow_unspec_int_on_nn_module=bool(self.layers))
        self._unspec_ints.__enter__()
        for i, layer in enumerate(self.layers):
            if layer._compiled_call_impl is not None:
                continue  # compiled by its trainer
            if i not in self.calls:
                self.calls[i] = torch.compile(layer._call_impl, dynamic=True)
            layer._compiled_call_impl = self.calls[i]
            self.swapped.append(layer)
        return self

    @contextmanager
    def paused(self):
        """Within: the layers this context compiled run eagerly (a prefill: see DecodeBatch.fill)."""
        swapped = [(layer, layer._compiled_call_impl) for layer in self.swapped]
        for layer, _ in swapped:
            layer._compiled_call_impl = None
        try:
            yield
        finally:
            for layer, call in swapped:
                layer._compiled_call_impl = call

    def __exit__(self, *exc):
        for layer in self.swapped:
            layer._compiled_call_impl = None
        self.swapped = []
        self._unspec_ints.__exit__(*exc)
        return False
