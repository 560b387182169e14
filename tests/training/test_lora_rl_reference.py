"""PPO/GRPO with LoRA and training.kl > 0: the reference is the actor with its adapters off
(verl's reference-in-actor), so the run holds one copy of the base weights, and the KL it trains
with equals the one a separate frozen copy of the base gives. Tiny qwen2 on CPU, one process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.engine.lora import ReferenceView
from rlkube.runtime.engine.models import parameter_storage_bytes
from rlkube.runtime.trainers.base import train_on_this_rank
from rlkube.runtime.trainers.rl.scoring import build_reference
from rlkube.runtime.trainers.rl.trainer import RLTrainer

from .rl_common import TINY_MODEL, rl_config
from .spawned import spawn_ranks

LORA = {"rank": 4, "alpha": 8, "targetModules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj"]}
BASE = {"config": {**TINY_MODEL, "initializer_range": 0.2}, "dtype": "float32", "attention": "sdpa"}
STEPS = 3


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)



def config(tmp_path, algorithm: str, separate_copy: bool, actor_gpus: int = 1) -> RuntimeConfig:
    """A LoRA run with kl > 0 and the reference on the actor's ranks. `separate_copy`: the reference
    names its own model, the same spec and seed as the actor's base, so it is built as a second copy
    with equal weights (the path every run without LoRA takes)."""
    reference = {"colocateWith": "actor", **({"model": dict(BASE)} if separate_copy else {})}
    kl = {"kl": 0.2, "klInReward": True} if algorithm == "ppo" else {"kl": 0.2}
    cfg = rl_config(tmp_path / ("copy" if separate_copy else "shared"), algorithm,
                    model={**BASE, "lora": LORA},
                    training={"steps": STEPS, "lr": 3e-2, **kl})
    cfg["roles"]["reference"] = reference
    cfg["roles"]["actor"]["gpus"] = actor_gpus
    return RuntimeConfig.model_validate(cfg)


def run(cfg: RuntimeConfig, ctx=None) -> tuple[RLTrainer, list[dict]]:
    """A run of `cfg` in this process; `ctx`: the caller's process group (else joined and left here)."""
    held = {}

    def make(c, ctx):
        held["trainer"] = RLTrainer(c, ctx)
        return held["trainer"]

    records = train_on_this_rank(make, cfg, ctx).records
    return held["trainer"], records


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_lora_reference_is_the_actor_with_adapters_off(tmp_path, algorithm):
    shared, shared_recs = run(config(tmp_path, algorithm, separate_copy=False))
    copied, copied_recs = run(config(tmp_path, algorithm, separate_copy=True))

    # Storage: one base copy plus adapters, against two base copies plus adapters.
    assert isinstance(shared.scorer.reference, ReferenceView)
    assert shared.scorer.reference.actor is shared.actor.model
    assert not isinstance(copied.scorer.reference, ReferenceView)
    actor = shared.actor.model
    adapters = sum(p.numel() * p.element_size() for p in actor.parameters() if p.requires_grad)
    base = parameter_storage_bytes(actor) - adapters
    assert 0 < adapters < 0.2 * base
    assert parameter_storage_bytes(actor, shared.scorer.reference.actor) == base + adapters
    assert parameter_storage_bytes(copied.actor.model, copied.scorer.reference) == 2 * base + adapters

    # The KL the runs trained with is the same, step by step, and not zero: the adapters moved the
    # policy away from the base, and the view kept computing the base.
    key = "kl" if algorithm == "grpo" else "rewardMean"  # ppo: the KL is in the reward
    for a, b in zip(shared_recs, copied_recs, strict=True):
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), (a, b)
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-7), (a, b)
    if algorithm == "grpo":
        assert shared_recs[-1]["kl"] > 1e-4, shared_recs

    # Log-probs: the view equals a freshly built frozen base and differs from the trained actor.
    fresh = build_reference(copied.config, shared.groups.ctx)
    seq = torch.randint(3, 259, (4, 24), generator=torch.Generator().manual_seed(1))
    att = torch.ones_like(seq)
    p = 8

    def logps(model):
        with torch.no_grad():
            return model(seq, att, p, att[:, p:])[0]

    view = logps(shared.scorer.reference)
    torch.testing.assert_close(view, logps(fresh), rtol=1e-5, atol=1e-5)
    assert (view - logps(actor)).abs().max() > 1e-3
    assert all(p.requires_grad == ("lora_" in n) for n, p in actor.named_parameters())  # adapters back on


def worker(rank: int, port: int, tmp: str, results) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from rlkube.runtime.infra.distributed import init_from_env, shutdown

    configs = {separate: config(Path(tmp), "grpo", separate, actor_gpus=2) for separate in (False, True)}
    # one process group for both runs: a second rendezvous on the same port can meet the first's store
    ctx = init_from_env(configs[False].device_map)
    try:
        out = {}
        for separate_copy, cfg in configs.items():
            trainer, recs = run(cfg, ctx)
            out[separate_copy] = (type(trainer.scorer.reference).__name__, [(r["kl"], r["loss"]) for r in recs])
        results[rank] = out
    finally:
        shutdown(ctx)


@pytest.mark.timeout(300)
def test_sharded_lora_actor_serves_as_its_reference_on_two_ranks(tmp_path, monkeypatch):
    """The actor FSDP-sharded over 2 ranks (gloo): switching the adapters off inside the sharded
    module gives the KL a separate sharded copy of the base gives."""
    results = spawn_ranks(worker, lambda port, results: (port, str(tmp_path), results), monkeypatch)
    for rank in (0, 1):
        (shared_kind, shared), (copy_kind, copied) = results[rank][False], results[rank][True]
        assert shared_kind == "ReferenceView" and copy_kind != "ReferenceView"
        assert shared[-1][0] > 1e-4, shared
        for (kl_a, loss_a), (kl_b, loss_b) in zip(shared, copied, strict=True):
            assert kl_a == pytest.approx(kl_b, rel=1e-5, abs=1e-7) and loss_a == pytest.approx(loss_b, rel=1e-5, abs=1e-7)


def test_a_reference_on_gpus_of_its_own_keeps_its_copy_and_says_so(tmp_path, monkeypatch):
    """The view needs the actor's module in the reference's process: a reference with its own
    ranks builds its copy, and the run is told what colocateWith: actor would save."""
    from rlkube.runtime.infra.distributed import init_from_env
    from rlkube.runtime.trainers.rl import trainer as rl_trainer

    warned = []
    monkeypatch.setattr(rl_trainer, "warn_once", lambda key, message: warned.append(message))
    cfg = config(tmp_path, "grpo", separate_copy=False).model_dump(mode="json", by_alias=True, exclude_none=True)
    cfg["roles"]["reference"] = {"gpus": 1}
    del cfg["deviceMap"]
    cfg = RuntimeConfig.model_validate(cfg)
    assert cfg.device_map["reference"] != cfg.device_map["actor"]
    trainer = RLTrainer(cfg, init_from_env(cfg.device_map))  # one process: every role is here
    try:
        assert trainer.scorer.reference is not None and not isinstance(trainer.scorer.reference, ReferenceView)
        assert len(warned) == 1 and "colocateWith: actor" in warned[0]
    finally:
        trainer.close()
