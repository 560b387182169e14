"""Data in, a model you can serve out: a DPO job on conversational data, with LoRA and an eval set,
reaches Succeeded, `status.outputs` names its export, and the export loads with from_pretrained.

The chat data reaches the pod as a user's would: a hostPath volume holding the data file
(examples/dpo-chat-cpu.yaml's `data` volume), here this checkout's examples/data, which the
harness's nodes see since they share this machine's disk. The checkpoint volume is the operator's
hostPath under /var/lib/rlkube/<namespace>/<job>-<uid>, so the test reads the export from there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlkube.operator.render import HOST_CHECKPOINT_ROOT
from tests.e2e import deploy

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
STEPS = 8
LORA = {"rank": 4, "alpha": 8, "targetModules": ["q_proj", "v_proj"]}


def test_dpo_chat_lora_job_exports_an_adapter_and_a_merged_model_that_load(deployed):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlkube.runtime.contract.config import ModelSpec
    from rlkube.runtime.engine.models import build_causal_lm

    cluster, ns = deployed.cluster, deployed.jobs_namespace
    name = deployed.job_name("chat-lora")
    job = deploy.job_manifest(
        name, ns, example="dpo-chat-cpu.yaml",
        model={"lora": LORA},
        data={"evalFraction": 0.1},
        training={"steps": STEPS, "evalEverySteps": 4, "lr": 1e-2},
        checkpoint={"everySteps": STEPS},
        export={"mergeLora": True},
        volumes=[{"name": "data", "hostPath": str(REPO / "examples" / "data"), "mountPath": "/data",
                  "readOnly": True}],
    )  # fmt: skip
    deploy.apply(cluster, job)
    try:
        done = deploy.wait_phase(cluster, ns, name, "Succeeded", timeout=600)
        outputs = done["status"]["outputs"]
        assert outputs == {"model": {"path": "/checkpoints/export", "step": STEPS},
                           "adapter": {"path": "/checkpoints/export/adapter", "step": STEPS}}, outputs
        progress = done["status"]["progress"]
        assert progress["evalStep"] == STEPS and 0.0 <= progress["evalAccuracy"] <= 1.0, progress
        exported = [e["message"] for e in deploy.events(cluster, ns, name) if e["reason"] == "Exported"]
        assert exported and "LoRA adapter exported to /checkpoints/export/adapter" in exported[-1], exported

        # The pod's /checkpoints is this hostPath on the node, and the node's disk is this machine's.
        export = Path(HOST_CHECKPOINT_ROOT, ns, f"{name}-{done['metadata']['uid']}", "export")
        merged = AutoModelForCausalLM.from_pretrained(str(export)).eval()
        tokenizer = AutoTokenizer.from_pretrained(str(export))
        ids = torch.tensor([tokenizer("Hello, world").input_ids])
        spec = ModelSpec.model_validate({**job["spec"]["model"], "lora": None})
        base, _ = build_causal_lm(spec, torch.device("cpu"), seed=0)  # the run's frozen base weights
        adapted = PeftModel.from_pretrained(base, str(export / "adapter")).eval()
        with torch.no_grad():
            want = merged(input_ids=ids).logits
            torch.testing.assert_close(adapted(input_ids=ids).logits, want, rtol=1e-4, atol=1e-4)
            with adapted.disable_adapter():
                assert (adapted(input_ids=ids).logits - want).abs().max() > 1e-4  # the adapter trained
    finally:
        deploy.delete_job(cluster, ns, name)
