"""Sliding-window layers while decoding (engine/sliding_window.py): every decode path gives the
tokens of a no-cache loop over the model's own forward, which builds HF's sliding masks itself.

Before the decoders took the window into account, each of these cases generated different tokens
once a row outgrew the window of 4 (checked): the decoders' prebuilt masks let every layer see
the whole row.
"""

import pytest
import torch
from test_generation import PAD, left_padded, naive_greedy
from transformers import AutoConfig, AutoModelForCausalLM

from rlkube.runtime.engine.generation import Decoder, SamplingParams
from rlkube.runtime.engine.sliding_window import decode_window

torch.set_num_threads(1)
WINDOW = 4
MODELS = {
    # Gemma 3: sliding and full layers, a mask per type
    "gemma3_text": dict(layer_types=["sliding_attention", "full_attention"], head_dim=8),
    # Mistral-style: every layer slides, one mask
    "mistral": {},
    # Qwen2 with use_sliding_window: layer types, all sliding
    "qwen2": dict(use_sliding_window=True, max_window_layers=0),
}
PROMPTS = [[5, 9, 3, 17, 22, 8, 1], [40, 2], [7, 7, 30, 11, 12, 13]]


def windowed_model(model_type: str, attn: str = "sdpa"):
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        model_type, vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False,
        sliding_window=WINDOW, **MODELS[model_type])
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval()


@pytest.mark.parametrize("model_type", sorted(MODELS))
@pytest.mark.parametrize("path", ["static", "refill", "dynamic", "eager-attention"])
def test_decoding_with_a_window_shorter_than_the_rows_matches_the_models_own_forward(model_type, path):
    model = windowed_model(model_type, "eager" if path == "eager-attention" else "sdpa")
    ids, mask = left_padded(PROMPTS)
    params = SamplingParams(max_new_tokens=10, temperature=0.0, pad_token_id=PAD)
    # refill: one decode row, so every prompt after the first is prefilled into a used row
    decoder = Decoder(model, static_cache=path != "dynamic", batch_rows=1 if path == "refill" else None)
    out = decoder.generate(ids, mask, params)
    for row, prompt in enumerate(PROMPTS):
        assert out.response_ids[row].tolist() == naive_greedy(model, prompt, 10), (row, model_type, path)


def test_decode_window_only_where_it_is_shorter_than_a_row():
    config = windowed_model("gemma3_text").config
    assert decode_window(config, 64) == WINDOW
    config.sliding_window = 64
    assert decode_window(config, 64) is None  # covers every slot: one mask, as without a window
    config.sliding_window = WINDOW
    config.layer_types = ["full_attention", "full_attention"]
    assert decode_window(config, 64) is None
    config.layer_types = ["chunked_attention", "full_attention"]
    with pytest.raises(ValueError, match="chunked_attention"):
        decode_window(config, 64)
    mistral = windowed_model("mistral").config
    assert decode_window(mistral, 64) == WINDOW
    mistral.sliding_window = None
    assert decode_window(mistral, 64) is None
