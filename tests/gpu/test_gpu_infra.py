"""GPU tier, infrastructure: one NCCL process group round trip, and the NVML busy sampler.

Run as tests/gpu/test_gpu_engine.py says; skipped without CUDA (and the sampler test without
NVML, nvidia-ml-py).
"""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

import torch.distributed as dist  # noqa: E402

from rlkube.runtime.infra.gpu_busy import nvml_source, physical_index, sampler_for  # noqa: E402

DEVICE = torch.device("cuda", 0)


def test_nccl_group_of_one_all_reduce_and_broadcast(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=DEVICE)
    try:
        x = torch.arange(4, dtype=torch.float32, device=DEVICE) + 1
        dist.all_reduce(x)
        y = torch.full((3,), 7.0, device=DEVICE)
        dist.broadcast(y, src=0)
        torch.cuda.synchronize(DEVICE)
        assert dist.get_backend() == "nccl"
        assert x.tolist() == [1.0, 2.0, 3.0, 4.0] and y.tolist() == [7.0] * 3
    finally:
        dist.destroy_process_group()


def test_nvml_busy_sampler_reads_a_busy_gpu():
    if nvml_source(physical_index(0)) is None:
        pytest.skip("NVML not available (nvidia-ml-py, driver)")
    sampler = sampler_for(DEVICE)
    assert sampler.available
    a = torch.randn(4096, 4096, device=DEVICE)
    window = None
    try:
        sampler.window()  # start a fresh window
        for _ in range(20):  # at most ~10 s; NVML refreshes its counter every 1/6 s to 1 s
            deadline = time.monotonic() + 0.5
            with sampler.phase("forward_backward"):
                while time.monotonic() < deadline:
                    for _ in range(8):
                        a = torch.tanh(a @ a)
                    torch.cuda.synchronize(DEVICE)
            window = sampler.window()
            if window.samples and window.mean:
                break
    finally:
        sampler.close()
    assert window is not None and window.samples > 0
    assert 0.0 < window.mean <= 1.0
    assert 0.0 < window.phases["forward_backward"] <= 1.0
