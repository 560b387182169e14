"""`model.compile: layers` for PPO: the actor, the critic and the reference score and train through
compiled decoder layers (engine/models.compile_layers), and the run's losses are those of the same
run scored and trained eagerly; the steps after the first, with other response lengths and row
counts, compile nothing more (the layers are dynamic in both from their first call).

Both runs decode through the same compiled decode layers (the training compile is switched off in
the second by replacing `compile_role` where the RL roles call it), so their rollouts are the
same tokens and only the scoring and training passes differ. On CPU inductor generates C++: the
first step of the compiled run pays ~50 s on 2 cores (~20 s of it the decode graphs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.engine.models import decoder_layers
from rlkube.runtime.infra.distributed import init_from_env
from rlkube.runtime.trainers.rl import actor, critic, scoring
from rlkube.runtime.trainers.rl.trainer import RLTrainer

from .rl_common import rl_config

pytestmark = pytest.mark.slow

STEPS = 3


def run(tmp: Path) -> tuple[list[float], list[int], RLTrainer]:
    """STEPS PPO steps (critic and reference colocated with the actor), `model.compile: layers`;
    the losses and the process's count of compiled graphs after each step."""
    cfg = rl_config(tmp, "ppo", training={"steps": STEPS, "lr": 3e-3, "seed": 0, "kl": 0.05, "ppoEpochs": 2,
                                          "miniBatches": 2},
                    batching={"globalBatch": 16, "maxMicroBatch": 4, "mode": "fixed"})
    cfg["model"]["compile"] = "layers"
    cfg["roles"]["reference"] = {"colocateWith": "actor"}
    cfg = RuntimeConfig.model_validate(cfg)
    trainer = RLTrainer(cfg, init_from_env(cfg.device_map))
    losses, graphs = [], []
    try:
        for step in range(STEPS):
            losses.append(trainer.step(step)["loss"])
            graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    finally:
        trainer.close()
    return losses, graphs, trainer


def test_ppo_scores_and_trains_through_compiled_layers_like_eager(tmp_path, monkeypatch):
    torch._dynamo.reset()
    losses, graphs, trainer = run(tmp_path / "compiled")
    for model in (trainer.actor.model, trainer.critic.model, trainer.scorer.reference):
        assert all(layer._compiled_call_impl is not None for layer in decoder_layers(model.lm))
    assert graphs[1:] == [graphs[0]] * (STEPS - 1), graphs  # nothing compiled after the first step

    for module in (actor, critic, scoring):  # the training compile off; decoding stays compiled
        monkeypatch.setattr(module, "compile_role", lambda *args, **kwargs: False)
    eager_losses, eager_graphs, eager = run(tmp_path / "eager")
    assert all(layer._compiled_call_impl is None for layer in decoder_layers(eager.actor.model.lm))
    assert losses == pytest.approx(eager_losses, rel=1e-4, abs=1e-6)
    assert len(set(eager_losses)) == STEPS  # the steps trained on different rollouts


def test_rows_of_any_padding_run_one_layer_graph():
    """Whether prompts of other lengths left left padding, or EOS right padding, in a micro-batch
    must not change what the compiled layers get. It did: flat position ids over the right padding
    made transformers build a packed-sequence mask (a host wait, and a second graph mid-run), and
    left padding took a 4-D mask (another graph, and sdpa's masked kernel) until rows went in
    flush left (policy.flush_left)."""
    import transformers

    from rlkube.runtime.engine.models import compile_layers
    from rlkube.runtime.engine.policy import PolicyModel

    torch._dynamo.reset()
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(
        "qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=False)
    lm = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    assert compile_layers(lm, "layers", torch.device("cpu"))
    policy = PolicyModel(lm)
    prompt, width = 5, 8
    seq = torch.randint(1, 64, (4, prompt + width))
    graphs = []
    for prompts, lengths in (([5, 5, 5, 5], [8, 8, 8, 8]), ([5, 5, 5, 5], [8, 3, 6, 1]),  # right padding or not
                             ([2, 5, 4, 1], [8, 8, 8, 8]), ([5, 3, 5, 2], [2, 8, 5, 7])):  # left padding too
        att = torch.zeros_like(seq)
        for row, (p, n) in enumerate(zip(prompts, lengths, strict=True)):
            att[row, prompt - p : prompt + n] = 1
        with torch.no_grad():
            policy(seq * att, att, prompt, att[:, prompt:])
        graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    assert graphs == [graphs[0]] * 4, graphs
