"""Temperature: the trainer's log-probs are those of the distribution the rollout sampled from.

The decoder samples from softmax(logits / T); the actor's new and old log-probs and the
reference's must be taken of logits / T too (TRL's and verl's convention), so that on the first
epoch the PPO ratio is exactly 1 and the KL compares the same two distributions.
"""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlkube.runtime.algorithms.ppo import entropy_from_logits, policy_loss
from rlkube.runtime.engine import generation
from rlkube.runtime.engine.generation import Decoder, SamplingParams
from rlkube.runtime.engine.policy import PolicyModel
from rlkube.runtime.trainers.rl.rollout import Rollout
from rlkube.runtime.trainers.rl.scoring import response_logprobs

torch.set_num_threads(1)
T = 0.7


def tiny():
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


def sampled_rollout(lm, monkeypatch):
    """A rollout at temperature T and, per response token, the log-prob the sampler drew it with."""
    seen = []
    real = generation.sample_tokens

    def spy(logits, params, gen=None):
        token = real(logits, params, gen)
        seen.append(torch.log_softmax(logits.float() / params.temperature, dim=-1).gather(1, token[:, None])[:, 0])
        return token

    monkeypatch.setattr(generation, "sample_tokens", spy)
    ids = torch.tensor([[0, 0, 5, 6, 7], [0, 8, 9, 10, 11], [12, 13, 14, 15, 16]])
    mask = (torch.arange(5)[None] >= torch.tensor([[2], [1], [0]])).long()
    params = SamplingParams(max_new_tokens=6, temperature=T, eos_token_id=3, pad_token_id=0)
    with torch.no_grad():
        out = Decoder(lm, static_cache=False, cuda_graphs=False).generate(ids, mask, params,
                                                                          torch.Generator().manual_seed(1))
    sampler = torch.stack(seen, dim=1)[:, : out.response_ids.shape[1]] * out.response_mask
    rollout = Rollout(out.sequences, out.attention_mask, ids.shape[1], [0, 1, 2])
    return rollout, sampler


def test_trainer_logprobs_equal_the_samplers_and_the_first_ratio_is_one(monkeypatch):
    lm = tiny()
    rollout, sampler = sampled_rollout(lm, monkeypatch)
    policy = PolicyModel(lm, temperature=T)
    resp = rollout.response_mask
    # Old log-probs the way scoring.py takes them (no grad, micro-batches of 2 rows) ...
    pairs = list(torch.arange(rollout.rows).split(2))
    old = response_logprobs(policy, rollout, pairs, 0, torch.device("cpu"))
    assert torch.allclose(old * resp, sampler, atol=2e-5), (old * resp - sampler).abs().max()
    # ... and the untempered log-probs are not (the test is not vacuous).
    plain = response_logprobs(PolicyModel(lm), rollout, pairs, 0, torch.device("cpu"))
    assert (plain * resp - sampler).abs().max() > 1e-2
    # New log-probs the way actor.py takes them (with grad), on the same rows: ratio exactly 1.
    for rows in (slice(0, 2), slice(2, 3)):
        seq, att, _ = rollout.on_device(rows, torch.device("cpu"))
        p = rollout.prompt_len
        new, entropy = policy(seq, att, p, att[:, p:], with_entropy=True)
        cols = new.shape[1]
        assert torch.equal(new.detach(), old[rows, :cols])
        adv = torch.tensor([1.0, -0.5])[: new.shape[0]]
        _, stats = policy_loss(new, old[rows, :cols], adv, att[:, p:].float(), 0.2)
        assert stats.ratio_mean == 1.0 and stats.approx_kl == 0.0 and stats.clip_fraction == 0.0
        # Entropy of the tempered distribution too.
        logits = lm(input_ids=seq, attention_mask=att).logits[:, p - 1 : p - 1 + cols]
        want = entropy_from_logits(logits.float() / T) * att[:, p:]
        assert torch.allclose(entropy, want, atol=1e-5)


def test_tempered_logprob_gradients_are_exact():
    """The chunked head's backward divides by T as its forward does (float64 gradcheck)."""
    from rlkube.runtime.engine.logprobs import token_logprobs

    torch.manual_seed(0)
    h = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, 4, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 7, (5,))
    assert torch.autograd.gradcheck(lambda a, b: token_logprobs(a, b, y, 2, T), (h, w))
    want = torch.log_softmax(h @ w.t() / T, -1).gather(1, y[:, None])[:, 0]
    assert torch.allclose(token_logprobs(h, w, y, 2, T), want)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_greedy_and_unit_temperature_use_raw_logits(temperature):
    assert PolicyModel(tiny(), temperature=temperature).temperature == 1.0
