"""`model.compile: auto` for PPO/GRPO: the actor, critic and reference score and train through
compiled layers on CUDA when the role runs on one GPU (measured to pay on an H200), and stay
uncompiled when FSDP shards the role (not measured). The decision is `compile_wanted`'s, fed
`auto=not ctx.sharded(role)` by models.compile_role, which each RL role calls; this checks both
halves without a GPU."""

import torch

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.engine import models
from rlkube.runtime.engine.models import compile_wanted
from rlkube.runtime.infra.distributed import DistContext
from rlkube.runtime.trainers.rl import scoring

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


def test_a_role_is_sharded_only_over_two_or_more_ranks_of_an_initialized_run():
    assert not DistContext().sharded("actor")  # one process
    assert not DistContext(initialized=True, role_ranks={"actor": [0]}).sharded("actor")
    assert not DistContext(initialized=True, role_ranks={"critic": [0, 1]}).sharded("actor")
    assert DistContext(initialized=True, role_ranks={"actor": [0, 1]}).sharded("actor")
    assert not DistContext(initialized=False, role_ranks={"actor": [0, 1]}).sharded("actor")


def test_auto_compiles_on_cuda_where_the_caller_says_it_pays_and_never_on_cpu():
    assert compile_wanted("auto", CUDA, auto=True)
    assert not compile_wanted("auto", CUDA, auto=False)
    assert not compile_wanted("auto", CPU, auto=True)
    assert compile_wanted("layers", CPU, auto=False)
    assert not compile_wanted("off", CUDA, auto=True)


def _config(compile_mode: str) -> RuntimeConfig:
    return RuntimeConfig.model_validate({
        "algorithm": "grpo", "model": {"config": {"model_type": "qwen2"}, "compile": compile_mode},
        "roles": {"actor": {"gpus": 1}, "reference": {"colocateWith": "actor"}, "reward": {"gpus": 0, "function": "rlkube.runtime.rewards:target_pattern"}},
        "data": {"source": "s", "format": "synthetic"},
        "training": {"steps": 2}})


def test_the_reference_compiles_under_auto_unless_fsdp_shards_it(monkeypatch):
    calls = []
    lm = torch.nn.Linear(2, 2)
    monkeypatch.setattr(scoring, "build_causal_lm", lambda spec, device, seed: (lm, "sdpa"))
    monkeypatch.setattr(models, "compile_layers",
                        lambda model, requested, device, auto: calls.append((requested, device, auto)))
    monkeypatch.setattr(scoring, "shard", lambda module, ctx, role: module)
    monkeypatch.setattr(scoring, "PolicyModel", lambda model, temperature, fused: model)
    one_gpu = DistContext(device=CUDA)
    two_gpus = DistContext(device=CUDA, initialized=True, role_ranks={"reference": [0, 1]})
    scoring.build_reference(_config("auto"), one_gpu)
    scoring.build_reference(_config("auto"), two_gpus)
    assert calls == [("auto", CUDA, True), ("auto", CUDA, False)]
    assert [compile_wanted(*call) for call in calls] == [True, False]
