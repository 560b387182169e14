"""`python -m rlkube.runtime doctor`: what this machine offers the trainer, and a check of it.

Prints one JSON object: CUDA device count and version, whether NCCL and flash-attn are
available, the attention kernel 'auto' would pick, and every GPU NVML sees (name, memory,
utilization). With `--require cuda,nccl,flash_attn` it exits 1 naming each capability that is
missing — an init container or a smoke test can gate on it.
"""

from __future__ import annotations

import json
import sys

CAPABILITIES = ("cuda", "nccl", "flash_attn")


def device_report() -> dict:
    import torch
    import torch.distributed as tdist

    from rlkube.runtime.engine.models import flash_attn_available, pick_attention
    from rlkube.runtime.infra.metrics import GpuMonitor

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    return {
        "torch_version": torch.__version__,
        "cuda_count": torch.cuda.device_count() if cuda else 0,
        "cuda_version": torch.version.cuda,
        "nccl_available": bool(cuda and tdist.is_available() and tdist.is_nccl_available()),
        "gloo_available": bool(tdist.is_available() and tdist.is_gloo_available()),
        "flash_attn_available": flash_attn_available(),
        "attention_backend": pick_attention("auto", device),
        "gpus": GpuMonitor(device).gpus(),
    }


def missing(report: dict, required: list[str]) -> list[str]:
    """Reasons, one per required capability the report lacks."""
    reasons = []
    for cap in required:
        if cap not in CAPABILITIES:
            reasons.append(f"--require: unknown capability {cap!r} (known: {', '.join(CAPABILITIES)})")
        elif cap == "cuda" and report["cuda_count"] < 1:
            reasons.append("cuda: no CUDA device is visible to torch")
        elif cap == "nccl" and not report["nccl_available"]:
            reasons.append("nccl: torch.distributed has no NCCL backend here (or no CUDA device)")
        elif cap == "flash_attn" and not report["flash_attn_available"]:
            reasons.append("flash_attn: the flash_attn package is not installed")
    return reasons


def main(required: list[str]) -> int:
    report = device_report()
    problems = missing(report, required)
    report["missing"] = problems
    print(json.dumps(report, indent=1))
    for p in problems:
        print(f"doctor: missing {p}", file=sys.stderr)
    return 1 if problems else 0
