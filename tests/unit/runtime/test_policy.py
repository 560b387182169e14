"""Per-token log-probs of padded rollout rows equal those of each row run alone, unpadded."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlkube.runtime.engine.policy import PolicyModel
from rlkube.runtime.engine.value_model import ValueModel

torch.set_num_threads(1)


def tiny(attn="sdpa", model_type="qwen2"):
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval()


def alone(lm, prompt, response):
    seq = torch.tensor([prompt + response])
    logits = lm(input_ids=seq).logits[0].log_softmax(-1)
    return [float(logits[len(prompt) - 1 + t, tok]) for t, tok in enumerate(response)]


# Both run sdpa causal alone over the flush-left rows (engine/attention.py: no mask built, none passed)
@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
@pytest.mark.parametrize("left_pad", [True, False])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_padded_rows_match_rows_alone(left_pad, attn, model_type):
    lm = tiny(attn, model_type)
    rows = [([1, 2, 3], [4, 5, 6, 7]), ([8, 9, 3], [10, 11]), ([12, 13, 14], [15])]
    if left_pad:
        rows[1] = ([9, 3], [10, 11])
    width = max(len(p) for p, _ in rows)
    ids, mask, resp_mask = [], [], []
    for p, r in rows:
        pad = width - len(p)
        ids.append([0] * pad + p + r + [0] * (4 - len(r)))
        mask.append([0] * pad + [1] * (len(p) + len(r)) + [0] * (4 - len(r)))
        resp_mask.append([1] * len(r) + [0] * (4 - len(r)))
    ids, mask, resp_mask = torch.tensor(ids), torch.tensor(mask), torch.tensor(resp_mask)
    seen = []  # the mask each layer gets and the attention it runs
    lm.model.layers[0].register_forward_pre_hook(
        lambda m, a, kw: seen.append((kw["attention_mask"], lm.config._attn_implementation)), with_kwargs=True)
    with torch.no_grad():
        logps, entropy = PolicyModel(lm)(ids, mask, width, resp_mask, with_entropy=True)
    # the rows go in flush left, so the body attends causally without a mask, left padding or not
    # (eager attention needs the causal mask the model builds)
    got, ran = seen[0]
    if attn == "sdpa":
        assert (got, ran) == (None, "rlkube_causal_sdpa")
    else:
        assert (got.dim(), ran) == (4, "eager")
    assert lm.config._attn_implementation == attn  # its own attention again afterwards
    for i, (p, r) in enumerate(rows):
        assert logps[i, : len(r)].tolist() == pytest.approx(alone(lm, p, r), abs=1e-5)
        assert (logps[i, len(r):] == 0).all() and (entropy[i, : len(r)] > 0).all()
    values = ValueModel(tiny(attn, model_type))(ids, mask, width)
    assert values.shape == resp_mask.shape and (values == 0).all()  # the head starts at zero


@pytest.mark.parametrize("window", [3, 16])
def test_sliding_window_layers_keep_their_mask_when_rows_outgrow_the_window(window):
    """Causal alone is exact only while a row fits in the window; past it the model builds its
    sliding-window mask, and padded rows still equal rows alone."""
    torch.manual_seed(0)
    config = AutoConfig.for_model("mistral", vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, sliding_window=window)
    lm = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    rows = [([1, 2, 3], [4, 5, 6, 7]), ([9, 3], [10, 11])]
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7], [0, 9, 3, 10, 11, 0, 0]])
    mask = torch.tensor([[1] * 7, [0, 1, 1, 1, 1, 0, 0]])
    seen = []
    lm.model.layers[0].register_forward_pre_hook(
        lambda m, a, kw: seen.append(lm.config._attn_implementation), with_kwargs=True)
    with torch.no_grad():
        logps, _ = PolicyModel(lm)(ids, mask, 3, mask[:, 3:])
    assert seen == ["sdpa" if window < ids.shape[1] else "rlkube_causal_sdpa"]
    for i, (p, r) in enumerate(rows):
        assert logps[i, : len(r)].tolist() == pytest.approx(alone(lm, p, r), abs=1e-5)


def test_flush_left_moves_each_row_past_its_left_padding():
    from rlkube.runtime.engine.policy import flush_left, response_hidden

    ids = torch.tensor([[0, 0, 5, 6, 7, 0], [1, 2, 3, 4, 0, 0], [0, 0, 0, 0, 0, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]])
    moved, shift = flush_left(ids, mask)
    assert shift.tolist() == [2, 0, 6]  # a row without real tokens moves by its whole width
    assert moved[0, :3].tolist() == [5, 6, 7] and moved[1].tolist() == ids[1].tolist()

    class Body(torch.nn.Module):  # hidden state = the token id it saw, so the gather is visible
        config = None

        def forward(self, input_ids, use_cache, attention_mask):
            assert attention_mask is None
            return (input_ids[..., None].float(),)

    # prompt block of 3 columns: response column t is predicted at column 2 + t of the padded row
    hidden = response_hidden(Body(), ids, mask, 3)
    assert hidden[0, :, 0].tolist() == [5, 6, 7]  # columns 2, 3, 4 of row 0 -> 0, 1, 2 moved
    assert hidden[1, :, 0].tolist() == [3, 4, 0]
    assert hidden.shape == (3, 3, 1)  # the empty row reads column 0 instead of failing
