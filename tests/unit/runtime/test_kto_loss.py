"""KTO's loss against the formula written out here, and against TRL's KTOTrainer on the same batch."""

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from rlkube.runtime.algorithms.kto import clamp_reference_point, kl_reference_point, kto_loss, kto_stats

POLICY = [-4.0, -6.5, -3.2, -8.0]
REFERENCE = [-4.5, -6.0, -3.0, -7.0]
DESIRABLE = [True, False, True, False]
KL_POLICY = [-5.0, -7.0, -4.0, -6.0]  # each prompt with another sample's completion
KL_REFERENCE = [-5.5, -7.2, -4.1, -6.4]
BETA, LAMBDA_D, LAMBDA_U = 0.5, 1.0, 1.5


def by_hand() -> tuple[float, list[float]]:
    z0 = max(sum(p - r for p, r in zip(KL_POLICY, KL_REFERENCE, strict=True)) / 4, 0.0)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    losses = []
    for p, r, good in zip(POLICY, REFERENCE, DESIRABLE, strict=True):
        if good:
            losses.append(LAMBDA_D * (1 - sig(BETA * ((p - r) - z0))))
        else:
            losses.append(LAMBDA_U * (1 - sig(BETA * (z0 - (p - r)))))
    return z0, losses


def ours() -> tuple[float, torch.Tensor]:
    z0 = clamp_reference_point(*kl_reference_point(torch.tensor(KL_POLICY), torch.tensor(KL_REFERENCE)))
    losses = kto_loss(torch.tensor(POLICY), torch.tensor(REFERENCE), torch.tensor(DESIRABLE), z0, BETA,
                      LAMBDA_D, LAMBDA_U)
    return z0, losses


def test_kto_loss_matches_the_formula():
    z0, losses = ours()
    want_z0, want = by_hand()
    assert z0 == pytest.approx(want_z0) and z0 > 0
    assert losses.tolist() == pytest.approx(want, rel=1e-6)


def test_reference_point_is_clamped_at_zero_and_carries_no_gradient():
    policy = torch.tensor([-9.0, -9.0], requires_grad=True)
    kl_sum, count = kl_reference_point(policy, torch.tensor([-1.0, -1.0]))
    assert clamp_reference_point(kl_sum, count) == 0.0
    assert isinstance(kl_sum, float)  # a number, not a graph node
    assert clamp_reference_point(0.0, 0) == 0.0


def test_stats_count_rewards_on_the_side_their_label_says():
    z0, losses = ours()
    s = kto_stats(torch.tensor(POLICY), torch.tensor(REFERENCE), torch.tensor(DESIRABLE), losses, z0, BETA)
    rewards = [BETA * (p - r) for p, r in zip(POLICY, REFERENCE, strict=True)]
    want_correct = sum((rw > BETA * z0) == good for rw, good in zip(rewards, DESIRABLE, strict=True))
    assert (s.samples, s.desirable, s.correct) == (4, 2, want_correct)
    assert s.desirable_reward_sum == pytest.approx(rewards[0] + rewards[2])


def test_kto_loss_matches_trl():
    trl_kto = pytest.importorskip("trl.trainer.kto_trainer", reason="trl (a dev dependency) is not installed")
    n = len(POLICY)
    # TRL sums per-token log-probs of [B, L-1]; one-token completions make each row's sum our value.
    ids = torch.stack([torch.arange(n), torch.zeros(n, dtype=torch.long)], 1)
    kl_ids = torch.stack([torch.arange(n), torch.ones(n, dtype=torch.long)], 1)

    def model(input_ids, labels=None, **_):
        table = KL_POLICY if bool(input_ids[0, 1]) else POLICY
        logps = torch.tensor([[table[int(i)]] for i in input_ids[:, 0]])
        return SimpleNamespace(log_probs=logps, entropy=torch.zeros(n, 1), mean_logits=torch.zeros(n, 1))

    fake = SimpleNamespace(
        model=SimpleNamespace(training=True), beta=BETA, desirable_weight=LAMBDA_D, undesirable_weight=LAMBDA_U,
        loss_type="kto", calculate_KL=True, precompute_ref_logps=True, aux_loss_enabled=False,
        accelerator=SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=lambda x: x),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)}, _total_train_tokens=0, _tp_size=1,
    )
    fake._compute_kl_logps = lambda m, b: trl_kto.KTOTrainer._compute_kl_logps(fake, m, b)
    inputs = {
        "input_ids": ids, "attention_mask": torch.ones(n, 2, dtype=torch.long),
        "completion_mask": torch.ones(n, 2, dtype=torch.long), "KL_input_ids": kl_ids,
        "KL_attention_mask": torch.ones(n, 2, dtype=torch.long), "KL_completion_mask": torch.ones(n, 2, dtype=torch.long),
        "label": torch.tensor(DESIRABLE), "ref_logps": torch.tensor(REFERENCE), "ref_KL_logps": torch.tensor(KL_REFERENCE),
    }
    trl_loss = trl_kto.KTOTrainer._compute_loss(fake, model, inputs, return_outputs=False)
    _, losses = ours()
    # TRL orders desirable losses first, then undesirable, and takes the mean: the same mean
    assert float(trl_loss) == pytest.approx(float(losses.mean()), rel=1e-6)
    assert fake._metrics["train"]["kl"][-1] == pytest.approx(ours()[0], rel=1e-6)
