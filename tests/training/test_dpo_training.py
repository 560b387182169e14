"""A tiny model learns the synthetic preferences with DPO, on one process and on two (gloo)."""

import pytest

from .conftest import STEPS, run_cli, step_losses, tiny_config, write_config


def test_tiny_dpo_reaches_90_percent_preference_accuracy(reference_run):
    losses = reference_run["losses"]
    acc = reference_run["accuracies"]
    # every step's accuracy is measured on 8 pairs not seen before (512 samples, 12 x 8 used)
    assert acc[0] < 0.6  # policy == reference at step 1: no preference yet
    assert sum(acc[-4:]) / 4 > 0.9
    assert losses[1] == pytest.approx(0.6931, abs=1e-3)  # log 2
    assert losses[STEPS] < 0.45


def test_two_process_gloo_run_matches_one_process_and_reshards(reference_run, tmp_path):
    cfg = tiny_config(tmp_path, roles={"actor": {"gpus": 2}, "reference": {"colocateWith": "actor"}})
    code, recs, err = run_cli(write_config(tmp_path, cfg), LOCAL_WORLD_SIZE="2")
    assert code == 0, err[-3000:]
    start = next(r for r in recs if r["event"] == "start")
    assert start["worldSize"] == 2
    losses = step_losses(recs)
    assert sorted(losses) == list(range(1, STEPS + 1))
    # same global batch split over 2 FSDP ranks: the same training, up to float summation order
    for step, loss in losses.items():
        assert loss == pytest.approx(reference_run["losses"][step], rel=2e-3, abs=2e-4), step
    accs = [r["accuracy"] for r in recs if r["event"] == "step"]
    assert sum(accs[-4:]) / 4 > 0.9

    # the 2-rank FSDP checkpoint resumes on 1 process (DCP reshards) and training continues
    cfg["roles"] = {"actor": {"gpus": 1}, "reference": {"colocateWith": "actor"}}
    cfg["training"]["steps"] = STEPS + 2
    code, recs, err = run_cli(write_config(tmp_path, cfg))
    assert code == 0, err[-3000:]
    assert next(r for r in recs if r["event"] == "start")["startStep"] == STEPS
    assert sorted(step_losses(recs)) == [STEPS + 1, STEPS + 2]
    assert "resumed from" in err and "written by 2 ranks, now 1" in err
