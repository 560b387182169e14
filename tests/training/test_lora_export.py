"""The HF export of a LoRA run: the adapter in PEFT's format, and with export.mergeLora the merged
model, each giving the trainer's logits (DPO on CPU, one process, a few seconds)."""

from __future__ import annotations

import json

import pytest
import torch

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.trainers.base import train_on_this_rank
from rlkube.runtime.trainers.dpo import DPOTrainer

from .conftest import tiny_config

LORA = {"rank": 4, "alpha": 8, "targetModules": ["q_proj", "v_proj", "gate_proj", "down_proj"]}
IDS = torch.tensor([[257, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]])


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def trained(tmp_path, merge: bool) -> tuple[RuntimeConfig, DPOTrainer]:
    cfg = RuntimeConfig.model_validate(tiny_config(
        tmp_path, model={"lora": LORA}, training={"steps": 3, "lr": 1e-2}, export={"mergeLora": merge}))
    held: dict = {}

    def make(config, ctx):
        held["trainer"] = DPOTrainer(config, ctx)
        return held["trainer"]

    train_on_this_rank(make, cfg, None)
    return cfg, held["trainer"]


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits.float()


def test_lora_export_writes_the_adapter_and_the_merged_model(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlkube.runtime.engine.models import build_causal_lm

    cfg, trainer = trained(tmp_path, merge=True)
    lm = trainer.policy.lm.eval()
    want = logits(lm)
    export = tmp_path / "ckpt" / "export"
    adapter = export / "adapter"
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= {p.name for p in adapter.iterdir()}
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == LORA["rank"]

    # The adapter on the run's own base (built from the config and seed, frozen by LoRA all run).
    base, _ = build_causal_lm(cfg.model.model_copy(update={"lora": None}), torch.device("cpu"), seed=0)
    with_adapter = PeftModel.from_pretrained(base, str(adapter)).eval()
    torch.testing.assert_close(logits(with_adapter), want, rtol=1e-4, atol=1e-4)
    with with_adapter.disable_adapter():  # the adapter trained: it changes the logits
        assert (logits(with_adapter) - want).abs().max() > 1e-3

    merged = AutoModelForCausalLM.from_pretrained(str(export)).eval()
    assert not any("lora" in name for name, _ in merged.named_parameters())
    torch.testing.assert_close(logits(merged), want, rtol=1e-4, atol=1e-4)

    outputs = trainer.export(3)["outputs"]
    assert outputs == {"model": {"path": str(export), "step": 3}, "adapter": {"path": str(adapter), "step": 3}}


def test_lora_export_without_merge_holds_the_adapter_only(tmp_path):
    _, trainer = trained(tmp_path, merge=False)
    export = tmp_path / "ckpt" / "export"
    assert not (export / "config.json").exists()  # no model a from_pretrained would take for the run's
    assert (export / "adapter" / "adapter_model.safetensors").is_file()
    assert trainer.export(3)["outputs"] == {"adapter": {"path": str(export / "adapter"), "step": 3}}


def test_rlkube_export_of_a_lora_checkpoint_writes_the_adapter_and_merged_model(tmp_path):
    """`python -m rlkube.runtime export CKPT --to DIR [--merge-lora]` of a LoRA run's checkpoint:
    the adapter from the LoRA settings the checkpoint records, the merged model with the flag."""
    import subprocess
    import sys

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlkube.runtime.engine.models import build_causal_lm
    from rlkube.runtime.infra.export import export_checkpoint

    from .conftest import ROOT, runtime_env

    cfg, trainer = trained(tmp_path, merge=False)
    want = logits(trainer.policy.lm.eval())
    ckpt = tmp_path / "ckpt"
    out = tmp_path / "cli"
    proc = subprocess.run([sys.executable, "-m", "rlkube.runtime", "export", str(ckpt), "--to", str(out),
                           "--merge-lora"], cwd=ROOT, env=runtime_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["step"] == 3 and record["adapterPath"] == str(out / "adapter") and record["modelPath"] == str(out)
    settings = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert settings["r"] == LORA["rank"] and settings["lora_alpha"] == LORA["alpha"]
    assert set(settings["target_modules"]) == set(LORA["targetModules"])

    base, _ = build_causal_lm(cfg.model.model_copy(update={"lora": None}), torch.device("cpu"), seed=0)
    with_adapter = PeftModel.from_pretrained(base, str(out / "adapter")).eval()
    torch.testing.assert_close(logits(with_adapter), want, rtol=1e-4, atol=1e-4)
    merged = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert not any("lora" in name for name, _ in merged.named_parameters())
    torch.testing.assert_close(logits(merged), want, rtol=1e-4, atol=1e-4)

    # Without the flag: the adapter only, as export.mergeLora: false writes it during training.
    record = export_checkpoint(ckpt, tmp_path / "adapter-only")
    assert "modelPath" not in record and not (tmp_path / "adapter-only" / "config.json").exists()
    assert (tmp_path / "adapter-only" / "adapter" / "adapter_model.safetensors").is_file()
