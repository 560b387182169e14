"""flex_attention with a document mask: a packed row gives the same per-sequence log-probs as each
sequence run alone with sdpa, and (on CUDA: flex has no backward on CPU) the same gradients. On CPU
flex compiles through inductor (~30 s), which is why this lives in the training tier; the H200 check
in bf16 is tests/gpu/test_gpu_engine.py."""

import pytest
import torch

from rlkube.runtime.contract.config import ModelSpec
from rlkube.runtime.data.packing import pack_pairs, pad_pairs
from rlkube.runtime.data.preferences import PreferenceData
from rlkube.runtime.data.tokenizer import ByteTokenizer
from rlkube.runtime.engine.logprobs import SequenceLogprobs, document_mask
from rlkube.runtime.engine.models import build_causal_lm, flex_attention_available, pick_attention

TOK = ByteTokenizer()
# head dim 16: flex_attention's CUDA kernel needs at least 16 (the H200 run refused 8)
CONFIG = dict(model_type="qwen2", vocab_size=259, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)

pytestmark = pytest.mark.skipif(not flex_attention_available(), reason="this torch has no flex_attention")


def data(n: int = 4) -> PreferenceData:
    g = torch.Generator().manual_seed(0)
    rand = lambda k: torch.randint(0, 256, (k,), generator=g).tolist()  # noqa: E731
    return PreferenceData(prompts=[rand(5 + 7 * i) for i in range(n)], chosen=[rand(3 + 5 * i) for i in range(n)],
                          rejected=[rand(11 - 2 * i) for i in range(n)])


def test_auto_picks_flex_for_packed_rows_on_cuda_only():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert pick_attention("auto", cpu, packed=True) == "sdpa"
    assert pick_attention("auto", cuda, packed=False) in ("sdpa", "flash_attention_2")
    assert pick_attention("auto", cuda, packed=True) in ("flex_attention", "flash_attention_2")


def test_document_mask_keeps_sequences_apart_and_is_built_once():
    batch = pack_pairs(data(2), [0, 1], TOK.bos_id, TOK.eos_id, explicit_mask=False, pad=TOK.pad_id, multiple_of=64)
    assert batch.input_ids.shape[1] % 64 == 0 and batch.input_ids.shape[1] > sum(batch.seq_lens)
    mask = document_mask(batch)
    assert document_mask(batch) is mask
    dense = mask.to_dense()  # [rows, 1, q blocks, kv blocks]: blocks with any allowed pair
    assert dense.shape[0] == 1 and bool(dense[0, 0].tril().eq(dense[0, 0]).all())  # no block above the diagonal


def compare(device: torch.device, dtype: str, atol: float, rtol: float, grads: bool) -> None:
    spec = lambda attention: ModelSpec(config=CONFIG, dtype=dtype, attention=attention)  # noqa: E731
    flex = SequenceLogprobs(build_causal_lm(spec("flex_attention"), device, seed=3)[0], chunk=5)
    sdpa = SequenceLogprobs(build_causal_lm(spec("sdpa"), device, seed=3)[0], chunk=5)
    d, ids = data(), [0, 1, 2, 3]
    packed = pack_pairs(d, ids, TOK.bos_id, TOK.eos_id, explicit_mask=False, pad=TOK.pad_id, multiple_of=128)
    with torch.set_grad_enabled(grads):
        got = flex(packed.to(device))
        want = torch.cat([sdpa(pad_pairs(d, [i], TOK.bos_id, TOK.eos_id, TOK.pad_id).to(device)) for i in ids])
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    if grads:
        weights = torch.linspace(-1, 1, got.numel(), device=device)
        (got * weights).sum().backward()
        (want * weights).sum().backward()
        theirs = dict(sdpa.named_parameters())
        for name, p in flex.named_parameters():
            torch.testing.assert_close(p.grad, theirs[name].grad, atol=atol, rtol=rtol, msg=name)


def test_flex_packed_equals_sdpa_alone_on_cpu():
    compare(torch.device("cpu"), "float32", atol=1e-4, rtol=1e-4, grads=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flex_attention's backward runs on CUDA only")
def test_flex_packed_gradients_equal_sdpa_alone_on_cuda():
    compare(torch.device("cuda"), "float32", atol=1e-4, rtol=1e-3, grads=True)


def test_auto_falls_back_to_sdpa_below_flex_head_dim(monkeypatch):
    from rlkube.runtime.engine import models

    monkeypatch.setattr(models, "pick_attention", lambda requested, device, packed=False: "flex_attention")
    small = dict(CONFIG, hidden_size=32)  # head dim 8
    lm, chosen = build_causal_lm(ModelSpec(config=small, dtype="float32", attention="auto"), torch.device("cpu"))
    assert chosen == "sdpa" and lm.config._attn_implementation == "sdpa"
    _, chosen = build_causal_lm(ModelSpec(config=CONFIG, dtype="float32", attention="auto"), torch.device("cpu"))
    assert chosen == "flex_attention"
