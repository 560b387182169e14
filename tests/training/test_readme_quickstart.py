"""The README's quick start, run as written on a tiny model on CPU.

The commands are read from README.md between its quickstart markers, so a README edit that
breaks them fails here. The install line is checked, not run (this checkout is installed
already); the training command runs with the config of examples/runtime/dpo-quickstart.yaml
and the README's own --set paths, plus CPU overrides appended (float32, sdpa, 2 steps, short
rows); the loading command runs as written. The model directory is a random 2-layer qwen2
with a BPE tokenizer trained in the test, both saved with save_pretrained, as a downloaded
model would be; the pairs file is a few JSONL lines.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import tomllib

from tests.unit.runtime.data_builders import build_hf_tokenizer

from .conftest import ROOT

BEGIN, END = "<!-- quickstart:begin -->", "<!-- quickstart:end -->"
CPU = ["--set", "model.dtype=float32", "--set", "model.attention=sdpa", "--set", "model.compile=off",
       "--set", "training.steps=2", "--set", "training.evalEverySteps=2", "--set", "data.maxSeqLen=64",
       "--set", "batching.globalBatch=4", "--set", "checkpoint.everySteps=2", "--set", "progressPort=0"]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    assert BEGIN in text and END in text, "README.md lost its quickstart markers"
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    (body,) = re.findall(r"```bash\n(.*?)```", block, flags=re.S)
    joined = body.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def save_tiny_model(directory) -> None:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    build_hf_tokenizer(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    config = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=len(tokenizer), max_position_embeddings=128,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    Qwen2ForCausalLM(config).save_pretrained(directory)


def write_pairs(path) -> None:
    rows = [{"prompt": f"What is the capital of France? ({i})", "chosen": " The capital of France is Paris.",
             "rejected": " The sky is blue."} for i in range(24)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def argv(command: str) -> list[str]:
    """The command's words, `python` as this interpreter, the repository's example paths absolute."""
    words = shlex.split(command)
    if words[0] == "python":
        words[0] = sys.executable
    return [str(ROOT / w) if w.startswith("examples/") else w for w in words]


@pytest.mark.timeout(120)
def test_the_readme_quickstart_trains_and_exports_a_model_that_loads(tmp_path):
    install, train, load = readme_commands()
    assert install == "pip install -e '.[runtime]'", install
    assert "runtime" in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert train.startswith("python -m rlkube.runtime run examples/runtime/"), train
    settings = dict(word.split("=", 1) for word in shlex.split(train) if "=" in word)
    model_dir, pairs, export = (tmp_path / settings[key] for key in ("model.path", "data.source", "export.dir"))
    save_tiny_model(model_dir)
    write_pairs(pairs)

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "runtime"), str(ROOT / "operator")]),
           "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    trained = subprocess.run([*argv(train), *CPU, "--log-format", "json"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=100)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert (export / "config.json").is_file(), sorted(p.name for p in tmp_path.rglob("*"))

    loaded = subprocess.run(argv(load), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert loaded.returncode == 0 and loaded.stdout.startswith("qwen2 "), loaded.stdout + loaded.stderr

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(export)
    tokenizer = AutoTokenizer.from_pretrained(export)
    original = AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.config.num_hidden_layers == 2 and len(tokenizer) == model.config.vocab_size
    trained_weights, start = model.state_dict(), original.state_dict()
    assert any((trained_weights[k] - start[k]).abs().max() > 0 for k in start), "the export holds untrained weights"
