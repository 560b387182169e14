"""The model out of a CPU training run: the Hugging Face export loads with
AutoModelForCausalLM.from_pretrained and gives the trainer's logits (DPO and GRPO, one process and
two gloo ranks with FSDP2), `rlkube export` of the committed checkpoint gives the same model, the
export is reported in /progress (here: the termination message), and partial freezing leaves the
frozen weights untouched while the start record shows what it saved."""

import json
import subprocess
import sys

import pytest
import torch
import yaml

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.engine.models import build_causal_lm
from rlkube.runtime.infra.distributed import DistContext

from .conftest import ROOT, run_cli, runtime_env, tiny_config, write_config
from .rl_common import rl_config

IDS = torch.tensor([[257, 104, 101, 108, 108, 111, 32, 119], [257, 97, 98, 99, 100, 101, 102, 103]])


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path))


def cli_export(checkpoint, to) -> dict:
    """`rlkube export CHECKPOINT --to DIR` (the operator's console script hands over to the runtime)."""
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "rlkube"), "export", str(checkpoint), "--to", str(to)],
                          cwd=ROOT, env=runtime_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_dpo_export_gives_the_trainers_logits_and_the_checkpoint_exports_the_same(tmp_path):
    from rlkube.runtime.trainers.dpo import DPOTrainer

    torch.set_num_threads(1)
    cfg = tiny_config(tmp_path, training={"steps": 4, "lr": 1e-3, "seed": 0}, export={"everySteps": 2})
    trainer = DPOTrainer(RuntimeConfig.model_validate(cfg), DistContext())
    trainer.train()
    exported = tmp_path / "ckpt" / "export"
    meta = json.loads((exported / "rlkube-export.json").read_text())
    assert meta["step"] == 4 and meta["tokenizer"] == "byte"
    assert torch.equal(logits(load(exported)), logits(trainer.policy.lm))
    record = cli_export(tmp_path / "ckpt", tmp_path / "from-checkpoint")
    assert record["step"] == 4
    assert torch.equal(logits(load(tmp_path / "from-checkpoint")), logits(trainer.policy.lm))


def test_grpo_export_gives_the_trainers_logits(tmp_path):
    from rlkube.runtime.trainers.rl.trainer import RLTrainer

    torch.set_num_threads(1)
    cfg = rl_config(tmp_path, "grpo", training={"steps": 2, "lr": 3e-3, "groupSize": 4, "seed": 0},
                    batching={"globalBatch": 4, "maxMicroBatch": 16, "mode": "fixed"})
    trainer = RLTrainer(RuntimeConfig.model_validate(cfg), DistContext())
    trainer.train()
    exported = tmp_path / "ckpt" / "export"
    assert torch.equal(logits(load(exported)), logits(trainer.actor.model.lm))
    cli_export(tmp_path / "ckpt", tmp_path / "from-checkpoint")
    assert torch.equal(logits(load(tmp_path / "from-checkpoint")), logits(trainer.actor.model.lm))


@pytest.mark.slow
def test_two_rank_dpo_with_frozen_layers_exports_the_consolidated_model(tmp_path):
    cfg = tiny_config(tmp_path, roles={"actor": {"gpus": 2}, "reference": {"colocateWith": "actor"}},
                      training={"steps": 4, "lr": 1e-2, "seed": 0, "trainableModules": ["layers.1."]})
    termination = tmp_path / "termination-log"
    code, recs, err = run_cli(write_config(tmp_path, cfg), LOCAL_WORLD_SIZE="2",
                              RLKUBE_TERMINATION_LOG=str(termination))
    assert code == 0, err[-3000:]
    start = next(r for r in recs if r["event"] == "start")
    total = start["trainableParameters"] + start["frozenParameters"]
    assert 0 < start["trainableParameters"] < total / 2
    # FSDP2 reduces (in fp32) the gradients of trained parameters only; AdamW keeps moments of this
    # rank's half of them
    assert start["reducedBytesPerStep"] == 4 * start["trainableParameters"]
    assert start["optimizerStateBytes"] == 2 * 4 * start["trainableParameters"] // 2
    exported = tmp_path / "ckpt" / "export"
    reported = json.loads(termination.read_text())["progress"]["outputs"]
    assert reported == {"model": {"path": str(exported), "step": 4}}

    # the 2-rank consolidation is the checkpoint's model, exported in one process
    model = load(exported)
    cli_export(tmp_path / "ckpt", tmp_path / "from-checkpoint")
    assert torch.equal(logits(load(tmp_path / "from-checkpoint")), logits(model))
    # frozen weights are the initial ones; trained ones moved
    initial, _ = build_causal_lm(RuntimeConfig.model_validate(cfg).model, torch.device("cpu"), seed=0)
    before = dict(initial.named_parameters())
    for name, value in model.named_parameters():
        assert torch.equal(value, before[name]) == ("layers.1." not in name), name


@pytest.mark.slow
def test_two_rank_grpo_export_is_the_checkpoints_model(tmp_path):
    cfg = rl_config(tmp_path, "grpo", roles={"actor": {"gpus": 2}, "reward": {"gpus": 0, "function":
                                             "rlkube.runtime.rewards:target_pattern"}},
                    training={"steps": 2, "lr": 3e-3, "groupSize": 4, "seed": 0},
                    batching={"globalBatch": 4, "maxMicroBatch": 16, "mode": "fixed"})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code, recs, err = run_cli(path, timeout=400, LOCAL_WORLD_SIZE="2")
    assert code == 0, err[-3000:]
    assert [r["step"] for r in recs if r.get("event") == "export"] == [2]
    cli_export(tmp_path / "ckpt", tmp_path / "from-checkpoint")
    assert torch.equal(logits(load(tmp_path / "from-checkpoint")), logits(load(tmp_path / "ckpt" / "export")))


def test_the_export_verb_is_dispatched_by_the_rlkube_cli(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rlkube.runtime", "export", str(tmp_path), "--to", str(tmp_path / "o")],
                          cwd=ROOT, env=runtime_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and "not a committed checkpoint" in proc.stderr
