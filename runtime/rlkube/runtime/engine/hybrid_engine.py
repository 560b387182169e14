"""The hybrid engine: one copy of the actor's weights serves both training and generation.

Training holds the actor FSDP2-sharded over its group (each rank keeps 1/N of every
parameter, plus its gradients and AdamW state). For a rollout the engine:

1. drops the gradients (`zero_grad(set_to_none=True)`), so no gradient memory is live, and
   on CUDA, when free memory is short, moves the AdamW moments to host memory;
2. all-gathers every FSDP unit (`FSDPModule.unshard()`) and tells the units not to reshard
   after each forward, so the per-token decode forwards run on the gathered weights with no
   communication at all — this is the generation layout: the plain HF module, unsharded;
3. generates with the KV cache in the memory steps 1-2 left free;
4. frees the KV cache and CUDA graphs, reshards (the gathered buffers are freed; the shards
   were never copied), and brings the optimizer state back.

With a one-rank actor group nothing is sharded and the parameters never move, so (unless memory
is short) the static KV cache and the captured decode graph are kept for the next rollout
instead of being re-captured every step.

So the only full copy of the weights that ever exists is the transient gathered one, while
generating; there is no separate inference model. With a one-rank actor group nothing is
sharded and the engine only does steps 1 and 3 (and 4's optimizer part). The seconds spent in steps 2 and 4 are
the resharding time reported in the metrics.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from rlkube.runtime.engine.generation import Decoder, GenerationOutput
from rlkube.runtime.engine.models import evaluating
from rlkube.runtime.engine.policy import PolicyModel
from rlkube.runtime.engine.sampling import SamplingParams

# With the actor's gradients dropped, offload the optimizer state for generation only when less
# than this share of the device's memory is free (the KV cache then needs the room).
OFFLOAD_BELOW_FREE_FRACTION = 0.25


def _fsdp_units(module: torch.nn.Module) -> list[torch.nn.Module]:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return []
    return [m for m in module.modules() if isinstance(m, FSDPModule)]


def parameter_bytes(module: torch.nn.Module) -> int:
    """Bytes of the parameter storage this process holds for `module` right now (a DTensor
    counts its local shard; an unsharded FSDP parameter its full tensor)."""
    seen: set[int] = set()
    total = 0
    for p in module.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        storage = local.untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


class HybridEngine:
    """Switches the actor between its training layout (sharded) and its generation layout."""

    def __init__(
        self,
        policy: PolicyModel,
        optimizer: torch.optim.Optimizer | None = None,
        offload_optimizer: bool | None = None,
        static_cache: bool | None = None,
        cuda_graphs: bool | None = None,
        decode_rows: int | None = None,
        refill: bool = True,
        compile_layers: bool = False,
    ) -> None:
        self.policy = policy
        self.optimizer = optimizer
        self.units = _fsdp_units(policy)
        # None: decide per rollout on CUDA (offload only when free memory is short, since the
        # round trip over PCIe costs seconds per step for a 1B+ model); never on CPU.
        self.offload_optimizer = offload_optimizer
        # Graph capture pins the weights' addresses; FSDP re-gathers into fresh memory on each
        # unshard, so graphs would be re-captured per rollout. The Decoder notices (it keys its
        # graphs on the parameters' addresses) and re-captures only then.
        # decode_rows / refill: rollout.decodeRows and rollout.refill (the Decoder's batch_rows);
        # compile_layers: generate through compiled decoder layers (engine/decode_layers.py).
        self.decoder = Decoder(policy.lm, static_cache=static_cache, cuda_graphs=cuda_graphs,
                               batch_rows=decode_rows, refill=refill, compile_layers=compile_layers)
        if self.units:
            # Sharded: every rollout re-captures, so one graph over the whole cache costs less
            # than capturing one per read-length bucket to save a share of the attention reads.
            self.decoder.length_buckets = 1
            self.decoder.compact = False  # same reason: no graphs for smaller batches either
        self.reshard_seconds = 0.0  # unshard + reshard, cumulative
        self.offload_seconds = 0.0
        self.generating = False

    @property
    def sharded(self) -> bool:
        return bool(self.units)

    def _move_optimizer_state(self, device: torch.device | str) -> None:
        if self.optimizer is None:
            return
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    state[key] = value.to(device, non_blocking=True)

    def _should_offload(self, device: torch.device) -> bool:
        if self.offload_optimizer is not None:
            return self.offload_optimizer
        if device.type != "cuda" or self.optimizer is None:
            return False
        free, total = torch.cuda.mem_get_info(device)
        return free < OFFLOAD_BELOW_FREE_FRACTION * total

    @contextmanager
    def generation_mode(self) -> Iterator[None]:
        """Inside: the actor is unsharded, without gradients, ready for `generate`."""
        if self.generating:
            raise RuntimeError("HybridEngine.generation_mode is not re-entrant")
        device = next(self.policy.parameters()).device
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.policy.zero_grad(set_to_none=True)
        started = time.perf_counter()
        offload = self._should_offload(device)
        if offload:
            self._move_optimizer_state("cpu")
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        self.offload_seconds += time.perf_counter() - started
        started = time.perf_counter()
        if self.units:
            # FSDP2 initialises its root lazily on the root's first forward. Generation calls the
            # inner HF model, so without this each layer would initialise itself as a root and
            # the next training forward would fail.
            self.units[0]._get_fsdp_state()._lazy_init()
        for unit in self.units:
            unit.unshard()
        for unit in self.units:
            unit.set_reshard_after_forward(False, recurse=False)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.reshard_seconds += time.perf_counter() - started
        self.generating = True
        try:
            with evaluating(self.policy):
                yield
        finally:
            self.generating = False
            if self.sharded or offload:
                # Sharded: the next unshard gathers into fresh memory, so the graph would be
                # re-captured anyway; short of memory: training needs the cache's room.
                self.decoder.release()
            started = time.perf_counter()
            for unit in self.units:
                unit.set_reshard_after_forward(True, recurse=False)
                unit.reshard()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            self.reshard_seconds += time.perf_counter() - started
            started = time.perf_counter()
            if offload:
                self._move_optimizer_state(device)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            self.offload_seconds += time.perf_counter() - started

    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> GenerationOutput:
        """Generate in the generation layout (enters it for the call unless already inside)."""
        if self.generating:
            return self.decoder.generate(input_ids, attention_mask, params, generator)
        with self.generation_mode():
            return self.decoder.generate(input_ids, attention_mask, params, generator)
