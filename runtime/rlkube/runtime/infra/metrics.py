"""What a user tunes by: tokens/s of real tokens, MFU against the card's peak, GPU state.

MFU counts the FLOPs the step needs, not the FLOPs a particular implementation spends:
- transformer body: 2 x (non-embedding parameters) per token plus causal attention,
  2 x 2 x layers x (heads x head_dim) x n(n+1)/2 per sequence of n tokens (per-sample lengths:
  a packed row's block mask has no cross-sample attention to count);
- language-model head: 2 x hidden x vocab per *scored* token (DPO scores response tokens only);
- the policy runs forward and backward (3x forward), the reference forward only (1x);
- recomputation by gradient checkpointing is not counted (it is overhead, not work).

Peak: `RLKUBE_PEAK_TFLOPS` if set, else 989 TFLOP/s (datasheet bf16 dense) for H100/H200. The
benchmarks also measure the card's bf16 matmul ceiling in the run (~800 TFLOP/s on an H200,
tests/gpu/bench_dpo.py) and report against both. On CPU there is no peak and MFU is None.

GPU busy time (gpu_busy.py) is exported on rank 0's /metrics as
`rlkube_gpu_busy_ratio{role,rank,phase}`: the mean busy fraction of rank `rank`'s GPU over the
last step (phase="step") and over each phase of it (phase="generate", "optimizer", ...); `role`
is the roles that rank holds, joined by "+". A phase with no sample in the step keeps no series.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

DATASHEET_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


@dataclass(frozen=True)
class FlopModel:
    """Per-token FLOP coefficients of a causal LM."""

    body_params: int
    layers: int
    attn_width: int  # heads x head_dim
    hidden: int
    vocab: int

    @classmethod
    def of(cls, lm: torch.nn.Module) -> FlopModel:
        lm = getattr(lm, "lm", lm)
        cfg = lm.config
        emb = lm.get_input_embeddings().weight
        head = lm.get_output_embeddings().weight
        total = sum(p.numel() for p in lm.parameters())
        body = total - emb.numel() - (0 if head is emb else head.numel())
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        return cls(body, cfg.num_hidden_layers, heads * head_dim, cfg.hidden_size, cfg.vocab_size)

    def forward_flops(self, seq_lens: list[int], scored_tokens: int) -> float:
        tokens = sum(seq_lens)
        attn = 4.0 * self.layers * self.attn_width * sum(n * (n + 1) / 2 for n in seq_lens)
        return 2.0 * self.body_params * tokens + attn + 2.0 * self.hidden * self.vocab * scored_tokens

    def dpo_step_flops(self, seq_lens: list[int], scored_tokens: int) -> float:
        """Policy forward+backward (3x) plus reference forward (1x)."""
        return 4.0 * self.forward_flops(seq_lens, scored_tokens)


def peak_flops(device: torch.device) -> tuple[float | None, str]:
    """The peak to report MFU against, and where it came from."""
    env = os.environ.get("RLKUBE_PEAK_TFLOPS")
    if env:
        return float(env) * 1e12, "RLKUBE_PEAK_TFLOPS"
    if device.type != "cuda":
        return None, "no peak on CPU"
    name = torch.cuda.get_device_name(device)
    for key, value in DATASHEET_PEAK.items():
        if key in name:
            return value, f"{key} datasheet bf16 dense"
    return None, f"unknown card {name!r}: set RLKUBE_PEAK_TFLOPS"


class BusyGauges:
    """`rlkube_gpu_busy_ratio{role,rank,phase}` in a Prometheus registry (rank 0's /metrics)."""

    NAME = "rlkube_gpu_busy_ratio"

    def __init__(self, registry, role_ranks: dict[str, list[int]]) -> None:
        from prometheus_client import Gauge

        self.gauge = Gauge(self.NAME, "Mean GPU busy fraction (NVML, sampled at 10 Hz) over the last step "
                           "(phase=step) and over each phase of it, 0..1", ["role", "rank", "phase"],
                           registry=registry)
        self.role_ranks = role_ranks

    def role_of(self, rank: int) -> str:
        return "+".join(sorted(r for r, ranks in self.role_ranks.items() if rank in ranks)) or "none"

    def set(self, ranks: list[dict[str, float | None]]) -> None:
        """One row a rank, as `gpu_busy.JobBusy.ranks`: phase name -> mean or None."""
        for rank, row in enumerate(ranks):
            role = self.role_of(rank)
            for phase, value in row.items():
                labels = (role, str(rank), phase)
                if value is None:
                    try:
                        self.gauge.remove(*labels)
                    except KeyError:
                        pass
                else:
                    self.gauge.labels(*labels).set(value)


class GpuMonitor:
    """Memory of this process's GPU, and its NVML handle (None where unavailable). Busy time is
    infra/gpu_busy.py's sampler: one NVML read says little about a step."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.handle = None
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            index = device.index if device.index is not None else torch.cuda.current_device()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._nvml = pynvml
        except Exception:  # NVML missing in the container: torch's own counters still work
            self.handle = None

    def memory_total(self) -> int | None:
        if self.device.type != "cuda":
            return None
        return torch.cuda.get_device_properties(self.device).total_memory

    def peak_memory_fraction(self) -> float | None:
        """Peak device memory the caching allocator held since the last reset, over the card's
        total: reserved, not only allocated, since what the allocator holds (fragments included)
        is what runs out."""
        total = self.memory_total()
        if not total:
            return None
        return torch.cuda.max_memory_reserved(self.device) / total

    def reset_peak(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def gpus(self) -> list[dict]:
        """All GPUs NVML sees: name, memory, utilization (for doctor)."""
        out = []
        try:
            import pynvml

            pynvml.nvmlInit()
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                name = pynvml.nvmlDeviceGetName(h)
                out.append({
                    "index": i,
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "memoryTotal": int(mem.total),
                    "memoryUsed": int(mem.used),
                    "utilization": pynvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
                })
        except Exception:
            pass
        return out
