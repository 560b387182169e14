"""The fused head (engine/fused_head.py) against the unfused one: the same log-probs, entropy and
gradients (hidden states, head weight, and through a tied embedding every parameter of a model),
and its largest tensor does not grow with the number of tokens.

Tolerances: fp32 on CPU, rtol 1e-5 and atol 2e-6 of the tensor's largest entry (both paths compute
the same logits; only the order of the reductions differs, chunk by chunk against all rows; the
differences seen are a few fp32 ulps of the largest logit). bf16 weights and hidden states
(the GPU's dtype, run here on CPU): log-probs and entropy within 1e-3 absolute (both softmaxes
are fp32 over the same bf16 logits); gradients within 2e-2 relative in L2, since the unfused
path rounds its [N, vocab] gradient and the weight gradient to bf16 once over all rows, the fused
one chunk by chunk with an fp32 accumulator (a bf16 rounding is 2^-8 = 0.4%).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlkube.runtime.contract.config import ModelSpec, TrainingSpec
from rlkube.runtime.data.packing import pack_pairs
from rlkube.runtime.data.preferences import PreferenceData
from rlkube.runtime.data.tokenizer import ByteTokenizer
from rlkube.runtime.engine.fused_head import head_logprobs
from rlkube.runtime.engine.logprobs import SequenceLogprobs
from rlkube.runtime.engine.policy import PolicyModel

torch.set_num_threads(1)


def assert_fp32_close(got, want, msg=None):
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6 * scale, msg=msg)


def inputs(n, d, v, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(n, d, generator=g) * 2).to(dtype).requires_grad_()
    w = torch.randn(v, d, generator=g).to(dtype).requires_grad_()
    y = torch.randint(0, v, (n,), generator=g)
    # upstream gradients of both outputs, as a loss weighting each token differently would give
    a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
    return h, w, y, a, b


def run(h, w, y, a, b, **kw):
    """(log-probs, entropy, grad hidden, grad weight) of sum(a * logp) + sum(b * entropy)."""
    h.grad = w.grad = None
    logps, ent = head_logprobs(h, w, y, **kw)
    loss = (a * logps).sum() + ((b * ent).sum() if ent is not None else 0.0)
    loss.backward()
    return logps.detach(), None if ent is None else ent.detach(), h.grad.clone(), w.grad.clone()


@pytest.mark.parametrize("chunk", [1, 5, 7, 37, 64])  # 37 rows: odd last chunks, one chunk, past the end
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_fused_equals_unfused_fp32(chunk, temperature, with_entropy):
    h, w, y, a, b = inputs(37, 16, 101)
    fused = run(h, w, y, a, b, chunk=chunk, temperature=temperature, with_entropy=with_entropy)
    plain = run(h, w, y, a, b, temperature=temperature, with_entropy=with_entropy, fused=False)
    for got, want in zip(fused, plain, strict=True):
        if want is None:
            assert got is None
        else:
            assert got.dtype == want.dtype
            assert_fp32_close(got, want)


def test_fused_gradcheck_with_entropy_and_temperature():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(9, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.randint(0, 11, (9,), generator=g)

    def both(hh, ww):
        return head_logprobs(hh, ww, y, chunk=4, temperature=0.6, with_entropy=True)

    assert torch.autograd.gradcheck(both, (h, w))
    # one output used alone: the other's gradient is None in the backward, not zeros
    assert torch.autograd.gradcheck(lambda hh, ww: both(hh, ww)[1], (h, w))
    assert torch.autograd.gradcheck(lambda hh, ww: both(hh, ww)[0], (h, w))


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_frozen_head_and_frozen_hidden(temperature):
    """A frozen head (LoRA) takes the path that computes each row's gradient direction in the
    forward pass; frozen hidden states the one that only reduces into the head's gradient."""
    h, w, y, a, _ = inputs(13, 8, 29)
    want = run(h, w, y, a, None, fused=False, temperature=temperature)
    w.requires_grad_(False)
    h.grad = None
    logps = head_logprobs(h, w, y, chunk=4, temperature=temperature)[0]
    assert_fp32_close(logps.detach(), want[0])
    (a * logps).sum().backward()
    assert_fp32_close(h.grad, want[2])
    h2 = h.detach()
    w.requires_grad_(True)
    w.grad = None
    (a * head_logprobs(h2, w, y, chunk=4, temperature=temperature)[0]).sum().backward()
    assert_fp32_close(w.grad, want[3])
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double()
    assert torch.autograd.gradcheck(lambda hh: head_logprobs(hh, w64, y, chunk=4, temperature=temperature)[0], (h64,))


def test_empty_batch_keeps_the_head_in_the_graph():
    w = torch.randn(7, 4, requires_grad=True)
    logps, ent = head_logprobs(torch.zeros(0, 4), w, torch.zeros(0, dtype=torch.long), with_entropy=True)
    assert logps.shape == ent.shape == (0,)
    (logps.sum() + ent.sum()).backward()
    assert torch.equal(w.grad, torch.zeros_like(w))


def test_chunk_must_be_positive():
    h, w, y, _, _ = inputs(3, 4, 5)
    with pytest.raises(ValueError, match="chunk: must be >= 1, got 0"):
        head_logprobs(h, w, y, chunk=0)


def test_fused_equals_unfused_bf16():
    h, w, y, a, b = inputs(300, 64, 997, dtype=torch.bfloat16)
    fused = run(h, w, y, a, b, chunk=64, with_entropy=True)
    plain = run(h, w, y, a, b, with_entropy=True, fused=False)
    torch.testing.assert_close(fused[0], plain[0], rtol=0, atol=1e-3)
    torch.testing.assert_close(fused[1], plain[1], rtol=0, atol=1e-3)
    for got, want in zip(fused[2:], plain[2:], strict=True):
        assert got.dtype == torch.bfloat16
        rel = (got.float() - want.float()).norm() / want.float().norm()
        assert rel < 2e-2, float(rel)


# --- through a model: tied embedding head, every parameter's gradient ------------------------


def tiny_lm(tied: bool = True):
    from rlkube.runtime.engine.models import build_causal_lm

    spec = ModelSpec(
        config=dict(model_type="qwen2", vocab_size=259, hidden_size=32, intermediate_size=64,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    max_position_embeddings=128, tie_word_embeddings=tied),
        dtype="float32", attention="sdpa",
    )
    lm = build_causal_lm(spec, torch.device("cpu"), seed=1)[0]
    assert (lm.get_output_embeddings().weight is lm.get_input_embeddings().weight) == tied
    return lm


def grads_of(module, loss_fn):
    module.zero_grad(set_to_none=True)
    out = loss_fn(module)
    out.backward()
    return out.detach(), {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def assert_same_grads(fused, plain):
    assert fused.keys() == plain.keys() and len(fused) > 0
    for name in plain:
        assert_fp32_close(fused[name], plain[name], msg=name)


def test_sequence_logprobs_fused_equals_unfused_with_a_tied_head():
    tok = ByteTokenizer()
    g = torch.Generator().manual_seed(0)
    rand = lambda k: torch.randint(0, 256, (k,), generator=g).tolist()  # noqa: E731
    data = PreferenceData(prompts=[rand(3 + 2 * i) for i in range(4)], chosen=[rand(2 + 3 * i) for i in range(4)],
                          rejected=[rand(7 - i) for i in range(4)])
    batch = pack_pairs(data, [0, 1, 2, 3], tok.bos_id, tok.eos_id, explicit_mask=True)
    lm = tiny_lm(tied=True)
    weights = torch.randn(8, generator=g)

    def loss(module):  # a per-sequence weighting, as DPO's loss weighs chosen against rejected
        return (weights * module(batch)).sum()

    fused_loss, fused = grads_of(SequenceLogprobs(lm, chunk=3, fused=True), loss)
    plain_loss, plain = grads_of(SequenceLogprobs(lm, fused=False), loss)
    assert_fp32_close(fused_loss, plain_loss)
    assert "lm.model.embed_tokens.weight" in fused  # the tied head's gradient lands here
    assert_same_grads(fused, plain)


def test_sequence_logprobs_fused_equals_unfused_with_a_frozen_head():
    """LoRA's case: the head (untied) is frozen, the body trains."""
    tok = ByteTokenizer()
    g = torch.Generator().manual_seed(3)
    rand = lambda k: torch.randint(0, 256, (k,), generator=g).tolist()  # noqa: E731
    data = PreferenceData(prompts=[rand(4), rand(9)], chosen=[rand(5), rand(3)], rejected=[rand(6), rand(2)])
    batch = pack_pairs(data, [0, 1], tok.bos_id, tok.eos_id, explicit_mask=True)
    lm = tiny_lm(tied=False)
    lm.get_output_embeddings().weight.requires_grad_(False)
    weights = torch.randn(4, generator=g)

    def loss(module):
        return (weights * module(batch)).sum()

    fused_loss, fused = grads_of(SequenceLogprobs(lm, chunk=3, fused=True), loss)
    plain_loss, plain = grads_of(SequenceLogprobs(lm, fused=False), loss)
    assert_fp32_close(fused_loss, plain_loss)
    assert "lm.lm_head.weight" not in fused and "lm.model.embed_tokens.weight" in fused
    assert_same_grads(fused, plain)


@pytest.mark.parametrize("tied", [True, False])
def test_policy_model_fused_equals_unfused_with_entropy(tied):
    lm = tiny_lm(tied)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 256, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # a left-padded prompt
    resp = torch.ones(3, 7, dtype=torch.long)
    resp[1, 4:] = 0
    adv = torch.randn(3, 7, generator=g)

    def loss(module):  # the policy loss's shape: weighted log-probs minus an entropy bonus
        logps, ent = module(ids, mask, 5, resp, with_entropy=True)
        return (adv * logps).sum() - 0.1 * ent.sum()

    fused_loss, fused = grads_of(PolicyModel(lm, chunk=4, temperature=0.8, fused=True), loss)
    plain_loss, plain = grads_of(PolicyModel(lm, temperature=0.8, fused=False), loss)
    assert_fp32_close(fused_loss, plain_loss)
    assert_same_grads(fused, plain)


def test_config_switch_defaults_on():
    assert TrainingSpec().fused_logprobs is True
    assert TrainingSpec.model_validate({"fusedLogprobs": False}).fused_logprobs is False


# --- memory: the largest tensor of the fused path does not scale with tokens x vocab ---------


class LargestTensor(TorchDispatchMode):
    """Counts the elements of the largest tensor any aten op creates while it is active."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def largest_tensor(n: int, vocab: int, fused: bool, chunk: int = 32, d: int = 8) -> int:
    h, w, y, a, b = inputs(n, d, vocab)
    with LargestTensor() as mode:
        logps, ent = head_logprobs(h, w, y, chunk=chunk, with_entropy=True, fused=fused)
        ((a * logps).sum() + (b * ent).sum()).backward()
    return mode.numel


def test_fused_peak_tensor_does_not_grow_with_tokens():
    vocab, chunk, d = 1000, 32, 8
    fused = {n: largest_tensor(n, vocab, True, chunk, d) for n in (256, 1024)}
    plain = {n: largest_tensor(n, vocab, False, chunk, d) for n in (256, 1024)}
    # the unfused path holds [N, vocab] (the test sees what it should look for) ...
    assert plain == {256: 256 * vocab, 1024: 1024 * vocab}
    # ... the fused one a chunk of it (or the head weight's gradient, vocab x d), whatever N is
    assert fused[256] == fused[1024] == max(chunk * vocab, vocab * d)
