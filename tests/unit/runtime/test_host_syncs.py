"""Inside a mini-batch the RL training pass never waits for the device.

A float(), .item(), .tolist() or boolean index of a CUDA tensor makes the host wait until the GPU
has run everything queued; once per micro-batch, the GPU then idles while the host launches the
next stage (update.py, RoleWorker.backward_micro_batches). Run on the meta device, every such
wait raises (a meta tensor has no values), so the actor's and the critic's forward and backward
over a rollout with left- and right-padded rows must run there end to end. The host-mask path
must also compute what the device-mask path computes (CPU, values and gradients). DPO's rows of
one sequence each (sdpa on CUDA) run their forward there too.
"""

from types import SimpleNamespace

import pytest
import torch
import transformers

from rlkube.runtime.algorithms.aggregation import TOKEN_MEAN
from rlkube.runtime.algorithms.registry import get_policy_loss
from rlkube.runtime.contract.config import BatchingSpec, TrainingSpec
from rlkube.runtime.engine.policy import PolicyModel
from rlkube.runtime.engine.value_model import ValueModel
from rlkube.runtime.trainers.rl.actor import ActorWorker
from rlkube.runtime.trainers.rl.budgets import RLBudgets
from rlkube.runtime.trainers.rl.critic import CriticWorker
from rlkube.runtime.trainers.rl.groups import RoleGroups
from rlkube.runtime.trainers.rl.mismatch import RowMismatch
from rlkube.runtime.trainers.rl.rollout import Rollout
from rlkube.runtime.trainers.rl.update import PassTotals, RoleWorker

ROWS, P, T, V = 6, 4, 5, 61


def tiny_lm(device: str, model_type: str = "qwen2") -> torch.nn.Module:
    config = transformers.AutoConfig.for_model(
        model_type, vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)


PROMPTS = {"left-padded": [4, 2, 3, 4, 1, 2], "equal": [P] * ROWS}


def rollout(prompts: str = "left-padded") -> Rollout:
    """Prompts of lengths 4, 2, 3, ... left-padded to P (or all P long: no left padding, as in a
    micro-batch of one GRPO group), and right-padded responses (lengths 5, 1, 3, ...)."""
    g = torch.Generator().manual_seed(0)
    att = torch.zeros(ROWS, P + T, dtype=torch.long)
    for row, (prompt, response) in enumerate(zip(PROMPTS[prompts], [5, 1, 3, 2, 5, 4], strict=True)):
        att[row, P - prompt : P + response] = 1
    seq = torch.randint(1, V, (ROWS, P + T), generator=g) * att
    generated = -torch.rand(ROWS, T, generator=g) * att[:, P:]  # generation's log-probs (mismatch.py)
    return Rollout(seq, att, P, list(range(ROWS)), generation_logprobs=generated)


def worker(cls: type[RoleWorker], model: torch.nn.Module, device: str) -> RoleWorker:
    """The real worker's micro_loss and pass, around `model` (its constructor builds from a config)."""
    config = SimpleNamespace(training=TrainingSpec(kl=0.1, entropy_coef=0.01, value_clip=0.2),
                             batching=BatchingSpec(maxMicroBatch=2))
    ctx = SimpleNamespace(initialized=False, device=torch.device(device), rank=0)
    w = cls.__new__(cls)
    RoleWorker.__init__(w, config, RoleGroups(ctx, {cls.role: [0]}), model, None,
                        RLBudgets(config.batching, None, None))
    w.policy_loss, w.kl_as_loss, w.aggregation = get_policy_loss("grpo"), True, TOKEN_MEAN
    if cls is ActorWorker:
        w.mismatch = RowMismatch()
    return w


def scored_and_advantages():
    g = torch.Generator().manual_seed(1)
    scored = {"old_logprobs": -torch.rand(ROWS, T, generator=g), "ref_logprobs": -torch.rand(ROWS, T, generator=g),
              "values": torch.randn(ROWS, T, generator=g)}
    return scored, {"advantages": torch.randn(ROWS, generator=g), "returns": torch.randn(ROWS, T, generator=g)}


# Llama and Mistral bodies, given no mask, checked on the host whether the positions held packed
# sequences before engine/attention.py's causal_attention (Qwen2 took a per-layer-type "no mask")
@pytest.mark.parametrize("model_type", ["qwen2", "llama", "mistral"])
@pytest.mark.parametrize("prompts", sorted(PROMPTS))
@pytest.mark.parametrize("role", ["actor", "critic"])
def test_micro_batches_never_wait_for_the_device(role, prompts, model_type):
    lm = tiny_lm("meta", model_type)
    cls, model = (ActorWorker, PolicyModel(lm)) if role == "actor" else (CriticWorker, ValueModel(lm))
    w = worker(cls, model, "meta")
    scored, adv = scored_and_advantages()
    totals = PassTotals()
    # 3 micro-batches of 2 rows; raises "cannot be called on meta tensors" at the first wait
    sums = w.backward_micro_batches(rollout(prompts), scored, adv, torch.arange(ROWS), 20.0, totals)
    want = {"", "policy_loss", "clip_fraction", "approx_kl", "kl", "entropy"} if role == "actor" \
        else {"", "value_loss", "value_clip_fraction"}
    assert set(sums) == want
    assert all(v.device.type == "meta" for v in sums.values())
    assert totals.tokens == 20 and len(totals.seq_lens) == ROWS  # counted on the host
    if role == "actor":  # the mismatch with generation's log-probs is kept on the device too
        assert w.mismatch.rows.device.type == "meta" and w.mismatch.rows.shape == (ROWS, 6)


def test_a_device_boolean_index_is_what_the_meta_run_catches():
    """The detector works: the same forward without the host mask waits (a boolean index)."""
    model = PolicyModel(tiny_lm("meta"))
    r = rollout()
    seq, att = r.sequences.to("meta"), r.attention_mask.to("meta")
    with pytest.raises((RuntimeError, NotImplementedError)):
        model(seq, att, P, att[:, P:])


def test_host_mask_path_computes_what_the_device_mask_path_does():
    r = rollout()
    outs = []
    for host in (None, r.attention_mask):
        model = PolicyModel(tiny_lm("cpu"))
        logps, entropy = model(r.sequences, r.attention_mask, P, r.attention_mask[:, P:], with_entropy=True,
                               host_mask=host)
        (logps.sum() + entropy.sum()).backward()
        outs.append((logps.detach(), entropy.detach(), [p.grad.clone() for p in model.parameters()]))
    (a, ea, ga), (b, eb, gb) = outs
    assert (a[r.attention_mask[:, P:] == 0] == 0).all() and a.abs().sum() > 0
    assert torch.equal(a, b) and torch.equal(ea, eb)
    assert all(torch.allclose(x, y, atol=1e-7) for x, y in zip(ga, gb, strict=True))


@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_dpo_rows_of_one_sequence_never_wait_for_the_device(model_type):
    """DPO with sdpa on CUDA: one right-padded sequence a row, no mask (trainers/dpo.py). Given no
    mask, transformers checked the position ids for packed sequences on the host, every forward."""
    from rlkube.runtime.data.packing import pad_pairs
    from rlkube.runtime.data.preferences import PreferenceData
    from rlkube.runtime.engine.logprobs import SequenceLogprobs

    data = PreferenceData(prompts=[[5, 6, 7], [8]], chosen=[[9, 10], [11, 12, 13]], rejected=[[14], [15, 16]])
    batch = pad_pairs(data, [0, 1], bos=1, eos=2, pad=0, padding_mask=False)
    batch = batch.to(torch.device("meta"))
    logps = SequenceLogprobs(tiny_lm("meta", model_type))(batch)
    assert logps.shape == (4,) and logps.device.type == "meta"
