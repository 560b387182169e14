"""GPU tier: `model.compile: layers` on CUDA trains the DPO run of the uncompiled model, in bf16 with
flex_attention packing (the configuration `auto` compiles), the compiled BlockMask path included.

bf16 keeps 8 bits of mantissa and inductor reorders the fused ops' arithmetic, so per-step losses
agree to 2e-2 relative (float32 on CPU: 1e-4, tests/training/test_compile_layers.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from tests.training.test_compile_layers import run  # noqa: E402

# head dim 32: flex's CUDA kernel needs >= 16 (tiny_config's model has 16)
MODEL = {"dtype": "bfloat16", "attention": "auto"}


def test_compiled_layers_train_like_eager_bf16_flex(tmp_path):
    torch._dynamo.reset()
    eager, _, _ = run(tmp_path / "eager", "off", **MODEL)
    compiled_losses, _, compiled = run(tmp_path / "compiled", "auto", **MODEL)
    assert compiled
    assert compiled_losses == pytest.approx(eager, rel=2e-2)
