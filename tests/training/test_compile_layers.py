"""`model.compile: layers` (regional torch.compile of the decoder layers) trains the same DPO run
as the uncompiled model: every step's loss and the weights after the last step agree to float32
rounding. Two steps, so the second one sees an actor that has moved away from its reference: a
reference whose compiled layers called the actor's forward (the deep-copy hazard
`compile_layers` is called after) would give a different loss there.

On CPU inductor generates C++ (gcc), so the first step pays a compile of ~10-30 s on 2 cores; on
CUDA (tests/gpu) the same comparison runs in bf16 with the flex-packed rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra.distributed import init_from_env

from .conftest import tiny_config

pytestmark = pytest.mark.slow


def run(tmp: Path, compile_mode: str, **model) -> tuple[list[float], dict, bool]:
    """Two DPO steps of the tiny model (`model`: fields over tiny_config's model section) on the
    device the runtime picks (CUDA where present)."""
    from rlkube.runtime.trainers.dpo import DPOTrainer

    cfg = tiny_config(tmp, training={"steps": 2, "lr": 1e-2, "seed": 0},
                      batching={"globalBatch": 8, "mode": "fixed", "maxMicroBatch": 4, "minMicroBatch": 1})
    cfg["model"] |= model | {"compile": compile_mode}
    trainer = DPOTrainer(RuntimeConfig.model_validate(cfg), init_from_env({"actor": [0], "reference": [0]}))
    losses = [trainer.step(s)["loss"] for s in range(2)]
    weights = {k: v.detach().float().cpu().clone() for k, v in trainer.policy.state_dict().items()}
    return losses, weights, trainer.compiled


def test_compiled_layers_train_like_eager(tmp_path):
    torch._dynamo.reset()
    eager_losses, eager_w, eager_compiled = run(tmp_path / "eager", "off")
    losses, weights, compiled = run(tmp_path / "compiled", "layers")
    assert not eager_compiled and compiled
    assert losses == pytest.approx(eager_losses, rel=1e-4, abs=1e-5)
    assert eager_losses[0] != eager_losses[1]  # the second step saw a moved actor
    # AdamW divides by the gradient's running RMS, so where a gradient is ~0 rounding moves single
    # entries by up to lr; the tensors as a whole must agree
    for name, w in eager_w.items():
        rel = (weights[name] - w).norm() / w.norm().clamp_min(1e-12)
        assert rel < 1e-3, f"{name}: relative L2 difference {rel:.2e}"


def test_auto_compiles_on_cuda_only(tmp_path):
    from rlkube.runtime.engine.models import compile_layers

    layer = torch.nn.Linear(2, 2)
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList([layer])
    assert not compile_layers(model, "auto", torch.device("cpu"))
    assert not compile_layers(model, "off", torch.device("cuda"))
    assert compile_layers(model, "layers", torch.device("cpu"))
