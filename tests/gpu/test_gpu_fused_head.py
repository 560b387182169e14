"""GPU tier, fused head: on CUDA the fused head's chunk functions run through torch.compile (on the
CPU they run eagerly), so the compiled kernels are checked here against the unfused head.

    PYTHONPATH=runtime python -m pytest tests/gpu/test_gpu_fused_head.py -q

bf16 hidden states and head, 4,133 tokens (a chunk of 1,024 and an odd last one), vocab 32,000,
hidden 512, the weight at HF's init scale. Tolerances as in tests/unit/runtime/test_fused_head.py
for bf16: log-probs and entropy within 2e-3 absolute (both are fp32 over the same bf16 logits; the
matmul may tile differently for a chunk than for all rows), gradients within 2e-2 relative L2
(the unfused path rounds its [N, vocab] gradient to bf16 once, the fused one chunk by chunk).
Each case also asserts the compiled path ran (a compile failure falls back to eager and warns),
and that the head's weight gradient was summed by addmm with an fp32 output.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from rlkube.runtime.engine import fused_head  # noqa: E402
from rlkube.runtime.engine.fused_head import head_logprobs  # noqa: E402

N, V, D, CHUNK = 4133, 32000, 512, 1024


def run(fused: bool, temperature: float, with_entropy: bool, frozen: bool):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(N, D, generator=g).cuda().bfloat16().requires_grad_()
    w = (torch.randn(V, D, generator=g) * 0.02).cuda().bfloat16().requires_grad_(not frozen)
    y = torch.randint(0, V, (N,), generator=g).cuda()
    a, b = torch.randn(N, generator=g).cuda(), torch.randn(N, generator=g).cuda()
    logps, ent = head_logprobs(h, w, y, chunk=CHUNK, temperature=temperature, with_entropy=with_entropy,
                               fused=fused)
    ((a * logps).sum() + ((b * ent).sum() if ent is not None else 0.0)).backward()
    return logps.detach(), None if ent is None else ent.detach(), h.grad, w.grad


@pytest.mark.parametrize("temperature,with_entropy,frozen", [
    (1.0, False, False), (0.7, True, False), (1.0, False, True),
])
def test_compiled_fused_head_equals_unfused(temperature, with_entropy, frozen):
    fused = run(True, temperature, with_entropy, frozen)
    assert "stats" in fused_head._COMPILED and not fused_head._COMPILED.get("failed")
    assert not fused_head._FALLBACKS  # the head's weight gradient went through addmm's fp32 output
    plain = run(False, temperature, with_entropy, frozen)
    torch.testing.assert_close(fused[0], plain[0], rtol=0, atol=2e-3)
    if with_entropy:
        torch.testing.assert_close(fused[1], plain[1], rtol=0, atol=2e-3)
    for got, want in zip(fused[2:], plain[2:], strict=True):
        if want is None:
            assert got is None
            continue
        rel = (got.float() - want.float()).norm() / want.float().norm()
        assert rel < 2e-2, float(rel)
