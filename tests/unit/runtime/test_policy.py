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


# qwen2 takes a prepared mask per layer type ("no mask", policy._causal_only); llama builds its own
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
    masks = []
    lm.model.register_forward_pre_hook(lambda m, a, kw: masks.append(kw["attention_mask"]), with_kwargs=True)
    with torch.no_grad():
        logps, entropy = PolicyModel(lm)(ids, mask, width, resp_mask, with_entropy=True)
    # the rows go in flush left, so the body attends causally without a mask, left padding or not
    assert masks == [{"full_attention": None} if (model_type, attn) == ("qwen2", "sdpa") else None]
    for i, (p, r) in enumerate(rows):
        assert logps[i, : len(r)].tolist() == pytest.approx(alone(lm, p, r), abs=1e-5)
        assert (logps[i, len(r):] == 0).all() and (entropy[i, : len(r)] > 0).all()
    values = ValueModel(tiny(attn, model_type))(ids, mask, width)
    assert values.shape == resp_mask.shape and (values == 0).all()  # the head starts at zero
