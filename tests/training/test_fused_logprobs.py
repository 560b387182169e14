"""`training.fusedLogprobs` reaches every log-prob the trainers take (DPO's policy and reference,
the RL actor and reference) and does not change the step: the real trainer's first-step gradient
is the same with the fused head and with the unfused one, for DPO and for GRPO with the entropy
bonus and the KL to the reference as a loss term (the entropy's gradient goes through the head).

Tolerance: test_gradient_equivalence's (float32 models; rtol 1e-4, atol 1e-6 of the largest
entry, 1e-5 relative L2 over the whole gradient): the two heads differ only in the order of
their fp32 reductions.
"""

from __future__ import annotations

import pytest
import torch

from .test_gradient_equivalence import assert_same, config, step_gradients


def logprob_modules(trainer, algorithm: str) -> list[torch.nn.Module]:
    if algorithm == "dpo":
        return [trainer.policy, trainer.reference]
    return [trainer.actor.model, trainer.scorer.reference]


def first_step_gradients(algorithm: str, cfg: dict, fused: bool) -> tuple[dict[str, torch.Tensor], float]:
    def flag_reaches_every_module(trainer) -> None:
        modules = logprob_modules(trainer, algorithm)
        assert all(m is not None and m.fused is fused for m in modules), [getattr(m, "fused", m) for m in modules]

    cfg["training"]["fusedLogprobs"] = fused
    grads, rec = step_gradients(algorithm, cfg, inspect=flag_reaches_every_module)
    return grads, rec["loss"]


@pytest.mark.parametrize("algorithm", ["dpo", "grpo"])
def test_fused_and_unfused_logprobs_give_the_same_step(algorithm, tmp_path, monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    torch.set_num_threads(1)
    results = {}
    for fused in (True, False):
        cfg = config(algorithm, str(tmp_path / f"fused-{fused}"), ranks=1, micro=8)
        if algorithm == "grpo":
            cfg["training"]["entropyCoef"] = 0.05
        results[fused] = first_step_gradients(algorithm, cfg, fused)
    (fused_grads, fused_loss), (plain_grads, plain_loss) = results[True], results[False]
    assert fused_loss == pytest.approx(plain_loss, rel=1e-5, abs=1e-6)
    assert_same(fused_grads, plain_grads, f"{algorithm}: fused vs unfused head")


def test_compiled_chunks_equal_eager(monkeypatch):
    """The torch.compile'd chunk functions (what CUDA runs) give the eager ones' numbers; compiled
    here on the CPU, one variant with every branch (entropy, temperature, both upstream grads)."""
    from rlkube.runtime.engine import fused_head
    from tests.unit.runtime.test_fused_head import assert_fp32_close, inputs, run

    torch.set_num_threads(1)
    h, w, y, a, b = inputs(37, 16, 101)
    eager = run(h, w, y, a, b, chunk=5, temperature=0.7, with_entropy=True)
    monkeypatch.setattr(fused_head, "COMPILED_ON", ("cpu",))
    monkeypatch.setattr(fused_head, "_COMPILED", {})
    compiled = run(h, w, y, a, b, chunk=5, temperature=0.7, with_entropy=True)
    assert "stats" in fused_head._COMPILED and not fused_head._COMPILED.get("failed")
    for got, want in zip(compiled, eager, strict=True):
        assert_fp32_close(got, want)
