"""The data set read and tokenised on a thread while the models load (trainers/base.py
`start_data`, infra/startup.InBackground): the same steps as loading it first, the same errors,
and a start-up split that says what the build waited for.

Every run here is run twice: overlapped (the default) and serial (RLKUBE_SERIAL_STARTUP=1, the
data loaded before the models, as before the overlap)."""

from __future__ import annotations

import json

import pytest
import torch

from rlkube.runtime.contract import failure
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra.errors import EXIT_CONFIG, DataError
from rlkube.runtime.infra.progress import ENV_TERMINATION_LOG
from rlkube.runtime.infra.startup import ENV_SERIAL_STARTUP

from .conftest import tiny_config, write_config
from .rl_common import rl_config

MODES = {"overlapped": "0", "serial": "1"}


def pairs_file(tmp_path, n: int = 64, bad_line: str | None = None):
    """`n` preference pairs as JSONL; `bad_line` in place of the second record."""
    lines = [json.dumps({"prompt": f"say {i % 7} ", "chosen": "abc" * (1 + i % 5), "rejected": "XYZ" * (1 + i % 3)})
             for i in range(n)]
    if bad_line is not None:
        lines[1] = bad_line
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def prompts_file(tmp_path, n: int = 64, bad_line: str | None = None):
    lines = [json.dumps({"prompt": f"write {'ab' * (1 + i % 4)} "}) for i in range(n)]
    if bad_line is not None:
        lines[1] = bad_line
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def dpo_config(tmp_path, data):
    return tiny_config(tmp_path, data={"source": str(data), "format": "jsonl", "maxSeqLen": 32},
                       training={"steps": 3}, checkpoint={"everySteps": 1000})


def grpo_config(tmp_path, data):
    return rl_config(tmp_path, "grpo", data={"source": str(data), "format": "jsonl", "maxSeqLen": 64},
                     training={"steps": 3, "lr": 3e-3, "groupSize": 4, "seed": 0})


def run_in(mode: str, monkeypatch, train, cfg: dict):
    torch.set_num_threads(1)
    monkeypatch.setenv(ENV_SERIAL_STARTUP, MODES[mode])
    return train(RuntimeConfig.model_validate(cfg))


def dpo_train(cfg):
    from rlkube.runtime.trainers.dpo import train

    return train(cfg)


def grpo_train(cfg):
    from rlkube.runtime.trainers.rl import train

    return train(cfg)


@pytest.mark.parametrize(("train", "config", "data"), [(dpo_train, dpo_config, pairs_file),
                                                       (grpo_train, grpo_config, prompts_file)], ids=["dpo", "grpo"])
def test_overlapped_start_up_trains_the_serial_runs_steps_bit_for_bit(tmp_path, monkeypatch, train, config, data):
    results = {}
    for mode in MODES:
        where = tmp_path / mode
        where.mkdir()
        results[mode] = run_in(mode, monkeypatch, train, config(where, data(where)))
    overlapped, serial = results["overlapped"].records, results["serial"].records
    assert len(overlapped) == len(serial) == 3
    for a, b in zip(overlapped, serial, strict=True):
        assert (a["loss"], a.get("rewardMean"), a["tokens"]) == (b["loss"], b.get("rewardMean"), b["tokens"]), a["step"]

    over, seq = overlapped[0]["startupSeconds"], serial[0]["startupSeconds"]
    # serial: the build waits for the whole load; overlapped: for no more than the load
    assert seq["dataWait"] == seq["dataLoad"] >= 0
    assert 0 <= over["dataWait"] <= over["dataLoad"] + 0.002
    for split in (over, seq):  # dataLoad overlaps modelLoad: only the wait is a share of the total
        assert split["total"] == pytest.approx(
            split["import"] + split["dataWait"] + split["modelLoad"] + split["firstStep"], abs=0.01)


@pytest.mark.parametrize(("config", "data"), [(dpo_config, pairs_file), (grpo_config, prompts_file)],
                         ids=["dpo", "grpo"])
def test_bad_data_fails_the_cli_run_as_when_it_was_loaded_first(tmp_path, monkeypatch, capsys, config, data):
    from rlkube.runtime import cli

    monkeypatch.setenv("RLKUBE_PROGRESS_PORT", "0")
    seen = {}
    for mode in MODES:
        where = tmp_path / mode
        where.mkdir()
        path = data(where, bad_line="{not json")
        log = where / "termination-log"
        log.write_text("")
        monkeypatch.setenv(ENV_TERMINATION_LOG, str(log))
        monkeypatch.setenv(ENV_SERIAL_STARTUP, MODES[mode])
        code = cli.main(["run", str(write_config(where, config(where, path)))])
        stderr = capsys.readouterr().err
        error = json.loads(log.read_text())[failure.TERMINATION_ERROR_KEY]
        assert code == EXIT_CONFIG, stderr
        assert f"config error: data.source: {path}:2: not JSON" in stderr
        assert error[failure.ERROR_EXIT] == failure.ERROR_CONFIG and error[failure.ERROR_FIELD] == "data.source"
        seen[mode] = (code, error[failure.ERROR_MESSAGE].replace(str(where), "<dir>"))
    assert seen["overlapped"] == seen["serial"]


def test_a_build_error_while_the_data_loads_gives_way_to_the_data_error(tmp_path, monkeypatch):
    """With bad data and a model that cannot be built, the data's error is the one raised, as when
    the data was loaded before the models; with good data, the model's."""
    from rlkube.runtime.trainers import dpo

    def broken(*args, **kwargs):
        raise RuntimeError("the model cannot be built")

    monkeypatch.setattr(dpo, "build_causal_lm", broken)
    monkeypatch.setenv(ENV_SERIAL_STARTUP, "0")
    bad = pairs_file(tmp_path, bad_line="{not json")
    with pytest.raises(DataError, match=r"pairs.jsonl:2: not JSON"):
        dpo.train(RuntimeConfig.model_validate(dpo_config(tmp_path, bad)))
    good = pairs_file(tmp_path)
    with pytest.raises(RuntimeError, match="the model cannot be built"):
        dpo.train(RuntimeConfig.model_validate(dpo_config(tmp_path, good)))
